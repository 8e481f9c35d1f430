"""Bytes that training steps add to a SQLite MLflow store (``mlflow.db``): the figure behind the
default of the Trainer's ``log_every`` (docs/tracking.md#what-is-logged).

Two Trainers on CartPole (4 envs x 8 steps, one SGD pass) train ``--steps`` and ``--steps`` +
1,000 steps, each into a fresh store; the difference of the two files' sizes over 1,000 is
what one training step adds::

    OMP_NUM_THREADS=1 python benchmarks/tracking_db_size.py --log-every 1    # about 8.1 kB a step
    OMP_NUM_THREADS=1 python benchmarks/tracking_db_size.py                  # the default: about 320 B
"""

from __future__ import annotations

import argparse
import os
import tempfile

import torch

from rl8 import PPO, Trainer
from rl8.envs import CartPole


def db_bytes(steps: int, folder: str, log_every: int | None) -> tuple[int, int]:
    """The size of the store after ``steps`` training steps, and the stats of the last step."""
    options = {} if log_every is None else {"log_every": log_every}
    algo = PPO(CartPole, num_envs=4, horizon=8, sgd_minibatch_size=32, num_sgd_iters=1, seed=0)
    with Trainer(
        algo,
        progress=False,
        tracking_uri=f"sqlite:///{folder}/mlflow.db",
        checkpoint_dir=f"{folder}/checkpoints",
        **options,
    ) as trainer:
        for _ in range(steps):
            stats = trainer.step()
    return os.path.getsize(f"{folder}/mlflow.db"), sum(v == v for v in stats.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=100, help="steps of the shorter run")
    parser.add_argument(
        "--log-every", type=int, default=None, help="the Trainer's log_every (default: its default)"
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as short, tempfile.TemporaryDirectory() as long:
        before, stats = db_bytes(args.steps, short, args.log_every)
        after, _ = db_bytes(args.steps + 1000, long, args.log_every)
    print(
        f"{stats} stats a step; log_every={args.log_every or 'default'}: {(after - before) / 1000:.0f} bytes "
        "a training step"
    )


if __name__ == "__main__":
    main()
