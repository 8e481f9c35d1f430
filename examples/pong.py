"""Train PPO on Atari Pong with CleanRL's ``ppo_atari`` set-up (the Atari preset of rl8.envs.atari).

Needs ale-py and opencv: ``pip install -e '.[atari]'``. Run ``python examples/pong.py`` (10M
env steps, 40M emulator frames; ``--steps`` for fewer), then ``mlflow ui`` to watch
``episodes/return_mean`` climb from -21 (the opponent wins every point) towards +21.

What to expect: CleanRL's documentation of ``ppo_atari.py`` (docs.cleanrl.dev, "PPO",
``ppo_atari.py`` section: its results table and Pong learning curve) reports an average
episodic return of about +20 on ``PongNoFrameskip-v4`` at the end of 10M env steps with these
hyper-parameters; expect the same shape here. Pong has no lives and rewards of +-1, so the
training returns (clipped rewards, episodes ending at a lost life) are the game's scores.
On CPU the run takes a day or more; on a GPU a few hours (it is bound by the emulator).
"""

from __future__ import annotations

import argparse
import time

from rl8 import PPO, Trainer
from rl8.training.conditions import HitsUpperBound

# CleanRL ppo_atari.py's hyper-parameters in rl8's names
HPARAMS = dict(
    num_envs=8,
    horizon=128,  # CleanRL's num_steps
    lr=2.5e-4,  # annealed linearly towards 0 over the run (lr_schedule below)
    schedule_kind="linear",
    num_sgd_iters=4,  # update_epochs
    num_minibatches=4,
    clip_param=0.1,
    vf_clip_param=0.1,  # CleanRL clips the value loss with clip_coef
    entropy_coeff=0.01,
    vf_coeff=0.5,
    max_grad_norm=0.5,
    gamma=0.99,
    gae_lambda=0.95,
    normalize_rewards=False,  # the preset clips rewards to their sign instead
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--steps", type=int, default=10_000_000, help="env steps to train for (4 frames each)"
    )
    parser.add_argument("--env", default="ALE/Pong-v5", help="an ALE id, e.g. ALE/Breakout-v5")
    parser.add_argument("--vectorization-mode", default="async", choices=["sync", "async", "pool"])
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()

    start = time.perf_counter()
    # CleanRL's annealing: lr * (1 - (iteration - 1) / num_iterations), down to lr / num_iterations
    batch = HPARAMS["num_envs"] * HPARAMS["horizon"]
    algo = PPO(
        args.env,
        seed=args.seed,
        lr_schedule=[(0, 2.5e-4), (args.steps, 2.5e-4 * batch / max(args.steps, batch))],
        env_kwargs={"vectorization_mode": args.vectorization_mode},
        **HPARAMS,
    )
    stats = Trainer(algo).run(stop_conditions=[HitsUpperBound("env/steps", args.steps)])
    print(
        f"{args.env}: episodes/return_mean {stats.get('episodes/return_mean', float('nan')):.1f} after "
        f"{int(stats['env/steps'])} env steps in {time.perf_counter() - start:.0f} s"
    )


if __name__ == "__main__":
    main()
