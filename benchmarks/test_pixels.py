"""Throughput of pixel policies: PPO with the Nature CNN on 84x84x4 uint8 images (a pure-torch
pixel env, fp32 and bf16 autocast, beside a raw-torch floor of the same convolutions), and Atari
Pong collection in the sync/async/pool modes beside SB3's CnnPolicy on a SubprocVecEnv.

Run: ``PYTHONPATH=$PWD python -m pytest benchmarks/test_pixels.py -q -p no:cacheprovider -s``.

Two workloads:

* ``StackedCatch``: :class:`rl8.envs.Catch` on a 12x12 grid drawn at 7 pixels a cell (84x84),
  its last 4 frames stacked, ``[4, 84, 84]`` uint8 (env steps cost next to nothing, so this
  measures the policy). 8 envs, horizon 64, the default :class:`rl8.policies.encoders.CNNModel` (Nature
  CNN, shared trunk), 4 minibatches of 128, 1 epoch. Collect and collect + update throughput
  (env steps/s) for ``enable_amp=False`` (fp32) and ``True`` (bf16 autocast on CPU), beside
  the floor: the same Nature CNN and heads in plain torch (``nn.Sequential``), its forward
  pass and a sampled action per step for the collect, and for the update the same minibatches
  of forward + backward + Adam (the loss of ``floor.update_floor``), on the same uint8 images.
  torch runs with 1 thread (``torch.set_num_threads(1)``): on the shared 2-core development
  machine a second intra-op thread made the convolutions many times slower, not faster.
* ``ALE/Pong-v5`` with the Atari preset: 8 envs, horizon 64, collect throughput in the sync,
  async (8 processes) and pool (one worker per core, ``min_batch_size=4``) modes, beside SB3's
  PPO with ``CnnPolicy`` on a ``SubprocVecEnv`` of 8 processes (SB3's ``make_atari_env`` with
  the same preprocessing, ``VecFrameStack`` of 4) running its ``collect_rollouts`` for the same
  horizon. torch runs with 1 thread (the env processes need the cores). Skipped without ale-py
  and opencv, or without SB3.

Each test builds every variant, warms each up once, then times ROUNDS rounds in which every
variant runs once, in turn, so that load from other processes hits all alike; the ratios
printed (and stored in ``benchmark.extra_info``) come from one such run.

Figures from one run on the development machine (2 cores, quiet: nothing else running), from
``PYTHONPATH=$PWD python -m pytest benchmarks -q -p no:cacheprovider -s`` (all benchmark files, 9.5 minutes in all):

* StackedCatch ``[4, 84, 84]``, Nature CNN, 8 envs, horizon 64 (env steps/s):
  collect fp32: rl8 3760, floor 5267 (0.71x); collect bf16: rl8 5361, floor 6869 (0.78x);
  collect + update fp32: rl8 1177, floor 1311 (0.90x); collect + update bf16: rl8 2235, floor
  2459 (0.91x).
* ALE/Pong-v5, 8 envs, horizon 64, collect (env steps/s): sync 1454, async 1444, pool 1688,
  SB3 SubprocVecEnv 1327 (sync/SB3 1.10x, async/SB3 1.09x, pool/SB3 1.27x).

An earlier run with the load average at 15 (other jobs' test suites) gave a quarter to a
fifth of these throughputs, and pool/SB3 0.84x: on busy cores the env processes of async,
pool and SB3 compete with the learner.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest
import rates
import torch
from gymnasium import spaces
from rates import report, sb3_collect
from tensordict import TensorDict
from torch import nn

from rl8 import PPO
from rl8.envs import Catch

ROUNDS = 2
NUM_ENVS, HORIZON, MINIBATCHES = 8, 64, 4


class StackedCatch(Catch):
    """Catch at 84x84 (12x12 cells of 7 pixels) with its last 4 frames stacked: ``[4, 84, 84]``."""

    def __init__(self, num_envs: int, /, horizon: int | None = None, *, device: Any = "cpu") -> None:
        super().__init__(num_envs, horizon, device=device, rows=12, cols=12, scale=7)
        self.observation_space = spaces.Box(0, 255, (4, 84, 84), np.uint8)
        self._stack = torch.zeros(num_envs, 4, 84, 84, dtype=torch.uint8, device=self.device)

    def reset(self, **kwargs: Any) -> torch.Tensor:
        frame = super().reset(**kwargs)
        self._stack = frame.expand(-1, 4, -1, -1).clone()
        return self._stack

    def step(self, action: torch.Tensor) -> TensorDict:
        out = super().step(action)
        final = torch.cat([self._stack[:, 1:], out["final_obs"]], 1)
        done = out["terminated"].reshape(-1, 1, 1, 1)
        self._stack = torch.where(
            done, out["obs"].expand(-1, 4, -1, -1), torch.cat([self._stack[:, 1:], out["obs"]], 1)
        )
        return self.step_output({**out.to_dict(), "obs": self._stack, "final_obs": final})


def measure(variants: dict, step, rounds: int = ROUNDS) -> dict[str, float]:
    """:func:`rates.measure` with this file's number of rounds."""
    return rates.measure(variants, step, rounds)


# --- the raw-torch floor -----------------------------------------------------------------------


def nature_cnn(in_channels: int = 4, num_actions: int = 3) -> tuple[nn.Module, nn.Module, nn.Module]:
    """The Nature CNN trunk (84x84 input) and linear policy and value heads, plain torch."""
    trunk = nn.Sequential(
        nn.Conv2d(in_channels, 32, 8, 4),
        nn.ReLU(),
        nn.Conv2d(32, 64, 4, 2),
        nn.ReLU(),
        nn.Conv2d(64, 64, 3, 1),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(64 * 7 * 7, 512),
        nn.ReLU(),
    )
    return trunk, nn.Linear(512, num_actions), nn.Linear(512, 1)


class Floor:
    """The least work of one collect and one update with the Nature CNN, in plain torch."""

    def __init__(self, amp: bool) -> None:
        self.amp = amp
        self.trunk, self.pi, self.vf = nature_cnn()
        params = [*self.trunk.parameters(), *self.pi.parameters(), *self.vf.parameters()]
        self.optimizer = torch.optim.Adam(params, lr=2.5e-4, eps=1e-5)
        self.obs = torch.randint(0, 256, (NUM_ENVS * HORIZON, 4, 84, 84), dtype=torch.uint8)
        self.actions = torch.randint(0, 3, (NUM_ENVS * HORIZON,))
        self.advantages = torch.randn(NUM_ENVS * HORIZON)
        self.returns = torch.randn(NUM_ENVS * HORIZON)

    def autocast(self) -> torch.autocast:
        return torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.amp)

    @torch.no_grad()
    def collect(self) -> int:
        obs = self.obs[:NUM_ENVS]
        for _ in range(HORIZON):
            with self.autocast():
                h = self.trunk(obs.float() / 255)
                logits, _ = self.pi(h), self.vf(h)
            cdf = logits.float().softmax(-1).cumsum(-1)
            (cdf < torch.rand(NUM_ENVS, 1)).sum(-1)
        return NUM_ENVS * HORIZON

    def update(self) -> None:
        size = NUM_ENVS * HORIZON // MINIBATCHES
        for start in range(0, NUM_ENVS * HORIZON, size):
            sl = slice(start, start + size)
            with self.autocast():
                h = self.trunk(self.obs[sl].float() / 255)
                logits, values = self.pi(h), self.vf(h)
            logp = logits.float().log_softmax(-1).gather(-1, self.actions[sl, None])[:, 0]
            loss = (
                -(logp * self.advantages[sl]).mean()
                + (values.float()[:, 0] - self.returns[sl]).square().mean()
            )
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            self.optimizer.step()

    def collect_update(self) -> int:
        self.collect()
        self.update()
        return NUM_ENVS * HORIZON


def make_catch_ppo(amp: bool) -> PPO:
    return PPO(
        StackedCatch,
        num_envs=NUM_ENVS,
        horizon=HORIZON,
        num_minibatches=MINIBATCHES,
        num_sgd_iters=1,
        seed=0,
        enable_amp=amp,
        device="cpu",
    )


def collect(algo: Any) -> int:
    if isinstance(algo, Floor):
        return algo.collect()
    algo.collect()
    return algo.hparams.num_envs * algo.hparams.horizon


def collect_update(algo: Any) -> int:
    if isinstance(algo, Floor):
        return algo.collect_update()
    algo.collect()
    algo.update()
    return algo.hparams.num_envs * algo.hparams.horizon


@pytest.mark.torch_threads(1)
def test_nature_cnn_on_84x84x4_images(benchmark):
    variants = {
        "rl8 fp32": make_catch_ppo(False),
        "floor fp32": Floor(False),
        "rl8 bf16": make_catch_ppo(True),
        "floor bf16": Floor(True),
    }
    assert type(variants["rl8 fp32"].policy.model).__name__ == "CNNModel"
    title = f"StackedCatch [4, 84, 84] uint8, Nature CNN, {NUM_ENVS} envs, horizon {HORIZON}"
    rates = measure(variants, collect)
    ratios = {
        **report(f"{title}, collect", {k: rates[k] for k in ("rl8 fp32", "floor fp32")}, "floor fp32"),
        **report(
            f"{title}, collect (bf16)", {k: rates[k] for k in ("rl8 bf16", "floor bf16")}, "floor bf16"
        ),
    }
    updated = measure(variants, collect_update)
    update_ratios = {
        **report(
            f"{title}, collect + update",
            {k: updated[k] for k in ("rl8 fp32", "floor fp32")},
            "floor fp32",
        ),
        **report(
            f"{title}, collect + update (bf16)",
            {k: updated[k] for k in ("rl8 bf16", "floor bf16")},
            "floor bf16",
        ),
    }
    benchmark.extra_info.update(
        collect=rates, ratios=ratios, collect_update=updated, update_ratios=update_ratios
    )
    benchmark.pedantic(collect, args=(variants["rl8 fp32"],), rounds=1, iterations=1)


# --- Atari Pong ------------------------------------------------------------------------------


def sb3_pong_collector(num_envs: int, horizon: int):
    """SB3's PPO with CnnPolicy on a SubprocVecEnv of Pong (SB3's Atari wrappers, 4 stacked
    frames): a function that collects one rollout and returns its env steps, and the vec env."""
    import ale_py
    import gymnasium
    from stable_baselines3 import PPO as SB3PPO
    from stable_baselines3.common.env_util import make_atari_env
    from stable_baselines3.common.vec_env import SubprocVecEnv, VecFrameStack

    gymnasium.register_envs(ale_py)
    venv = make_atari_env(
        "ALE/Pong-v5",
        n_envs=num_envs,
        seed=0,
        vec_env_cls=SubprocVecEnv,
        vec_env_kwargs={"start_method": "fork"},
        env_kwargs={"frameskip": 1, "repeat_action_probability": 0.0},
    )
    venv = VecFrameStack(venv, 4)
    model = SB3PPO(
        "CnnPolicy",
        venv,
        n_steps=horizon,
        batch_size=num_envs * horizon // 4,
        n_epochs=1,
        device="cpu",
        seed=0,
    )
    return sb3_collect(model, num_envs, horizon), venv


@pytest.mark.torch_threads(1)
def test_pong_collect_modes_and_sb3(benchmark):
    pytest.importorskip("ale_py")
    pytest.importorskip("cv2")
    pytest.importorskip("stable_baselines3")
    cores = os.cpu_count() or 1
    pool = {"num_workers": min(cores, NUM_ENVS), "min_batch_size": NUM_ENVS // 2}
    algos: dict[str, Any] = {}
    venv = None
    try:
        for mode in ("sync", "async", "pool"):
            algos[mode] = PPO(
                "ALE/Pong-v5",
                num_envs=NUM_ENVS,
                horizon=HORIZON,
                seed=0,
                num_sgd_iters=1,
                env_kwargs={"vectorization_mode": mode, **(pool if mode == "pool" else {})},
            )
        sb3_step, venv = sb3_pong_collector(NUM_ENVS, HORIZON)
        rates = measure(
            {**algos, "sb3 SubprocVecEnv": None},
            lambda algo: sb3_step(algo) if algo is None else collect(algo),
        )
        ratios = report(
            f"ALE/Pong-v5 (Atari preset), {NUM_ENVS} envs, horizon {HORIZON}, collect ({cores} cores)",
            rates,
            "sb3 SubprocVecEnv",
        )
        benchmark.extra_info.update(collect=rates, ratios=ratios, pool=pool)
        benchmark.pedantic(collect, args=(algos["pool"],), rounds=1, iterations=1)
    finally:
        if venv is not None:
            venv.close()
        for algo in algos.values():
            algo.env.close()
