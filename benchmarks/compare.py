"""Side-by-side throughput of two (or more) rl8 source trees, e.g. a change against main.

Each measurement is a fresh Python process with ``PYTHONPATH`` set to one source tree. It builds
one workload, warms up, then times ``--iters`` training iterations and prints the medians of
its ``collect()`` and its update (``update()``, or ``step()`` in trees older than that name).
The source trees take turns, round after round, starting with a different one each round, so
that load from other processes on a shared machine falls on all of them alike. The table
gives, per workload and tree, the median over rounds of those medians (ms) and the ratio of
each tree's collect+update time to the first tree's (< 1: faster than the first).

Workloads (``torch.set_num_threads(--threads)``, default 2):

* ``small``, ``large``, ``large-bf16``: those of ``benchmarks/test_throughput.py``
  (DiscreteDummyEnv; 512 envs x 32 steps, 64x64 MLPs, minibatches of 4096; 8192 envs x 32
  steps, 256x256 MLPs, one minibatch; the same in bfloat16 autocast);
* ``gym-cartpole``: ``PPO("CartPole-v1")`` through the gymnasium adapter, 64 envs (sync
  vectorisation), horizon 32, default hyper-parameters;
* ``recurrent``: ``rl8.envs.Memory`` with an LSTM (64 envs x 32 steps, hidden 64, seq_len 8).

Usage::

    git worktree add --detach /tmp/rl8-main main
    python benchmarks/compare.py --src /tmp/rl8-main --src . --rounds 5
    python benchmarks/compare.py --src /tmp/rl8-main --src . --workload small --rounds 9
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

CHILD = r"""
import json, statistics, sys, time
import torch
torch.set_num_threads({threads})
from rl8 import PPO

name = {name!r}
if name in ("small", "large", "large-bf16"):
    from rl8.envs import DiscreteDummyEnv
    big = name != "small"
    algo = PPO(
        DiscreteDummyEnv, num_envs=8192 if big else 512, horizon=32,
        sgd_minibatch_size=None if big else 4096, num_sgd_iters=4, lr=1e-3, gamma=0.95,
        gae_lambda=0.95, clip_param=0.2, vf_clip_param=5.0, vf_coeff=1.0, max_grad_norm=5.0,
        normalize_advantages=True, normalize_rewards=True,
        model_config={{"hiddens": (256, 256) if big else (64, 64), "activation": "relu"}},
        enable_amp=name == "large-bf16", device="cpu", seed=0,
    )
elif name == "gym-cartpole":
    algo = PPO("CartPole-v1", num_envs=64, horizon=32, device="cpu", seed=0)
elif name == "recurrent":
    from rl8.envs import Memory
    from rl8.policies.recurrent import LSTMModel
    algo = PPO(Memory, num_envs=64, horizon=32, seq_len=8, model_cls=LSTMModel,
               model_config={{"hidden_size": 64}}, device="cpu", seed=0)
else:
    raise SystemExit(f"unknown workload {{name!r}}")
update = getattr(algo, "update", None) or algo.step
for _ in range({warmup}):
    algo.collect(); update()
collects, updates = [], []
for _ in range({iters}):
    t0 = time.perf_counter(); algo.collect()
    t1 = time.perf_counter(); update()
    t2 = time.perf_counter()
    collects.append(t1 - t0); updates.append(t2 - t1)
import rl8
print(rl8.__file__)
print(json.dumps({{"collect": statistics.median(collects), "update": statistics.median(updates)}}))
"""

WORKLOADS = ("small", "large", "large-bf16", "gym-cartpole", "recurrent")
ITERS = {"small": 20, "large": 4, "large-bf16": 4, "gym-cartpole": 10, "recurrent": 10}


def measure(src: Path, name: str, threads: int, iters: int | None) -> dict[str, float]:
    """One fresh process on source tree ``src``: median seconds of collect and update."""
    n = iters or ITERS[name]
    code = CHILD.format(name=name, threads=threads, iters=n, warmup=2)
    env = {**os.environ, "PYTHONPATH": str(src), "MLFLOW_TRACKING_URI": "file:///dev/null"}
    # run in the tree itself: `python -c` puts the working folder before PYTHONPATH
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=src, capture_output=True, text=True, check=False
    )
    if f"{src}/rl8/" not in out.stdout:
        raise SystemExit(
            f"{name}: the process on {src} imported rl8 from elsewhere:\n{out.stdout}{out.stderr[-2000:]}"
        )
    if out.returncode != 0:
        raise SystemExit(f"{name} on {src} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--src",
        action="append",
        type=Path,
        required=True,
        help="an rl8 source tree (the folder holding rl8/); give two or more",
    )
    parser.add_argument(
        "--workload",
        action="append",
        choices=WORKLOADS,
        help="workload to measure (repeatable; default: all)",
    )
    parser.add_argument("--rounds", type=int, default=5, help="processes per tree and workload")
    parser.add_argument("--iters", type=int, help="timed iterations per process (default per workload)")
    parser.add_argument("--threads", type=int, default=2, help="torch.set_num_threads in each process")
    args = parser.parse_args(argv)
    if len(args.src) < 2:
        parser.error("give at least two --src trees to compare")
    srcs = [s.resolve() for s in args.src]
    for src in srcs:
        if not (src / "rl8" / "__init__.py").is_file():
            parser.error(f"--src {src}: no rl8/__init__.py there")
    print(f"torch threads: {args.threads}; rounds: {args.rounds}; trees: " + ", ".join(map(str, srcs)))
    print(
        f"{'workload':<13} {'tree':<4} {'collect ms':>11} {'update ms':>10} {'total ms':>9} {'ratio':>6}  range"
    )
    for name in args.workload or WORKLOADS:
        results: dict[Path, list[dict[str, float]]] = {src: [] for src in srcs}
        for r in range(args.rounds):
            order = srcs[r % len(srcs) :] + srcs[: r % len(srcs)]
            for src in order:
                results[src].append(measure(src, name, args.threads, args.iters))
        base_totals = [m["collect"] + m["update"] for m in results[srcs[0]]]
        base = statistics.median(base_totals)
        for i, src in enumerate(srcs):
            ms = results[src]
            collect = statistics.median(m["collect"] for m in ms) * 1e3
            update = statistics.median(m["update"] for m in ms) * 1e3
            totals = [m["collect"] + m["update"] for m in ms]
            total = statistics.median(totals)
            # range of the per-round ratios against the first tree's same round
            ratios = [t / b for t, b in zip(totals, base_totals)]
            print(
                f"{name:<13} {i:<4} {collect:11.2f} {update:10.2f} {total * 1e3:9.2f} "
                f"{total / base:6.3f}  {min(ratios):.3f}-{max(ratios):.3f}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
