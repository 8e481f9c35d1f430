"""The cost of rl8.envs.mjlab's two reset modes: env steps per second of ``RslRlEnv.step`` on mjlab's
cartpole with ``reset_mode="auto"`` (mjlab resets inside ``step``) and ``"partial"``
(``auto_reset=False`` and ``reset(env_ids)`` after each step where an episode ended), zero actions,
episodes started at random lengths (rsl_rl's ``init_at_random_ep_len``: at 256 envs and 1,000-step
episodes some episode ends on about a quarter of the steps). Both envs live in this one process
and take turns in blocks of steps, so that load from other processes falls on both alike; prints
the median of each mode and the median of the per-block ratios partial / auto.

Run in the mjlab venv from the repository root (``docs/simulators_mjlab.md``)::

    PYTHONPATH=. .venv-mjlab/bin/python benchmarks/peers/mjlab_reset_modes.py --num-envs 256 --blocks 20

Two runs, 2026-11-27, AMD EPYC 2 cores shared with other jobs, 1 torch thread, 256 envs:
20 blocks of 64 steps at load average 6.3: auto 1,309 env steps/s, partial 1,684, partial / auto
1.06 (per block 0.74-2.77); 30 blocks of 32 steps at load average 5.5: auto 2,695, partial
2,579, partial / auto 0.99 (per block 0.30-1.82). On this machine the partial resets' cost is
below the noise of a shared machine.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-envs", type=int, default=256)
    parser.add_argument("--blocks", type=int, default=20, help="timed blocks per mode")
    parser.add_argument("--steps", type=int, default=64, help="steps per block")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    args = parser.parse_args()
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    import torch

    torch.set_num_threads(args.threads)
    from rl8.envs.mjlab import make_mjlab_env

    envs = {
        mode: make_mjlab_env(
            "Mjlab-Cartpole-Balance", args.num_envs, device="cpu", reset_mode=mode, seed=0
        )
        for mode in ("auto", "partial")
    }
    actions = torch.zeros(args.num_envs, 1)
    rates: dict[str, list[float]] = {mode: [] for mode in envs}
    for env in envs.values():
        env.reset()
        for _ in range(args.steps):  # warm-up
            env.step(actions)
    for block in range(args.blocks):
        for mode in ("auto", "partial") if block % 2 == 0 else ("partial", "auto"):
            start = time.perf_counter()
            for _ in range(args.steps):
                envs[mode].step(actions)
            rates[mode].append(args.num_envs * args.steps / (time.perf_counter() - start))
    ratios = [p / a for p, a in zip(rates["partial"], rates["auto"])]
    print(
        f"{args.num_envs} envs, {args.blocks} blocks of {args.steps} steps, {args.threads} torch thread(s), "
        f"load average {os.getloadavg()[0]:.1f}"
    )
    for mode, values in rates.items():
        print(f"{mode}: {statistics.median(values):,.0f} env steps/s")
    print(
        f"partial / auto: {statistics.median(ratios):.2f} (per block {min(ratios):.2f}-{max(ratios):.2f})"
    )


if __name__ == "__main__":
    main()
