"""Env steps to a solved task with and without hparam symmetry (rsl_rl's symmetry_cfg), on
rl8's two built-in envs that are truly left/right symmetric: CartPole (PPO's defaults, solved
when the mean return of the training episodes that end in a collect reaches 475) and Pendulum
(its preset, solved at a mean training episode return of -200). Each seed runs without
symmetry, with data augmentation, and (Pendulum, whose actions are floats) with data
augmentation and the mirror loss. The training episodes' returns (of the sampling policy) are
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
from rl8.envs import CartPole, Pendulum
from rl8.ppo import presets

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
}


def modes(env_cls: type) -> dict[str, dict | None]:
    """The symmetry settings compared on ``env_cls``."""
    out = {
        "off": None,
        "augmentation": {"data_augmentation_func": env_cls.mirror, "use_data_augmentation": True},
    }
    if env_cls is Pendulum:
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
        for mode, symmetry in modes(TASKS[task][0]).items():
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
