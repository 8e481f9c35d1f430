"""Train gymnasium's CartPole-v1 through rl8's adapter to a deterministic return >= 475.

Run: ``python examples/gymnasium_cartpole.py``; ``mlflow ui`` in this folder shows the run.
These are the hyper-parameters of tests/envs/test_gymnasium_learning.py: few envs (the
gymnasium simulator steps in Python, one env at a time) and long horizons.
"""

from __future__ import annotations

import time

from rl8 import PPO, Trainer
from rl8.training.conditions import HitsUpperBound

HPARAMS = dict(num_envs=16, horizon=64, sgd_minibatch_size=256, num_sgd_iters=8, seed=0)


def main() -> None:
    start = time.perf_counter()
    trainer = Trainer(PPO("CartPole-v1", **HPARAMS), eval_num_envs=16, experiment="CartPole-v1")
    stats = trainer.run(
        steps_per_eval=4,
        stop_conditions=[
            HitsUpperBound("eval/episodes/return_mean", 475),
            HitsUpperBound("env/steps", 300_000),
        ],
    )
    trainer.close()
    print(
        f"eval return {stats.get('eval/episodes/return_mean', float('nan')):.1f} after "
        f"{int(stats['env/steps'])} env steps in {time.perf_counter() - start:.1f} s"
    )


if __name__ == "__main__":
    main()
