"""Files written by rl8 before its modules moved into packages still load and act the same.

The files in tests/fixtures/legacy/ were written by tests/fixtures/legacy/make_fixtures.py at
commit 13e50a1: they name classes by their old module paths (``rl8.envs.cartpole.CartPole``,
``rl8.models.MLPModel``, ``rl8.distributions.Categorical``, ``rl8.recurrent.LSTMModel``), which
rl8.registry resolves to today's classes.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from rl8 import Trainer, load_policy

pytestmark = pytest.mark.usefixtures("one_torch_thread")

LEGACY = Path(__file__).parent / "fixtures" / "legacy"
EXPECTED = json.loads((LEGACY / "expected_actions.json").read_text())
CARTPOLE_OBS = torch.linspace(-0.2, 0.2, 4 * 5).reshape(5, 4).numpy()


def test_a_legacy_policy_file_acts_as_it_did():
    policy = load_policy(LEGACY / "cartpole_policy.pt")
    actions, state = policy.predict(CARTPOLE_OBS)
    assert state is None
    assert actions.tolist() == EXPECTED["cartpole"]


def test_a_legacy_recurrent_policy_file_acts_as_it_did():
    policy = load_policy(LEGACY / "memory_lstm_policy.pt")
    assert policy.recurrent
    obs, state, actions = np.eye(3, dtype=np.float32), None, []
    for _ in range(3):
        action, state = policy.predict(obs, state=state)
        actions.append(action.tolist())
    assert actions == EXPECTED["memory_lstm"]


def test_a_legacy_trainer_checkpoint_resumes_and_acts(tmp_path):
    trainer = Trainer.from_checkpoint(
        LEGACY / "cartpole_checkpoint.pt", tracking=False, checkpoint_dir=tmp_path
    )
    try:
        assert int(trainer.algo.env_steps) == 384
        assert type(trainer.algo.env).__name__ == "CartPole"
        actions, _ = trainer.algo.policy.predict(CARTPOLE_OBS)
        # the checkpoint was written after the policy file's weights: same weights, same actions
        assert actions.tolist() == EXPECTED["cartpole"]
        trainer.step()  # and it trains on
        assert int(trainer.algo.env_steps) == 384 + 128
    finally:
        trainer.close()


def test_a_legacy_checkpoint_loads_as_a_policy_file():
    policy = load_policy(LEGACY / "cartpole_checkpoint.pt")
    assert policy.predict(CARTPOLE_OBS)[0].tolist() == EXPECTED["cartpole"]
