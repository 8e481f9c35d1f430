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
* ``recurrent``: ``rl8.envs.Memory`` with an LSTM (64 envs x 32 steps, hidden 64, seq_len 8);
* ``memory-lstm``, ``memory-gru``: ``Memory(delay=8, num_cues=4)`` at the hyper-parameters of
  ``tests/test_recurrent_ppo.py`` (64 envs x 16 steps, seq_len 8, minibatches of 256, lr 3e-3,
  gamma 0.9, no reward normalisation; hidden 32 after a 32-wide encoder);
* ``memory-docs``: the same Memory with the LSTM of ``docs/recurrent.md``'s first example
  (hidden 64, seq_len 8, PPO's other defaults).

The ``steps/s`` column is env steps per second of collect+update (the tree's median).

``--solve`` trains the ``memory-*`` workloads instead, for each ``--seed``, until the
deterministic success rate on 256 fresh episodes (every 5 updates) is >= 0.95 or
``--max-env-steps``: the table gives the env steps at the end (every round's value; one value
when the tree is deterministic), whether every round solved, the median wall seconds from
building PPO to the end, and its ratio to the first tree's. The same seed solving in the same
env steps on two trees says they learn alike, whatever the machine's load.

Usage::

    git worktree add --detach /tmp/rl8-main main
    python benchmarks/compare.py --src /tmp/rl8-main --src . --rounds 5
    python benchmarks/compare.py --src /tmp/rl8-main --src . --workload small --rounds 9
    python benchmarks/compare.py --src /tmp/rl8-main --src . --solve --seed 0 --seed 1 --rounds 2
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
MEMORY = {{"delay": 8, "num_cues": 4}}
start = time.perf_counter()
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
elif name in ("memory-lstm", "memory-gru"):
    from rl8.envs import Memory
    from rl8.policies.recurrent import GRUModel, LSTMModel
    algo = PPO(Memory, num_envs=64, horizon=16, seq_len=8, sgd_minibatch_size=256, num_sgd_iters=4,
               lr=3e-3, gamma=0.9, normalize_rewards=False,
               model_cls=LSTMModel if name == "memory-lstm" else GRUModel,
               model_config={{"hidden_size": 32, "encoder_hiddens": (32,)}},
               env_kwargs=MEMORY, device="cpu", seed={seed})
elif name == "memory-docs":
    from rl8.envs import Memory
    from rl8.policies.recurrent import LSTMModel
    algo = PPO(Memory, model_cls=LSTMModel, model_config={{"hidden_size": 64}}, seq_len=8,
               env_kwargs=MEMORY, device="cpu", seed={seed})
else:
    raise SystemExit(f"unknown workload {{name!r}}")
update = getattr(algo, "update", None) or algo.step
import rl8
print(rl8.__file__)
if {solve}:
    # train until the deterministic success rate on 256 fresh episodes, every 5 updates, is >= 0.95
    from rl8.envs import Memory
    eval_env = Memory(256, **MEMORY)
    success = 0.0
    while algo.env_steps < {max_env_steps} and success < 0.95:
        algo.collect(); update()
        if algo.steps % 5 == 0:
            success = algo.evaluate(eval_env, num_steps=4 * (MEMORY["delay"] + 1))["episodes/return_mean"]
    print(json.dumps({{"env_steps": algo.env_steps, "wall_s": time.perf_counter() - start,
                      "success": success}}))
    sys.exit()
for _ in range({warmup}):
    algo.collect(); update()
collects, updates = [], []
steps_before = algo.env_steps
for _ in range({iters}):
    t0 = time.perf_counter(); algo.collect()
    t1 = time.perf_counter(); update()
    t2 = time.perf_counter()
    collects.append(t1 - t0); updates.append(t2 - t1)
print(json.dumps({{"collect": statistics.median(collects), "update": statistics.median(updates),
                  "transitions": (algo.env_steps - steps_before) // {iters}}}))
"""

WORKLOADS = (
    "small",
    "large",
    "large-bf16",
    "gym-cartpole",
    "recurrent",
    "memory-lstm",
    "memory-gru",
    "memory-docs",
)
ITERS = {
    "small": 20,
    "large": 4,
    "large-bf16": 4,
    "gym-cartpole": 10,
    "recurrent": 10,
    "memory-lstm": 20,
    "memory-gru": 20,
    "memory-docs": 10,
}
SOLVE_WORKLOADS = ("memory-lstm", "memory-gru", "memory-docs")


def measure(
    src: Path, name: str, threads: int, iters: int | None, seed: int = 0, max_env_steps: int = 0
) -> dict[str, float]:
    """One fresh process on source tree ``src``.

    Args:
        src: The source tree (the folder holding ``rl8/``).
        name: The workload, one of :data:`WORKLOADS`.
        threads: ``torch.set_num_threads`` in the process.
        iters: Timed iterations (``None``: the workload's default).
        seed: PPO's seed (the ``memory-*`` workloads; the others use 0).
        max_env_steps: 0: time collect and update; > 0: train until solved (success >= 0.95)
            or this many env steps.

    Returns:
        Throughput: median seconds of ``collect`` and of the update, and ``transitions`` (env
        steps) per collect. Solving: ``env_steps`` and ``wall_s`` (from before building PPO)
        at the end, and the last ``success`` rate.
    """
    code = CHILD.format(
        name=name,
        threads=threads,
        iters=iters or ITERS[name],
        warmup=2,
        seed=seed,
        solve=max_env_steps > 0,
        max_env_steps=max_env_steps,
    )
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


def take_turns(srcs: list[Path], rounds: int, run) -> dict[Path, list[dict[str, float]]]:
    """``run(src)`` ``rounds`` times per tree, the trees taking turns, each round starting with
    the next tree, so that load from other processes falls on all of them alike."""
    results: dict[Path, list[dict[str, float]]] = {src: [] for src in srcs}
    for r in range(rounds):
        for src in srcs[r % len(srcs) :] + srcs[: r % len(srcs)]:
            results[src].append(run(src))
    return results


def print_throughput(name: str, srcs: list[Path], results: dict[Path, list[dict[str, float]]]) -> None:
    """Rows of the throughput table of one workload: medians over rounds, ratio to tree 0."""
    base_totals = [m["collect"] + m["update"] for m in results[srcs[0]]]
    base = statistics.median(base_totals)
    for i, src in enumerate(srcs):
        ms = results[src]
        collect = statistics.median(m["collect"] for m in ms) * 1e3
        update = statistics.median(m["update"] for m in ms) * 1e3
        totals = [m["collect"] + m["update"] for m in ms]
        total = statistics.median(totals)
        rate = ms[0]["transitions"] / total
        # range of the per-round ratios against the first tree's same round
        ratios = [t / b for t, b in zip(totals, base_totals)]
        print(
            f"{name:<13} {i:<4} {collect:11.2f} {update:10.2f} {total * 1e3:9.2f} {rate:10.0f} "
            f"{total / base:6.3f}  {min(ratios):.3f}-{max(ratios):.3f}"
        )


def print_solve(
    name: str, seed: int, srcs: list[Path], results: dict[Path, list[dict[str, float]]]
) -> None:
    """Rows of the solving table of one workload and seed: env steps (every round's, which a
    deterministic tree repeats), median wall seconds, and their ratio to tree 0."""
    base = statistics.median(m["wall_s"] for m in results[srcs[0]])
    for i, src in enumerate(srcs):
        ms = results[src]
        steps = sorted({int(m["env_steps"]) for m in ms})
        solved = all(m["success"] >= 0.95 for m in ms)
        wall = statistics.median(m["wall_s"] for m in ms)
        print(
            f"{name:<13} {seed:<5} {i:<4} {'/'.join(map(str, steps)):>10} {'yes' if solved else 'NO':>6} "
            f"{wall:7.1f} {wall / base:6.3f}"
        )


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
        help="workload to measure (repeatable; default: all, or all memory-* ones with --solve)",
    )
    parser.add_argument("--rounds", type=int, default=5, help="processes per tree and workload")
    parser.add_argument("--iters", type=int, help="timed iterations per process (default per workload)")
    parser.add_argument("--threads", type=int, default=2, help="torch.set_num_threads in each process")
    parser.add_argument(
        "--solve",
        action="store_true",
        help="train each memory-* workload until solved instead of timing iterations",
    )
    parser.add_argument(
        "--seed", action="append", type=int, help="with --solve: PPO seed (repeatable; default 0)"
    )
    parser.add_argument(
        "--max-env-steps",
        type=int,
        default=2_000_000,
        help="with --solve: env steps after which a seed counts as not solved",
    )
    args = parser.parse_args(argv)
    if len(args.src) < 2:
        parser.error("give at least two --src trees to compare")
    if args.max_env_steps < 1:
        parser.error(f"--max-env-steps must be >= 1, got {args.max_env_steps}")
    workloads = args.workload or (SOLVE_WORKLOADS if args.solve else WORKLOADS)
    if args.solve and not set(workloads) <= set(SOLVE_WORKLOADS):
        others = sorted(set(workloads) - set(SOLVE_WORKLOADS))
        parser.error(
            f"--solve trains only {', '.join(SOLVE_WORKLOADS)}; got --workload {', '.join(others)}"
        )
    srcs = [s.resolve() for s in args.src]
    for src in srcs:
        if not (src / "rl8" / "__init__.py").is_file():
            parser.error(f"--src {src}: no rl8/__init__.py there")
    print(f"torch threads: {args.threads}; rounds: {args.rounds}; trees: " + ", ".join(map(str, srcs)))
    if args.solve:
        print(
            f"{'workload':<13} {'seed':<5} {'tree':<4} {'env steps':>10} {'solved':>6} {'wall s':>7} {'ratio':>6}"
        )
        for name in workloads:
            for seed in args.seed or [0]:
                results = take_turns(
                    srcs,
                    args.rounds,
                    lambda src: measure(src, name, args.threads, None, seed, args.max_env_steps),
                )
                print_solve(name, seed, srcs, results)
        return 0
    print(
        f"{'workload':<13} {'tree':<4} {'collect ms':>11} {'update ms':>10} {'total ms':>9} "
        f"{'steps/s':>10} {'ratio':>6}  range"
    )
    for name in workloads:
        results = take_turns(srcs, args.rounds, lambda src: measure(src, name, args.threads, args.iters))
        print_throughput(name, srcs, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
