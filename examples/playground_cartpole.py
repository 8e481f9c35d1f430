"""Train MuJoCo Playground's CartpoleBalance (MJX on JAX, handed to torch by DLPack) to a
deterministic return >= 900 of 1,000.

Run: ``python examples/playground_cartpole.py`` (needs ``python -m pip install -e ".[playground]"`` in rl8's clone); then
``mlflow ui`` in this folder to see the run. ``impl="jax"`` runs MJX in JAX (Playground's
default for this task is MuJoCo Warp); 1,024 envs, rsl_rl's PPO settings for the task's size.
"""

from __future__ import annotations

import time

from rl8 import PPO, Trainer
from rl8.envs import PlaygroundEnv
from rl8.training.conditions import HitsUpperBound

ENV = {"env_id": "CartpoleBalance", "config_overrides": {"impl": "jax"}}
HPARAMS = dict(
    num_envs=1024,
    horizon=24,
    num_sgd_iters=5,
    num_minibatches=4,
    model_config={"hiddens": (64, 64)},
    seed=0,
)


def main() -> None:
    start = time.perf_counter()
    trainer = Trainer(
        PPO(PlaygroundEnv, env_kwargs=ENV, **HPARAMS),
        eval_num_envs=16,
        eval_num_steps=1000,
        experiment="playground-CartpoleBalance",
    )
    stats = trainer.run(
        steps_per_eval=4,
        stop_conditions=[
            HitsUpperBound("eval/episodes/return_mean", 900),
            HitsUpperBound("env/steps", 2_000_000),
        ],
    )
    trainer.close()
    print(
        f"eval return {stats.get('eval/episodes/return_mean', float('nan')):.1f} after "
        f"{int(stats['env/steps'])} env steps in {time.perf_counter() - start:.1f} s"
    )


if __name__ == "__main__":
    main()
