"""Learning tests: fixed seeds, a bounded number of env steps, a return to reach.

Each test trains until a deterministic evaluation on a dedicated env reaches the target, or
fails once the env-step budget is spent.
"""

from __future__ import annotations

import pytest
import torch
from markers import needs_cpu_bfloat16

from rl8 import PPO
from rl8.envs import CartPole, ContinuousDummyEnv, DiscreteDummyEnv, Pendulum

pytestmark = pytest.mark.slow


def train_until(
    algo: PPO,
    eval_env,
    *,
    target: float,
    max_env_steps: int,
    key="episodes/return_mean",
    eval_steps: int,
    eval_every: int = 1,
) -> tuple[float, int]:
    """Train; every ``eval_every`` updates evaluate deterministically; stop at ``target``."""
    best = -float("inf")
    while algo.env_steps < max_env_steps:
        algo.collect()
        algo.update()
        if algo.steps % eval_every == 0:
            value = algo.evaluate(eval_env, num_steps=eval_steps)[key]
            best = max(best, value)
            if value >= target:
                return value, algo.env_steps
    pytest.fail(f"{key} reached only {best:.2f} < {target} within {max_env_steps} env steps")


@pytest.mark.parametrize(
    "amp", [False, pytest.param(True, marks=needs_cpu_bfloat16)], ids=["fp32", "bf16"]
)
def test_cartpole_defaults_solve(amp):
    algo = PPO(CartPole, seed=0, enable_amp=amp)
    assert algo.amp_dtype == (torch.bfloat16 if amp else torch.float32)
    value, steps = train_until(
        algo, CartPole(32), target=475, max_env_steps=600_000, eval_steps=500, eval_every=2
    )
    assert value >= 475


PENDULUM = dict(
    num_envs=256,
    horizon=64,
    gamma=0.95,
    gae_lambda=0.95,
    lr=3e-3,
    num_sgd_iters=8,
    sgd_minibatch_size=4096,
    normalize_observations=False,
    model_config={"hiddens": (64, 64)},
)


@pytest.mark.parametrize(
    "amp", [False, pytest.param(True, marks=needs_cpu_bfloat16)], ids=["fp32", "bf16"]
)
def test_pendulum_solves(amp):
    algo = PPO(Pendulum, seed=0, enable_amp=amp, **PENDULUM)
    assert algo.amp_dtype == (torch.bfloat16 if amp else torch.float32)
    value, _ = train_until(
        algo, Pendulum(32), target=-250, max_env_steps=2_000_000, eval_steps=200, eval_every=4
    )
    assert value >= -250


@pytest.mark.parametrize("env_cls", [DiscreteDummyEnv, ContinuousDummyEnv])
def test_dummy_envs_drive_state_to_origin(env_cls):
    algo = PPO(
        env_cls, num_envs=256, horizon=32, horizons_per_env_reset=1, seed=0, sgd_minibatch_size=2048
    )
    env = env_cls(256)
    # from |x| <= 1 with steps of at most 0.1, 32 steps are enough to reach and hold the origin
    for _ in range(8):
        for _ in range(5):
            algo.collect()
            algo.update()
        algo.evaluate(env, num_steps=32)
        mean_abs, max_abs = env.x.abs().mean().item(), env.x.abs().max().item()
        if mean_abs < 0.1 and max_abs < 0.25:
            break
    assert mean_abs < 0.1 and max_abs < 0.25, (mean_abs, max_abs)
