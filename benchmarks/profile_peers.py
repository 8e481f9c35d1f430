"""rl8 and rsl_rl op by op: ``torch.profiler`` tables of one training iteration of each side.

Each side runs in a fresh process of its own, as ``peers/run.py`` runs it (rl8 in this Python
with the checkout first on ``PYTHONPATH``; rsl_rl in its virtualenv under ``$RL8_PEERS_VENVS``,
made on first use), builds the workload of ``peers/workloads.py`` with the side script's own
config (``side_rl8.hparams``, ``side_rsl_rl.train_cfg``), runs one warm-up iteration, then
profiles one iteration (collect + update; CPU, ``record_shapes=True``). The report compares the
sides per op (calls and self time of each) and lists each side's costliest (op, input shapes)
rows, with the self time of the collect and of the update::

    python benchmarks/profile_peers.py                           # pendulum-4096, 1 thread, fp32
    python benchmarks/profile_peers.py --threads 2 --rows 40
    python benchmarks/profile_peers.py --setting bf16 --side rl8

Profiling slows every op a little, alike on both sides; the env steps per second come from
``peers/run.py``, the profile says where the time of an iteration goes.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE / "peers"))

from run import SIDES, ensure_venv  # noqa: E402
from workloads import WORKLOADS  # noqa: E402

PROFILED_SIDES = ("rl8", "rsl_rl")


def build(side: str, workload: str, setting: str):
    """The side's one-iteration function (collect + update) and a function that tells the phase
    an op belongs to is named by a ``record_function`` range: ``"collect"`` or ``"update"``."""
    import torch

    w = WORKLOADS[workload]
    if side == "rl8":
        from side_rl8 import hparams

        from rl8 import PPO
        from rl8.envs import Pendulum

        algo = PPO(Pendulum, **hparams(workload, setting))

        def iteration() -> None:
            with torch.profiler.record_function("collect"):
                algo.collect()
            with torch.profiler.record_function("update"):
                algo.update()

        return iteration
    from rsl_rl.runners import OnPolicyRunner
    from rsl_rl_env import RslPendulum
    from side_rsl_rl import train_cfg

    torch.manual_seed(0)
    env = RslPendulum(w["num_envs"], seed=0)
    runner = OnPolicyRunner(env, train_cfg(workload, setting == "bf16"), log_dir=None, device="cpu")
    update = runner.alg.update

    def profiled_update() -> dict:
        with torch.profiler.record_function("update"):
            return update()

    runner.alg.update = profiled_update  # learn() collects, computes the returns, then updates

    def iteration() -> None:
        with torch.profiler.record_function("collect"):  # the update's range sits inside
            runner.learn(1)

    return iteration


def profile_one(side: str, workload: str, setting: str, threads: int) -> dict:
    """Profile one iteration of ``side`` after one warm-up; returns its rows as plain data."""
    os.environ["OMP_NUM_THREADS"] = str(threads)
    import torch

    torch.set_num_threads(threads)
    iteration = build(side, workload, setting)
    iteration()  # warm-up: first-call allocations and lazy initialisation
    activities = [torch.profiler.ProfilerActivity.CPU]
    with torch.profiler.profile(activities=activities, record_shapes=True) as prof:
        iteration()
    events = prof.key_averages(group_by_input_shape=True)
    ranges = {e.key: e.cpu_time_total for e in prof.key_averages() if e.key in ("collect", "update")}
    rows = [
        {
            "op": e.key,
            "shapes": str(e.input_shapes),
            "calls": e.count,
            "self_us": e.self_cpu_time_total,
            "total_us": e.cpu_time_total,
        }
        for e in events
        if e.key not in ("collect", "update")
    ]
    return {
        "side": side,
        "threads": torch.get_num_threads(),
        "iteration_us": ranges.get("collect", 0.0)
        + (ranges.get("update", 0.0) if side == "rl8" else 0.0),
        "update_us": ranges.get("update", 0.0),
        "rows": rows,
    }


def run_side(python: Path, side: str, args: argparse.Namespace) -> dict:
    """:func:`profile_one` of ``side`` in a fresh process of ``python`` (its JSON on stdout)."""
    cmd = [str(python), str(Path(__file__).resolve()), "--one", side]
    cmd += ["--workload", args.workload, "--setting", args.setting, "--threads", str(args.threads)]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PYTHONPATH=str(ROOT), OMP_NUM_THREADS=str(args.threads))
    with tempfile.TemporaryDirectory(prefix="rl8-profile-") as tmp:
        env["MLFLOW_TRACKING_URI"] = f"file://{tmp}/mlruns"
        out = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"{side}'s profile failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def by_op(result: dict) -> dict[str, tuple[int, float]]:
    """``{op: (calls, self µs)}`` over every input shape."""
    ops: dict[str, tuple[int, float]] = {}
    for row in result["rows"]:
        calls, us = ops.get(row["op"], (0, 0.0))
        ops[row["op"]] = (calls + row["calls"], us + row["self_us"])
    return ops


def report(results: list[dict], rows: int) -> list[str]:
    """The Markdown report: phase times, the per-op comparison, each side's costliest rows."""
    ms = 1e-3
    out = ["| side | threads | iteration ms | collect ms | update ms |", "|---|---:|---:|---:|---:|"]
    for r in results:
        collect = r["iteration_us"] - r["update_us"]
        out.append(
            f"| {r['side']} | {r['threads']} | {r['iteration_us'] * ms:.1f} | {collect * ms:.1f} | "
            f"{r['update_us'] * ms:.1f} |"
        )
    ops = [by_op(r) for r in results]
    names = sorted(set().union(*ops), key=lambda n: -max(o.get(n, (0, 0.0))[1] for o in ops))
    head = " | ".join(f"{r['side']} calls | {r['side']} self ms" for r in results)
    out += ["", f"| op | {head} |", "|---|" + "---:|" * (2 * len(results))]
    for name in names[:rows]:
        cells = " | ".join(
            f"{o.get(name, (0, 0.0))[0]} | {o.get(name, (0, 0.0))[1] * ms:.1f}" for o in ops
        )
        out.append(f"| `{name}` | {cells} |")
    for r in results:
        out += ["", f"{r['side']}'s costliest ops by input shapes:", ""]
        out += ["| op | input shapes | calls | self ms | total ms |", "|---|---|---:|---:|---:|"]
        for row in sorted(r["rows"], key=lambda x: -x["self_us"])[:rows]:
            out.append(
                f"| `{row['op']}` | {row['shapes']} | {row['calls']} | {row['self_us'] * ms:.1f} | "
                f"{row['total_us'] * ms:.1f} |"
            )
    return out


def main(argv: list[str] | None = None) -> None:
    """Profile the sides (see the module docstring) and print the report."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    batched = [name for name, w in WORKLOADS.items() if w["kind"] == "batched"]
    parser.add_argument("--workload", choices=batched, default="pendulum-4096")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of each side (default 1)")
    parser.add_argument("--setting", choices=("fp32", "bf16"), default="fp32")
    parser.add_argument("--side", action="append", choices=PROFILED_SIDES, help="default: both")
    parser.add_argument("--rows", type=int, default=25, help="rows of each table (default 25)")
    parser.add_argument("--json", type=Path, help="also write every side's rows to this file")
    parser.add_argument("--one", choices=PROFILED_SIDES, help=argparse.SUPPRESS)  # a side's process
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(profile_one(args.one, args.workload, args.setting, args.threads)))
        return
    results = []
    for side in args.side or PROFILED_SIDES:
        venv = SIDES[side].venv
        python, reason = (Path(sys.executable), "") if venv is None else ensure_venv(venv, print)
        if python is None:
            raise SystemExit(f"{side}: not installed: {reason}")
        results.append(run_side(python, side, args))
    print(f"{args.workload}, {args.setting}, {args.threads} torch thread(s) per side\n")
    print("\n".join(report(results, args.rows)))
    if args.json:
        args.json.write_text(json.dumps(results))


if __name__ == "__main__":
    main()
