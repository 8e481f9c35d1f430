"""Train gymnax's CartPole-v1 (JAX, jit + vmap, handed to torch by DLPack) to a deterministic
return >= 475.

Run: ``python examples/gymnax_cartpole.py`` (needs ``python -m pip install -e ".[gymnax]"`` in rl8's clone); then
``mlflow ui`` in this folder to see the run. PPO's defaults (256 envs x 32 steps) solve it in
about 115k env steps.
"""

from __future__ import annotations

import time

from rl8 import PPO, Trainer
from rl8.envs import GymnaxEnv
from rl8.training.conditions import HitsUpperBound


def main() -> None:
    start = time.perf_counter()
    trainer = Trainer(
        PPO(GymnaxEnv, env_kwargs={"env_id": "CartPole-v1"}, seed=0),
        eval_num_envs=32,
        experiment="gymnax-CartPole-v1",
    )
    stats = trainer.run(
        steps_per_eval=2,
        stop_conditions=[
            HitsUpperBound("eval/episodes/return_mean", 475),
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
