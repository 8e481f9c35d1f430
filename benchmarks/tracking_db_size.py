"""What a 10-hour run adds to a SQLite MLflow store (``mlflow.db``) at each logging cadence: the
figures behind the default of the Trainer's ``log_every`` (docs/tracking.md#what-is-logged).

First the bytes of one logged step: two Trainers on CartPole (4 envs x 8 steps, one SGD pass,
``log_every=1``) train ``--steps`` and ``--steps`` + 1,000 steps, each into a fresh store; the
difference of the two files' sizes over 1,000 is what one logged step adds. Then, for each step
rate of ``--steps-per-s``, a :class:`~rl8.tracking.cadence.LogCadence` on a fake clock goes
through 10 hours of steps and counts the steps it logs (evaluations and checkpoints, logged
whatever the cadence says, come on top); the store grows by that count times the bytes of one::

    OMP_NUM_THREADS=1 python benchmarks/tracking_db_size.py    # results: docs/tracking.md
"""

from __future__ import annotations

import argparse
import os
import tempfile

import torch

from rl8 import PPO, Trainer
from rl8.envs import CartPole
from rl8.tracking.cadence import LogCadence

HOURS = 10.0


def db_bytes(steps: int, folder: str) -> tuple[int, int]:
    """The size of a store after ``steps`` training steps, each logged, and the stats of the last."""
    algo = PPO(CartPole, num_envs=4, horizon=8, sgd_minibatch_size=32, num_sgd_iters=1, seed=0)
    with Trainer(
        algo,
        progress=False,
        tracking_uri=f"sqlite:///{folder}/mlflow.db",
        checkpoint_dir=f"{folder}/checkpoints",
        log_every=1,
    ) as trainer:
        for _ in range(steps):
            stats = trainer.step()
    return os.path.getsize(f"{folder}/mlflow.db"), sum(v == v for v in stats.values())


def logged_steps(log_every: int | None, steps_per_s: float, hours: float = HOURS) -> int:
    """The steps a cadence (``log_every`` as the Trainer's) logs of a run of ``hours`` hours at
    ``steps_per_s`` training steps a second, on a fake clock."""
    cadence = LogCadence(log_every)
    return sum(cadence.due(n / steps_per_s) for n in range(int(hours * 3600 * steps_per_s)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=100, help="steps of the shorter run")
    parser.add_argument(
        "--steps-per-s",
        type=float,
        nargs="+",
        default=[1.0, 10.0, 22.0],
        help="training steps a second of the simulated 10-hour runs",
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as short, tempfile.TemporaryDirectory() as long:
        before, stats = db_bytes(args.steps, short)
        after, _ = db_bytes(args.steps + 1000, long)
    per_step = (after - before) / 1000
    print(f"{stats} stats a step; one logged step adds {per_step:.0f} bytes")
    print(f"{'steps/s':>8} {'log_every':>10} {'logged steps':>13} {'MB in 10 h':>11}")
    for rate in args.steps_per_s:
        for log_every in (None, 1, 25):
            n = logged_steps(log_every, rate)
            name = "default" if log_every is None else str(log_every)
            print(f"{rate:8g} {name:>10} {n:13,d} {n * per_step / 1e6:11,.0f}")


if __name__ == "__main__":
    main()
