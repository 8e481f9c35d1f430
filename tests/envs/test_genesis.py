"""A real Genesis env through rl8.envs.rsl_rl.RslRlEnv: the Unitree Go2 walking task of
``benchmarks/sims/support/go2.py`` (rsl_rl's VecEnv interface, the shape of Genesis' locomotion
example) on Genesis' CPU backend. Skipped where Genesis is not installed (``genesis-world``, a
venv of its own: ``benchmarks/sims/genesis.py``). The scene's first build compiles Genesis'
kernels for minutes (cached afterwards), so the env is built once for the module."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

gs = pytest.importorskip("genesis")

import torch  # noqa: E402
from gymnasium import spaces  # noqa: E402

from rl8.envs.base import validate_reset_output, validate_step_output  # noqa: E402
from rl8.envs.rsl_rl import RslRlEnv  # noqa: E402

GO2 = Path(__file__).parents[2] / "benchmarks" / "sims" / "support" / "go2.py"
STEPS = 10  # the episode limit of these tests: 0.2 simulated seconds


@pytest.fixture(scope="module")
def go2():
    if not gs._initialized:
        gs.init(backend=gs.cpu, precision="32", logging_level="warning", seed=0)
    spec = importlib.util.spec_from_file_location("go2", GO2)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.Go2Walk(4, episode_seconds=STEPS * 0.02)


@pytest.mark.slow
def test_the_real_env_through_the_adapter(go2):
    env = RslRlEnv(go2, init_at_random_ep_len=True)
    assert env.device == torch.device("cpu") and env.params == {"max_episode_steps": STEPS}
    assert env.observation_space == spaces.Dict(
        {"policy": spaces.Box(-float("inf"), float("inf"), (45,))}
    )
    assert env.action_space == spaces.Box(-float("inf"), float("inf"), (12,))
    validate_reset_output(env.reset(), env)
    # Genesis' episode_length_buf is int32 (gs.tc_int): drawn below the limit, its dtype kept
    assert go2.episode_length_buf.dtype == torch.int32 and (go2.episode_length_buf < STEPS).all()
    env = RslRlEnv(go2)  # every episode from its start
    before = env.reset()["policy"]
    for t in range(STEPS):
        out = env.step(torch.zeros(4, 12))
        validate_step_output(out, env)
        assert out["rewards"].dtype == torch.float32 and not out["terminated"].any()
        if t < STEPS - 1:
            assert not out["truncated"].any()
            before = out["obs"]["policy"]
    # standing still, every Go2 times out at the limit: truncated, bootstrapped from the
    # observation before the step, and Genesis restarted it inside step (its last action zeroed)
    assert out["truncated"].all()
    assert torch.equal(out["final_obs"]["policy"], before)
    assert not torch.equal(out["obs"]["policy"], before)
