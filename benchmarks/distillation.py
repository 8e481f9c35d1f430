"""Env steps until a student reaches 90% of its teacher's return: rl8.Distillation against PPO
from scratch on the student's observations (docs/distillation.md has the table).

Run: ``python benchmarks/distillation.py SEED [SEED ...]`` from the repository root (one
torch thread). The env is
``GoalPoint`` (tests/group_envs.py): the teacher (PPO, 12 updates) reads the privileged error
``goal - x``, the student ``x``, the goal and 30 channels of noise. Returns are deterministic,
over 64 fresh envs for 64 steps (two episodes each), after every update; the settings are those
of tests/test_distillation.py's learning test.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from group_envs import GoalPoint  # noqa: E402

from rl8 import PPO, Distillation  # noqa: E402

TEACHER_GROUPS = {"actor": ["teacher"], "critic": ["teacher"]}
STUDENT_GROUPS = {"actor": ["policy"], "critic": ["policy"]}
COMMON = {"num_envs": 64, "horizon": 32, "model_config": {"hiddens": [32, 32]}}
DISTILLATION = {"lr": 3e-3, "num_sgd_iters": 4, "num_minibatches": 4}


def eval_env(seed: int) -> GoalPoint:
    """64 envs whose episodes are drawn from ``seed`` (each evaluation resets them, unseeded)."""
    env = GoalPoint(64)
    env.reset(seed=seed)
    return env


def deterministic_return(algo: PPO, env: GoalPoint) -> float:
    return algo.evaluate(env, num_steps=64)["episodes/return_mean"]


def steps_to(algo: PPO, target: float, max_env_steps: int) -> tuple[int | None, float]:
    """Train until the return reaches ``target``: the env steps it took (``None``: not within
    ``max_env_steps``) and the last return."""
    value, env = float("nan"), eval_env(algo.seed)
    while algo.env_steps < max_env_steps:
        algo.collect()
        algo.update()
        value = deterministic_return(algo, env)
        if value >= target:
            return algo.env_steps, value
    return None, value


def main(seed: int) -> None:
    start = time.perf_counter()
    torch.set_num_threads(1)
    teacher = PPO(GoalPoint, obs_groups=TEACHER_GROUPS, seed=seed, **COMMON)
    for _ in range(12):
        teacher.collect()
        teacher.update()
    teacher_return = deterministic_return(teacher, eval_env(seed))
    target = 0.9 * teacher_return
    student = Distillation(
        GoalPoint, teacher=teacher.policy, obs_groups=STUDENT_GROUPS, seed=seed, **COMMON, **DISTILLATION
    )
    distilled, _ = steps_to(student, target, 100_000)
    scratch, _ = steps_to(
        PPO(GoalPoint, obs_groups=STUDENT_GROUPS, seed=seed, **COMMON), target, 100_000
    )
    print(
        f"| {seed} | {teacher_return:.2f} | {target:.2f} | {distilled} | {scratch} |"
        f" <!-- {time.perf_counter() - start:.0f} s -->",
        flush=True,
    )


if __name__ == "__main__":
    print("| seed | teacher's return | 90% | Distillation: env steps | PPO from scratch: env steps |")
    print("|---|---|---|---|---|")
    for arg in sys.argv[1:]:
        main(int(arg))
