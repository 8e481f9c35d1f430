"""Train rl8's built-in batched Pendulum to a deterministic return >= -200.

Run: ``python examples/pendulum.py`` (the hyper-parameters of tests/test_learning.py).
"""

from __future__ import annotations

import time

from rl8 import PPO, Trainer
from rl8.envs import Pendulum
from rl8.training.conditions import HitsUpperBound

HPARAMS = dict(
    num_envs=256, horizon=64, gamma=0.95, lr=3e-3, num_sgd_iters=8, sgd_minibatch_size=4096, seed=0
)


def main() -> None:
    start = time.perf_counter()
    trainer = Trainer(PPO(Pendulum, **HPARAMS), eval_num_envs=64)
    stats = trainer.run(
        steps_per_eval=4,
        stop_conditions=[
            HitsUpperBound("eval/episodes/return_mean", -200),
            HitsUpperBound("env/steps", 3_000_000),
        ],
    )
    trainer.close()
    print(
        f"eval return {stats.get('eval/episodes/return_mean', float('nan')):.1f} after "
        f"{int(stats['env/steps'])} env steps in {time.perf_counter() - start:.1f} s"
    )


if __name__ == "__main__":
    main()
