"""rl8 against its peers (rsl_rl, SB3, a CleanRL-style loop, TorchRL), side by side, in one run.

Env steps per second of collect + update (one training iteration, warm-up iterations left out)
on the same workloads (``workloads.py``), each side in a fresh process of its own, the sides
taking turns round after round (starting with a different one each round) so that load from
other processes falls on all alike; the table gives the median over rounds and, for each peer,
the ratio rl8 / peer (> 1: rl8 is faster) with the range of the per-round ratios.

The peers live in virtualenvs of their own, made on first use under ``$RL8_PEERS_VENVS``
(default ``/tmp/rl8-peers``): ``torch==2.13.0`` first (the same torch as rl8's side), then
the peer from PyPI; never rl8 dependencies. A peer that fails to install gives rows that say
``not installed: <reason>``. rl8 and the CleanRL-style loop run in this Python (rl8's own
environment), with this checkout first on ``PYTHONPATH``; rsl_rl's venv also gets the
checkout on ``PYTHONPATH`` (its env is ``rl8.envs.Pendulum``) and rl8.envs' own needs
(tensordict, gymnasium, numpy) installed into it.

Usage (from the repository root)::

    python benchmarks/peers/run.py                # the full table: 3 rounds, 15 minutes on 2 busy cores
    python benchmarks/peers/run.py --quick        # a try: 1 round, fewer iterations
    python benchmarks/peers/run.py --workload CartPole-v1 --side rl8 --side sb3 --rounds 5
    python benchmarks/peers/run.py --workload mjlab-cartpole --rounds 3 --threads 1

The ``mjlab`` workloads (``mjlab_workload.py``) run rl8 and rsl_rl in one virtualenv, ``mjlab``
(``torch==2.13.0``, then mjlab and rl8's dependencies; rl8 from this checkout), on warp's CPU
device; each round trains one seed (0, 1, 2...) until the return reaches the workload's target,
and a second table gives the env steps and wall seconds each run took to reach it.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(HERE))

from workloads import WORKLOADS  # noqa: E402

TORCH = "torch==2.13.0"


@dataclass(frozen=True)
class Venv:
    """A peer's virtualenv: its folder name under the venvs folder, the packages installed
    after torch, a module whose import proves the install, the torch it pins (installed first)
    and the Python that makes it (``None``: this one)."""

    name: str
    packages: tuple[str, ...]
    module: str
    torch: str = TORCH
    python: str | None = None


@dataclass(frozen=True)
class Side:
    """One implementation measured: its script in this folder, the virtualenv it runs in
    (``None``: this Python), its settings per workload kind, and whether it imports rl8."""

    name: str
    script: str
    venv: Venv | None
    settings: dict[str, tuple[str, ...]] = field(default_factory=dict)
    workloads: tuple[str, ...] | None = None  # None: every workload of its kinds
    needs_rl8: bool = False


#: The workloads of kind ``mjlab`` run both sides in this venv: mjlab (it pins mujoco 3.11 and
#: rsl-rl-lib) and rl8's own dependencies, so that rl8's side imports the checkout.
MJLAB_VENV = Venv(
    "mjlab",
    (
        "mjlab",
        "tensordict>=0.15,<0.16",
        "mlflow-skinny>=3.0",
        "sqlalchemy>=1.4,<3",
        "alembic>=1.0,<2",
        "gymnasium>=1.0",
        "pyyaml>=6.0",
    ),
    "mjlab",
)

SIDES = {
    "rl8": Side(
        "rl8",
        "side_rl8.py",
        None,
        {
            "batched": ("fp32", "bf16", "symmetry", "rnd"),
            "gym": ("fp32",),
            "mjlab": ("auto-reset", "partial-reset"),
        },
        needs_rl8=True,
    ),
    "rsl_rl": Side(
        "rsl_rl",
        "side_rsl_rl.py",
        Venv("rsl_rl", ("rsl-rl-lib", "tensordict>=0.15,<0.16", "gymnasium>=1.0", "numpy"), "rsl_rl"),
        {"batched": ("fp32", "bf16", "symmetry", "rnd"), "mjlab": ("auto-reset",)},
        needs_rl8=True,
    ),
    "sb3": Side(
        "sb3",
        "side_sb3.py",
        Venv("sb3", ("stable-baselines3", "gymnasium[mujoco]>=1.0"), "stable_baselines3"),
        {"gym": ("fp32",)},
    ),
    "cleanrl": Side("cleanrl", "cleanrl_ppo.py", None, {"gym": ("fp32",)}),
    "torchrl": Side(
        "torchrl",
        "side_torchrl.py",
        Venv("torchrl", ("torchrl", "gymnasium>=1.0"), "torchrl"),
        {"gym": ("fp32",)},
        workloads=("CartPole-v1",),
    ),
}


def venvs_dir() -> Path:
    """Where the peers' virtualenvs live: ``$RL8_PEERS_VENVS`` or ``/tmp/rl8-peers``."""
    return Path(os.environ.get("RL8_PEERS_VENVS", "/tmp/rl8-peers"))


def ensure_venv(venv: Venv, log) -> tuple[Path | None, str]:
    """The Python of ``venv``, made (its torch first, then the packages) if it is not there
    yet; ``(None, reason)`` when it cannot be made."""
    path = venvs_dir() / venv.name
    python = path / "bin" / "python"
    marker = path / "rl8-peers-installed.txt"
    wanted = "\n".join((venv.torch, *venv.packages))
    if marker.is_file() and marker.read_text() == wanted:
        return python, ""
    log(f"making the virtualenv {path} ({', '.join(venv.packages)}); this takes minutes once")
    path.parent.mkdir(parents=True, exist_ok=True)
    steps = [
        [venv.python or sys.executable, "-m", "venv", str(path)],
        [str(python), "-m", "pip", "install", "-q", venv.torch],
        # torch pinned again so that no package moves it
        [str(python), "-m", "pip", "install", "-q", venv.torch, *venv.packages],
        [str(python), "-c", f"import {venv.module}"],
    ]
    for cmd in steps:
        try:
            out = subprocess.run(cmd, capture_output=True, text=True, check=False)
        except FileNotFoundError:
            return None, f"{cmd[0]} not found"
        if out.returncode != 0:
            lines = [
                ln
                for ln in (out.stderr + out.stdout).splitlines()
                if ln.strip() and not ln.startswith("WARNING")
            ]
            errors = (
                [ln for ln in lines if "ERROR" in ln or "Error" in ln]
                or lines
                or ["exit status " + str(out.returncode)]
            )
            return None, errors[-1].strip()[:200]
    marker.write_text(wanted)
    return python, ""


def pip_version(python: Path, package: str) -> str:
    """The installed version of ``package`` in the Python ``python`` (``"?"`` if unknown)."""
    code = f"import importlib.metadata as m; print(m.version({package!r}))"
    out = subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=False)
    return out.stdout.strip() or "?"


def measure(
    python: Path, side: Side, workload: str, setting: str, args: argparse.Namespace, seed: int = 0
) -> dict:
    """One measurement in a fresh process: the side's JSON line (``steps_per_s``...), or
    ``{"error": ...}`` / ``{"unavailable": ...}``. ``seed``: the run's seed (the mjlab workloads
    train one seed per round)."""
    cmd = [
        str(python),
        str(HERE / side.script),
        workload,
        "--threads",
        str(args.threads),
        "--setting",
        setting,
    ]
    if args.quick:
        cmd.append("--quick")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["OMP_NUM_THREADS"] = str(args.threads)
    if side.needs_rl8:
        env["PYTHONPATH"] = str(ROOT)
    if WORKLOADS[workload]["kind"] == "mjlab":
        cmd += ["--seed", str(seed)]
        env["CUDA_VISIBLE_DEVICES"] = ""  # warp on its CPU device
    result = run_side(cmd, env, max(args.timeout, WORKLOADS[workload].get("timeout", 0)))
    if side.needs_rl8 and "rl8_file" in result and not result["rl8_file"].startswith(str(ROOT / "rl8")):
        return {"error": f"imported rl8 from {result['rl8_file']}, not from {ROOT}"}
    return result


def run_side(cmd: list[str], env: dict[str, str], timeout: float) -> dict:
    """Run one side's command in a fresh temporary folder (its own MLflow store) and return its
    last stdout line as JSON, or ``{"error": ...}`` naming the timeout or the last stderr line.

    Args:
        cmd: The side's command line.
        env: Its environment variables.
        timeout: Seconds it may run.
    """
    with tempfile.TemporaryDirectory(prefix="rl8-peers-") as tmp:
        env = {**env, "MLFLOW_TRACKING_URI": f"file://{tmp}/mlruns"}
        try:
            out = subprocess.run(
                cmd, cwd=tmp, env=env, capture_output=True, text=True, timeout=timeout, check=False
            )
        except subprocess.TimeoutExpired:
            return {"error": f"timed out after {timeout:.0f} s"}
    lines = out.stdout.strip().splitlines()
    if out.returncode != 0 or not lines:
        err = [ln for ln in out.stderr.strip().splitlines() if ln.strip()] or ["no output"]
        return {"error": f"exit {out.returncode}: {err[-1][:200]}"}
    return json.loads(lines[-1])


def rl8_commit() -> str:
    """The checkout's commit (short), with ``+changes`` when the work tree differs from it."""

    def git(*a: str) -> str:
        out = subprocess.run(["git", "-C", str(ROOT), *a], capture_output=True, text=True, check=False)
        return out.stdout.strip()

    commit = git("rev-parse", "--short", "HEAD") or "unknown"
    return commit + ("+changes" if git("status", "--porcelain", "--untracked-files=no") else "")


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else ``platform.processor()``."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def plan(args: argparse.Namespace, rl8_compiles: bool) -> list[tuple[str, Side, str]]:
    """The (workload, side, setting) measurements of this run, in workload order."""
    rows = []
    for workload in args.workload or list(WORKLOADS):
        kind = WORKLOADS[workload]["kind"]
        for name in [n for n in SIDES if not args.side or n in args.side]:
            side = SIDES[name]
            if side.workloads is not None and workload not in side.workloads:
                continue
            settings = list(side.settings.get(kind, ()))
            if name == "rl8" and rl8_compiles and kind != "mjlab":
                settings += ["compile", "compile-bf16"] if kind == "batched" else ["compile"]
            rows += [(workload, side, s) for s in settings]
    return rows


def rl8_has_compile() -> bool:
    """Whether the checkout's ``HParams`` has a ``compile`` field (asked in a fresh process)."""
    code = (
        "import dataclasses, rl8; print('compile' in {f.name for f in dataclasses.fields(rl8.HParams)})"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False
    )
    return out.stdout.strip() == "True"


def reference_setting(setting: str) -> str:
    """The rl8 setting a peer's setting is compared with: the same precision, eager (the mjlab
    workloads: the same reset mode; ``symmetry``, ``rnd``: the same extension)."""
    if setting.endswith("-reset") or setting in ("symmetry", "rnd"):
        return setting
    return "bf16" if setting.endswith("bf16") else "fp32"


def fmt_rate(x: float) -> str:
    return f"{x:,.0f}"


def table(rows: list[tuple[str, Side, str]], results: dict, notes: dict) -> list[str]:
    """The Markdown table of the run: one line per (workload, side, setting)."""
    out = [
        "| workload | side | setting | env steps/s | rl8 / this | per-round range |",
        "|---|---|---|---:|---:|---|",
    ]
    for workload, side, setting in rows:
        key = (workload, side.name, setting)
        runs = results.get(key, [])
        good = [r["steps_per_s"] for r in runs if "steps_per_s" in r]
        if key in notes:
            out.append(f"| {workload} | {side.name} | {setting} | {notes[key]} | | |")
            continue
        if not good:
            why = next((r.get("unavailable") or r.get("error") for r in runs), "not measured")
            label = "n/a" if any("unavailable" in r for r in runs) else "failed"
            out.append(f"| {workload} | {side.name} | {setting} | {label}: {why} | | |")
            continue
        median = statistics.median(good)
        ratio = rng = ""
        if side.name != "rl8":
            ref = results.get((workload, "rl8", reference_setting(setting)), [])
            pairs = [
                (a["steps_per_s"], b["steps_per_s"])
                for a, b in zip(ref, runs)
                if "steps_per_s" in a and "steps_per_s" in b
            ]
            if pairs:
                ref_median = statistics.median(a for a, _ in pairs)
                ratio = f"{ref_median / median:.2f}x"
                per_round = [a / b for a, b in pairs]
                rng = f"{min(per_round):.2f}-{max(per_round):.2f}"
        else:
            rng = f"{fmt_rate(min(good))}-{fmt_rate(max(good))}"
        out.append(f"| {workload} | {side.name} | {setting} | {fmt_rate(median)} | {ratio} | {rng} |")
    return out


def learning_table(rows: list[tuple[str, Side, str]], results: dict) -> list[str]:
    """The Markdown table of the runs that trained to a target return (the mjlab workloads):
    one line per run (side, setting, seed)."""
    out = [
        "| workload | side | setting | seed | env steps to return | wall s to return | final return | env steps/s |",
        "|---|---|---|---:|---:|---:|---:|---:|",
    ]
    for workload, side, setting in rows:
        for r in results.get((workload, side.name, setting), []):
            if "target" not in r:
                continue
            steps = (
                f"{r['env_steps_to_target']:,}"
                if r["env_steps_to_target"]
                else f"not in {r['iterations']} iterations{' (--quick: no target)' if r['iterations'] < 10 else ''}"
            )
            wall = f"{r['seconds_to_target']:.0f}" if r["seconds_to_target"] else ""
            out.append(
                f"| {workload} (return {r['target']:g}) | {side.name} | {setting} | {r['seed']} | {steps} | "
                f"{wall} | {r['final_return']:.1f} | {fmt_rate(r['steps_per_s'])} |"
            )
    return out if len(out) > 2 else []


def best_vs_best(rows: list[tuple[str, Side, str]], results: dict) -> list[str]:
    """For each workload: rl8's best setting against each peer's best, as lines of text."""
    lines = []
    medians: dict[tuple[str, str], list[tuple[float, str]]] = {}
    for workload, side, setting in rows:
        good = [
            r["steps_per_s"]
            for r in results.get((workload, side.name, setting), [])
            if "steps_per_s" in r
        ]
        if good:
            medians.setdefault((workload, side.name), []).append((statistics.median(good), setting))
    for workload in dict.fromkeys(w for w, _, _ in rows):
        if (workload, "rl8") not in medians:
            continue
        best, best_setting = max(medians[(workload, "rl8")])
        for (w, name), values in medians.items():
            if w == workload and name != "rl8" and len(values) + len(medians[(workload, "rl8")]) > 2:
                peer, peer_setting = max(values)
                lines.append(
                    f"- {workload}, each at its best: rl8 {best_setting} {fmt_rate(best)} / "
                    f"{name} {peer_setting} {fmt_rate(peer)} = {best / peer:.2f}x"
                )
    return lines


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print its Markdown report (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="1 round (unless --rounds), fewer iterations"
    )
    parser.add_argument("--threads", type=int, default=2, help="torch threads of every side (default 2)")
    parser.add_argument(
        "--rounds", type=int, help="measurements per side and setting (default 3; 1 with --quick)"
    )
    parser.add_argument(
        "--workload", action="append", choices=list(WORKLOADS), help="repeatable; default: all"
    )
    parser.add_argument("--side", action="append", choices=list(SIDES), help="repeatable; default: all")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds one measurement may take")
    parser.add_argument("--json", type=Path, help="also write every measurement to this JSON file")
    args = parser.parse_args(argv)
    rounds = args.rounds or (1 if args.quick else 3)
    if rounds < 1 or args.threads < 1:
        parser.error(f"--rounds and --threads must be >= 1, got {rounds} and {args.threads}")

    def log(msg: str) -> None:
        print(f"# {msg}", file=sys.stderr, flush=True)

    start = datetime.datetime.now()
    compiles = rl8_has_compile()
    rows = plan(args, compiles)
    pythons: dict = {}  # side name (or (workload, side name) for the mjlab workloads) -> its Python
    notes: dict[tuple[str, str, str], str] = {}
    versions: dict[str, str] = {}
    gym_rows = [r for r in rows if WORKLOADS[r[0]]["kind"] != "mjlab"]
    for side in (SIDES[name] for name in dict.fromkeys(side.name for _, side, _ in gym_rows)):
        if side.venv is None:
            pythons[side.name] = Path(sys.executable)
            continue
        python, reason = ensure_venv(side.venv, log)
        if python is None:
            for w, s, setting in gym_rows:
                if s.name == side.name:
                    notes[(w, s.name, setting)] = f"not installed: {reason}"
            continue
        pythons[side.name] = python
        dist = side.venv.packages[0]
        versions[side.name] = f"{dist} {pip_version(python, dist)}"
    if any(WORKLOADS[w]["kind"] == "mjlab" for w, _, _ in rows):
        python, reason = ensure_venv(MJLAB_VENV, log)
        for w, s, setting in rows:
            if WORKLOADS[w]["kind"] == "mjlab":
                if python is None:
                    notes[(w, s.name, setting)] = f"not installed: {reason}"
                else:
                    pythons[(w, s.name)] = python
        if python is not None:
            versions["mjlab"] = (
                f"mjlab {pip_version(python, 'mjlab')} (rsl-rl-lib {pip_version(python, 'rsl-rl-lib')})"
            )
    runnable = [
        r
        for r in rows
        if (r[0], r[1].name) in pythons or (WORKLOADS[r[0]]["kind"] != "mjlab" and r[1].name in pythons)
    ]
    results: dict[tuple[str, str, str], list[dict]] = {}
    for workload in dict.fromkeys(w for w, _, _ in runnable):
        todo = [r for r in runnable if r[0] == workload]
        for r in range(rounds):
            shift = r % len(todo)
            for w, side, setting in todo[shift:] + todo[:shift]:
                result = measure(
                    pythons.get((w, side.name)) or pythons[side.name], side, w, setting, args, seed=r
                )
                results.setdefault((w, side.name, setting), []).append(result)
                shown = fmt_rate(result["steps_per_s"]) if "steps_per_s" in result else result
                if "target" in result:
                    shown = (
                        f"{shown} env steps/s; return {result['final_return']:.1f}, {result['target']:g} reached "
                        f"at {result['env_steps_to_target']} env steps, {result['seconds_to_target']} s"
                    )
                log(f"round {r + 1}/{rounds} {w} {side.name} {setting}: {shown}")
                if result.get("torch_threads", args.threads) != args.threads:
                    log(f"warning: {side.name} ran with {result['torch_threads']} torch threads")
    minutes = (datetime.datetime.now() - start).total_seconds() / 60
    import torch

    print(
        f"Machine: {cpu_model()}, {os.cpu_count()} cores; torch {torch.__version__} on every side, "
        f"torch threads: {args.threads} per side; rl8 commit {rl8_commit()}; {start:%Y-%m-%d %H:%M}; "
        f"{rounds} round(s){' (--quick)' if args.quick else ''}; {minutes:.1f} min"
    )
    if versions:
        print("Peers: " + "; ".join(versions.values()))
    if not compiles:
        print("rl8 compile=True: not measured (this rl8 has no compile hyper-parameter)")
    print()
    print("\n".join(table(rows, results, notes)))
    print()
    learned = learning_table(rows, results)
    if learned:
        print("\n".join(learned))
        print()
    print("\n".join(best_vs_best(rows, results)))
    if args.json:
        args.json.write_text(
            json.dumps(
                [
                    {"workload": w, "side": s, "setting": st, "runs": runs}
                    for (w, s, st), runs in results.items()
                ],
                indent=1,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
