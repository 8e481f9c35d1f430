"""rl8 against rsl_rl on one GPU: the peers' batched workload (``pendulum-4096`` of
``benchmarks/peers/workloads.py``) at 4,096 and 16,384 envs, printed as one Markdown table.

Each measurement is a fresh process of ``benchmarks/peers/side_rl8.py`` or ``side_rsl_rl.py``
(the same scripts as the CPU table of docs/performance.md) run by this Python, with this
checkout first on ``PYTHONPATH`` (and the caller's ``PYTHONPATH`` after it: on the GPU machine
the carried wheels are there); the sides take turns round after round, each round starting with
a different one. Settings: rl8 ``fp32``, ``bf16`` (``enable_amp=True``: bfloat16 autocast on
GPUs of compute capability 8.0 and later, float16 with a gradient scaler on older ones),
``compile`` and ``compile-bf16`` (``compile=True``: on CUDA the rollout runs as CUDA graphs)
where this rl8 has that hyper-parameter; rsl_rl ``fp32`` and ``bf16`` (its
``use_mixed_precision``: bfloat16 autocast of the update). ``benchmarks/gpu/check.sh`` runs it::

    python benchmarks/gpu/bench.py --device cuda --out gpu_table.md
    python benchmarks/gpu/bench.py --device cpu --envs 64 --envs 128 --warmup 1 --iters 1 --no-compile
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
PEERS = ROOT / "benchmarks" / "peers"
sys.path.insert(0, str(PEERS))

import run  # noqa: E402  (the peers' table, reused)

WORKLOAD = "pendulum-4096"


def pythonpath() -> str:
    """This checkout first, then the caller's ``PYTHONPATH`` (the carried wheels' folder)."""
    rest = [
        p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and Path(p).resolve() != ROOT
    ]
    return os.pathsep.join([str(ROOT), *rest])


def why_no_compile() -> str | None:
    """``None`` when this checkout's ``rl8.ppo.hparams.HParams`` has a ``compile`` field, else
    why not (asked in a fresh process, as the sides will import it)."""
    code = (
        "import dataclasses; from rl8.ppo.hparams import HParams; "
        "print('compile' in {f.name for f in dataclasses.fields(HParams)})"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "PYTHONPATH": pythonpath()},
        capture_output=True,
        text=True,
        check=False,
    )
    if out.returncode != 0:
        err = [ln for ln in out.stderr.splitlines() if ln.strip()] or ["no output"]
        return f"rl8 did not import: {err[-1][:200]}"
    return None if out.stdout.strip() == "True" else "this rl8's HParams has no compile field"


def measure(side: str, num_envs: int, setting: str, args: argparse.Namespace, timeout: float) -> dict:
    """One measurement of ``side`` (``rl8``/``rsl_rl``) at ``num_envs`` envs in ``setting``, in
    a fresh process stopped after ``timeout`` seconds: the side's JSON line (``steps_per_s``...),
    or ``{"error": ...}``."""
    python = args.rsl_rl_python if side == "rsl_rl" else sys.executable
    cmd = [
        python,
        str(PEERS / run.SIDES[side].script),
        WORKLOAD,
        "--setting",
        setting,
        "--device",
        args.device,
        "--threads",
        str(args.threads),
        "--num-envs",
        str(num_envs),
        "--warmup",
        str(args.warmup),
        "--iters",
        str(args.iters),
    ]
    env = {**os.environ, "PYTHONPATH": pythonpath(), "OMP_NUM_THREADS": str(args.threads)}
    result = run.run_side(cmd, env, timeout)
    if "error" in result:
        return result
    if not result.get("rl8_file", "").startswith(str(ROOT / "rl8")):
        return {"error": f"imported rl8 from {result.get('rl8_file')}, not from {ROOT}"}
    return result


def device_name(device: str) -> str:
    """The GPU's name as torch reports it, or ``"CPU"``."""
    import torch

    if torch.device(device).type == "cuda" and torch.cuda.is_available():
        return torch.cuda.get_device_name(torch.device(device))
    return "CPU"


def main(argv: list[str] | None = None) -> int:
    """Measure, print the report (header, table, each side at its best) and write it to ``--out``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", help="torch device of every side (default cuda)")
    parser.add_argument(
        "--envs", type=int, action="append", help="env counts, repeatable (default 4096 and 16384)"
    )
    parser.add_argument(
        "--rounds", type=int, default=2, help="measurements per side and setting (default 2)"
    )
    parser.add_argument(
        "--warmup", type=int, default=3, help="untimed iterations per measurement (default 3)"
    )
    parser.add_argument(
        "--iters", type=int, default=10, help="timed iterations per measurement (default 10)"
    )
    parser.add_argument(
        "--threads", type=int, default=4, help="torch CPU threads of every side (default 4)"
    )
    parser.add_argument(
        "--timeout", type=float, default=120.0, help="seconds one measurement may take (default 120)"
    )
    parser.add_argument(
        "--budget",
        type=float,
        default=330.0,
        help="seconds for all measurements: the one running then is stopped, later ones left out (default 330)",
    )
    parser.add_argument(
        "--rsl-rl-python",
        default=sys.executable,
        help="the Python that runs rsl_rl's side (default: this one, as on the GPU machine)",
    )
    parser.add_argument("--no-compile", action="store_true", help="leave out rl8's compile=True rows")
    parser.add_argument("--out", type=Path, help="also write the report (Markdown) to this file")
    args = parser.parse_args(argv)
    envs = args.envs or [4096, 16384]
    for name in ("rounds", "warmup", "iters", "threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    if min(envs) < 1:
        parser.error(f"--envs must be >= 1, got {min(envs)}")

    start = time.monotonic()
    stamp = datetime.datetime.now(datetime.UTC)
    no_compile = "--no-compile" if args.no_compile else why_no_compile()
    compiles = no_compile is None
    rl8_settings = ["fp32", "bf16"] + (["compile", "compile-bf16"] if compiles else [])
    blocks = {}  # label -> its measurements, in the order of a round
    for n in envs:
        label = f"pendulum x{n:,}"
        blocks[label] = [(n, "rl8", s) for s in rl8_settings] + [
            (n, "rsl_rl", s) for s in ("fp32", "bf16")
        ]
    rows = [(label, run.SIDES[side], s) for label, todo in blocks.items() for _, side, s in todo]
    results: dict[tuple[str, str, str], list[dict]] = {}
    # round after round over every env count, so that a spent budget still leaves each measured
    for r in range(args.rounds):
        for label, todo in blocks.items():
            shift = r % len(todo)
            for num_envs, side, setting in todo[shift:] + todo[:shift]:
                left = args.budget - (time.monotonic() - start)
                if left < 5:
                    result = {"error": f"not measured: the time budget of {args.budget:.0f} s was spent"}
                else:
                    result = measure(side, num_envs, setting, args, timeout=min(args.timeout, left))
                results.setdefault((label, side, setting), []).append(result)
                shown = run.fmt_rate(result["steps_per_s"]) if "steps_per_s" in result else result
                print(
                    f"# round {r + 1}/{args.rounds} {label} {side} {setting}: {shown}",
                    file=sys.stderr,
                    flush=True,
                )

    import torch

    minutes = (time.monotonic() - start) / 60
    versions = {r.get("rsl-rl-lib") for runs in results.values() for r in runs if r.get("rsl-rl-lib")}
    report = [
        f"Device: {device_name(args.device)} ({args.device}); torch {torch.__version__} (CUDA {torch.version.cuda}); "
        f"rsl-rl-lib {', '.join(sorted(versions)) or 'not measured'}; rl8 commit {os.environ.get('RL8_COMMIT') or run.rl8_commit()}; "
        f"{stamp:%Y-%m-%d %H:%M} UTC; {args.rounds} round(s) of {args.warmup} warm-up + {args.iters} timed "
        f"iterations (24 steps each), {args.threads} torch CPU threads per side; {minutes:.1f} min",
        "",
        "Workload: `pendulum-4096` of benchmarks/peers/workloads.py at the env counts below. rl8 `bf16` is "
        "`enable_amp=True` (bfloat16 autocast; on CUDA GPUs older than compute capability 8.0 float16 with a "
        "gradient scaler); rsl_rl `bf16` is its "
        "`use_mixed_precision` (bfloat16). A ratio compares rl8 and rsl_rl at the same precision, eager.",
    ]
    if not compiles:
        report.append(f"rl8 compile=True (CUDA graphs): not available ({no_compile}).")
    report += ["", *run.table(rows, results, {}), "", *run.best_vs_best(rows, results)]
    if compiles:
        for n in envs:
            label = f"pendulum x{n:,}"
            mine = [
                r["steps_per_s"]
                for r in results.get((label, "rl8", "compile"), [])
                if "steps_per_s" in r
            ]
            peer = [
                statistics.median(good)
                for s in ("fp32", "bf16")
                if (
                    good := [
                        r["steps_per_s"]
                        for r in results.get((label, "rsl_rl", s), [])
                        if "steps_per_s" in r
                    ]
                )
            ]
            if mine and peer:
                report.append(
                    f"- {label}, rl8 compile (CUDA graphs) / rsl_rl at its best: "
                    f"{statistics.median(mine) / max(peer):.2f}x"
                )
    text = "\n".join(report)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
