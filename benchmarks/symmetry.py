"""Env steps to a solved task with and without hparam symmetry (rsl_rl's symmetry_cfg), on
rl8's two built-in envs that are truly left/right symmetric: CartPole (PPO's defaults, solved at
a deterministic eval return >= 475 over 500 steps) and Pendulum (its preset, solved at >= -200
over a 200-step episode). Each seed runs without symmetry, with data augmentation, and (Pendulum,
whose actions are floats) with data augmentation and the mirror loss.

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

#: env: (its class, PPO's keyword arguments, eval target, eval steps, evaluate every k updates, budget)
TASKS = {
    "CartPole": (CartPole, {}, 475.0, 500, 2, 1_000_000),
    "Pendulum": (
        Pendulum,
        {k: v for k, v in presets.hparams(presets.load("Pendulum")).to_dict().items() if k != "seed"},
        -200.0,
        200,
        4,
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
    """Env steps until the deterministic eval return reaches the task's target, or ``None``."""
    env_cls, hparams, target, eval_steps, every, budget = TASKS[task]
    hparams = {**hparams, "device": "cpu", "seed": seed}
    algo = PPO(env_cls, **hparams, symmetry=symmetry)
    eval_env = env_cls(64)
    while algo.env_steps < budget:
        algo.collect()
        algo.update()
        if algo.steps % every == 0:
            if algo.evaluate(eval_env, num_steps=eval_steps)["episodes/return_mean"] >= target:
                return algo.env_steps
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
