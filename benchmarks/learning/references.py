"""Thresholds and published reference returns of the presets' tasks.

Sources (read 2026-11-23):

* gymnasium's ``reward_threshold`` of each env spec (``gymnasium.spec(id).reward_threshold``).
* SB3: rl-baselines3-zoo ``benchmark.md`` (https://github.com/DLR-RM/rl-baselines3-zoo/blob/master/benchmark.md),
  PPO rows: one trained agent per task, evaluated deterministically; MuJoCo rows are the v3 envs.
* CleanRL: ``docs/benchmark/ppo.md`` (``ppo.py``) and ``docs/benchmark/ppo_continuous_action.md``
  (https://github.com/vwxyzjn/cleanrl/tree/master/docs/benchmark), openrlbenchmark tag
  ``pr-424``: mean +- std over seeds of the episodic return at the end of training (500k steps
  for classic control, 1M for MuJoCo v4).
"""

from __future__ import annotations

from dataclasses import dataclass, field

SB3_ZOO = "SB3 zoo PPO"
CLEANRL = "CleanRL PPO"


@dataclass(frozen=True)
class Reference:
    """A published return: who (``source``), what (``value``, the mean episode return) and how
    (``note``: env version, budget)."""

    source: str
    value: float
    note: str = ""


@dataclass(frozen=True)
class Task:
    """What a preset is judged by: ``threshold`` (an episode return; steps and wall time to reach
    it are reported), where the threshold comes from, published reference returns and
    ``eval_every``: the env steps between the benchmark's evaluations, the same for rl8
    (``run.py``) and SB3 (``sb3.py``), so that both measure "steps to threshold" at the same
    granularity whatever their batch shapes (``None``: the preset's ``steps_per_eval``)."""

    threshold: float
    threshold_source: str
    references: tuple[Reference, ...] = field(default_factory=tuple)
    eval_every: int | None = None


GYM = "gymnasium reward_threshold"

TASKS: dict[str, Task] = {
    "CartPole-v1": Task(
        475.0,
        GYM,
        (
            Reference(SB3_ZOO, 500.0, "100k steps"),
            Reference(CLEANRL, 490.04, "ppo.py, 500k steps"),
        ),
        eval_every=2048,
    ),
    "Acrobot-v1": Task(
        -100.0,
        GYM,
        (
            Reference(SB3_ZOO, -73.506, "1M steps"),
            Reference(CLEANRL, -86.36, "ppo.py, 500k steps"),
        ),
    ),
    "MountainCarContinuous-v0": Task(90.0, GYM, (Reference(SB3_ZOO, 88.343, "20k steps, gSDE"),)),
    "Pendulum-v1": Task(
        -200.0,
        "none in gymnasium: -200 chosen here",
        (Reference(SB3_ZOO, -172.225, "100k steps, gSDE"),),
        eval_every=4096,
    ),
    "LunarLander-v3": Task(200.0, GYM, (Reference(SB3_ZOO, 242.119, "LunarLander-v2, 1M steps"),)),
    "HalfCheetah-v5": Task(
        1442.64,
        "CleanRL's published mean (the issue's target)",
        (
            Reference(SB3_ZOO, 5819.099, "HalfCheetah-v3, 1M steps, tuned"),
            Reference(CLEANRL, 1442.64, "ppo_continuous_action.py, HalfCheetah-v4, 1M steps"),
        ),
        eval_every=40960,
    ),  # about every 41k env steps (the old presets' 20 updates of 2048)
    "Hopper-v5": Task(
        2382.86,
        "CleanRL's published mean (the issue's target)",
        (
            Reference(SB3_ZOO, 2410.435, "Hopper-v3, 1M steps, tuned"),
            Reference(CLEANRL, 2382.86, "ppo_continuous_action.py, Hopper-v4, 1M steps"),
        ),
        eval_every=40960,
    ),  # about every 41k env steps (the old presets' 20 updates of 2048)
    "Walker2d-v5": Task(
        2287.95,
        "CleanRL's published mean",
        (
            Reference(SB3_ZOO, 3478.798, "Walker2d-v3, 1M steps, tuned"),
            Reference(CLEANRL, 2287.95, "ppo_continuous_action.py, Walker2d-v4, 1M steps"),
        ),
        eval_every=40960,
    ),  # as HalfCheetah-v5 and Hopper-v5
    "Ant-v5": Task(
        1327.158,
        "SB3 zoo's PPO return",
        (Reference(SB3_ZOO, 1327.158, "Ant-v3, 1M steps"),),
        eval_every=40960,
    ),
    "Humanoid-v5": Task(
        716.11,
        "CleanRL's published mean",
        (Reference(CLEANRL, 716.11, "ppo_continuous_action.py, Humanoid-v4, 1M steps"),),
        eval_every=40960,
    ),
    "CartPole": Task(475.0, "CartPole-v1's reward_threshold", ()),
    "Pendulum": Task(-200.0, "as Pendulum-v1", ()),
    "Memory": Task(0.95, "success rate (1.0: always right; chance: 0.5)", ()),
}
