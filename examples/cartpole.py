"""Train rl8's built-in batched CartPole until the deterministic policy scores >= 475.

Run: ``python examples/cartpole.py``; then ``mlflow ui`` in this folder to see the run.
"""

from __future__ import annotations

import time

from rl8 import PPO, Trainer
from rl8.envs import CartPole
from rl8.training.conditions import HitsUpperBound


def main() -> None:
    start = time.perf_counter()
    trainer = Trainer(PPO(CartPole, seed=0), eval_num_envs=32)
    stats = trainer.run(
        steps_per_eval=2,
        stop_conditions=[
            HitsUpperBound("eval/episodes/return_mean", 475),
            HitsUpperBound("env/steps", 2_000_000),
        ],
    )
    print(
        f"eval return {stats.get('eval/episodes/return_mean', float('nan')):.1f} after "
        f"{int(stats['env/steps'])} env steps in {time.perf_counter() - start:.1f} s"
    )


if __name__ == "__main__":
    main()
