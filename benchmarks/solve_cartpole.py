"""Wall time from a fresh process to a solved CartPole (deterministic eval return >= 475).

Run: ``time python benchmarks/solve_cartpole.py [SEED]`` (``RL8_BENCH_THREADS``, default 2,
sets ``torch.set_num_threads``). No tracking: this is the algorithm alone, PPO's defaults,
evaluated on 32 fresh envs every 2 updates.
"""

from __future__ import annotations

import os
import sys
import time

import torch

from rl8 import PPO
from rl8.envs import CartPole


def main(seed: int) -> None:
    start = time.perf_counter()
    torch.set_num_threads(int(os.environ.get("RL8_BENCH_THREADS", "2")))
    algo = PPO(CartPole, seed=seed)
    eval_env = CartPole(32)
    while algo.env_steps < 1_500_000:
        algo.collect()
        algo.update()
        if algo.steps % 2 == 0 and algo.evaluate(eval_env, num_steps=500)["episodes/return_mean"] >= 475:
            print(
                f"solved after {algo.env_steps} env steps, {time.perf_counter() - start:.2f} s after imports"
            )
            return
    sys.exit("not solved within 1.5M env steps")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
