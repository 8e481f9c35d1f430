"""Train gymnasium's Pendulum-v1 through rl8's adapter to a deterministic return >= -200.

Run: ``python examples/gymnasium_pendulum.py``. The hyper-parameters of
tests/envs/test_gymnasium_learning.py: a short discount (gamma 0.95) suits Pendulum's dense
reward, and a high learning rate with 8 passes per update learns it in about 100k steps.
"""

from __future__ import annotations

import time

from rl8 import PPO, Trainer
from rl8.training.conditions import HitsUpperBound

HPARAMS = dict(
    num_envs=64, horizon=128, gamma=0.95, lr=3e-3, num_sgd_iters=8, sgd_minibatch_size=2048, seed=0
)


def main() -> None:
    start = time.perf_counter()
    trainer = Trainer(PPO("Pendulum-v1", **HPARAMS), eval_num_envs=16, experiment="Pendulum-v1")
    stats = trainer.run(
        steps_per_eval=4,
        stop_conditions=[
            HitsUpperBound("eval/episodes/return_mean", -200),
            HitsUpperBound("env/steps", 1_000_000),
        ],
    )
    trainer.close()
    print(
        f"eval return {stats.get('eval/episodes/return_mean', float('nan')):.1f} after "
        f"{int(stats['env/steps'])} env steps in {time.perf_counter() - start:.1f} s"
    )


if __name__ == "__main__":
    main()
