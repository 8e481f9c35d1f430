"""Env steps to a solved task with and without hparam symmetry (rsl_rl's symmetry_cfg), on
rl8's three built-in envs that are truly left/right symmetric: CartPole (PPO's defaults, solved
when the mean return of the training episodes that end in a collect reaches 475), Pendulum
(its preset, solved at a mean training episode return of -200) and Catch from pixels (5x5 grid,
the small CNN of tests/test_pixels.py, solved at a mean return of 0.9; mirrored by flipping the
image left to right and swapping the actions left and right, :func:`mirror_catch`). Each seed
runs without symmetry, with data augmentation, and (Pendulum, whose actions are floats) with
data augmentation and the mirror loss. The training episodes' returns (of the sampling policy) are
the criterion, not an eval: the same for every run, and free.

Run: ``nice -n 10 python benchmarks/symmetry.py [ENV ...] [--seeds 0 1 2]`` (``RL8_BENCH_THREADS``,
default 2, sets ``torch.set_num_threads``); one line per run, then a markdown table
(docs/performance.md, Symmetry).
"""

from __future__ import annotations

import argparse
import os
import statistics

import torch

from rl8 import PPO
from rl8.envs import CartPole, Catch, Pendulum
from rl8.ppo import presets


def mirror_catch(
    env: object = None, obs: torch.Tensor | None = None, actions: torch.Tensor | None = None
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Catch's mirror for hparam ``symmetry``: the ``[B, 1, H, W]`` images with their left-right
    flips after them, the actions (0: left, 1: stay, 2: right) with ``2 - action`` after them.
    A symmetry of the game for an odd number of columns, where the paddle starts in the middle."""
    return (
        None if obs is None else torch.cat([obs, obs.flip(-1)]),
        None if actions is None else torch.cat([actions, 2 - actions]),
    )


#: env: (its class, PPO's keyword arguments, target return, env step budget)
TASKS = {
    "CartPole": (CartPole, {}, 475.0, 1_000_000),
    "Pendulum": (
        Pendulum,
        {
            k: v
            for k, v in presets.hparams(presets.load("Pendulum")).to_dict().items()
            if k not in ("seed", "symmetry")
        },
        -200.0,
        3_000_000,
    ),
    "Catch": (
        Catch,
        {
            "num_envs": 32,
            "horizon": 16,
            "lr": 2e-3,
            "num_sgd_iters": 2,
            "sgd_minibatch_size": 256,
            "entropy_coeff": 0.01,
            "env_kwargs": {"rows": 5, "cols": 5},
            "model_config": {
                "encoder_config": {
                    "channels": (8, 16),
                    "kernel_sizes": (3, 3),
                    "strides": (2, 1),
                    "features": 64,
                }
            },
        },
        0.9,
        500_000,
    ),
}

#: The mirror function of each env.
MIRRORS = {"CartPole": CartPole.mirror, "Pendulum": Pendulum.mirror, "Catch": mirror_catch}


def modes(task: str) -> dict[str, dict | None]:
    """The symmetry settings compared on ``task``."""
    out = {
        "off": None,
        "augmentation": {"data_augmentation_func": MIRRORS[task], "use_data_augmentation": True},
    }
    if task == "Pendulum":
        out["augmentation + mirror loss"] = {
            **out["augmentation"],
            "use_mirror_loss": True,
            "mirror_loss_coeff": 1.0,
        }
    return out


def steps_to_solve(task: str, symmetry: dict | None, seed: int) -> int | None:
    """Env steps until a collect's mean training episode return reaches the task's target, or
    ``None`` within its budget."""
    env_cls, hparams, target, budget = TASKS[task]
    algo = PPO(env_cls, **{**hparams, "device": "cpu", "seed": seed}, symmetry=symmetry)
    while algo.env_steps < budget:
        if algo.collect()["episodes/return_mean"] >= target:  # NaN (no episode ended) is below
            return algo.env_steps
        algo.update()
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("envs", nargs="*", default=list(TASKS), choices=list(TASKS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    args = parser.parse_args()
    torch.set_num_threads(int(os.environ.get("RL8_BENCH_THREADS", "2")))
    rows = []
    for task in args.envs:
        for mode, symmetry in modes(task).items():
            steps = []
            for seed in args.seeds:
                steps.append(steps_to_solve(task, symmetry, seed))
                print(f"{task} {mode} seed {seed}: {steps[-1]}", flush=True)
            rows.append((task, mode, steps))
    print("\n| env | symmetry | env steps to solve, per seed | median |\n|---|---|---|---|")
    for task, mode, steps in rows:
        solved = [s for s in steps if s is not None]
        median = f"{statistics.median(solved):,.0f}" if len(solved) == len(steps) else "not all solved"
        per_seed = ", ".join("-" if s is None else f"{s:,}" for s in steps)
        print(f"| {task} | {mode} | {per_seed} | {median} |")


if __name__ == "__main__":
    main()
