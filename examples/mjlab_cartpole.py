"""Train mjlab's cartpole (``Mjlab-Cartpole-Balance``) with rl8 on warp's CPU device, with the rsl_rl
config mjlab tunes for the task (carried over by ``rl8.presets.from_rsl_rl``: adaptive learning
rate, networks, PPO's coefficients), until the mean episode return reaches 45 (of 50).

Needs mjlab installed beside rl8 (``docs/simulators_mjlab.md``). Run:
``python examples/mjlab_cartpole.py`` (256 envs; ``--reset-mode partial`` for the true final
observations; ``--max-env-steps`` to stop sooner).
"""

from __future__ import annotations

import os

os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")  # warp on its CPU device; set before mjlab is imported

import argparse  # noqa: E402
import time  # noqa: E402

from rl8 import PPO, Trainer  # noqa: E402
from rl8.envs.mjlab import RESET_MODES, mjlab_runner_cfg  # noqa: E402
from rl8.presets import from_rsl_rl  # noqa: E402
from rl8.training.conditions import HitsUpperBound  # noqa: E402

TASK = "Mjlab-Cartpole-Balance"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--num-envs", type=int, default=256, help="envs simulated together (default 256)"
    )
    parser.add_argument(
        "--reset-mode", choices=RESET_MODES, default="auto", help="see rl8.envs.mjlab (default auto)"
    )
    parser.add_argument(
        "--max-env-steps", type=int, default=2_000_000, help="stop after this many env steps"
    )
    args = parser.parse_args(argv)

    # unmapped: also warned; the run stops on its own conditions, not max_iterations (run_args)
    hparams, unmapped, _ = from_rsl_rl(mjlab_runner_cfg(TASK))
    algo = PPO(
        f"mjlab:{TASK}", num_envs=args.num_envs, env_kwargs={"reset_mode": args.reset_mode}, **hparams
    )
    start = time.perf_counter()
    with Trainer(algo, progress=False) as trainer:
        stats = trainer.run(
            stop_conditions=[
                HitsUpperBound("episodes/return_mean", 45.0),
                HitsUpperBound("env/steps", args.max_env_steps),
            ]
        )
    print(
        f"return {stats.get('episodes/return_mean', float('nan')):.1f} after {int(stats['env/steps']):,} env steps "
        f"in {time.perf_counter() - start:.0f} s"
    )


if __name__ == "__main__":
    main()
