"""What ``benchmarks/sims/genesis.py`` and ``benchmarks/sims/maniskill.py`` share: the virtualenvs, the two training loops (rl8's
``PPO`` and rsl_rl's ``OnPolicyRunner``, one seed each, for the same env-step budget), the
alternating run of both in fresh processes, and the Markdown table.

Each simulator's script is both the orchestrator (run with this checkout's Python: it makes
the simulator's venv with ``benchmarks/peers/run.py``'s ``ensure_venv``, then runs the sides)
and, with ``--side``, one side's training run inside that venv (this checkout on
``PYTHONPATH``), which prints one JSON line. The sides take turns seed by seed, starting with
a different one each seed, so that load from other processes falls on both alike.

What is measured, per run: env steps per second of whole iterations (collect + update, the
first ``WARMUP`` iterations left out), and the mean return of the last 100 episodes that
ended when the budget is spent (rsl_rl's "Mean reward"; :class:`ReturnTracker` of
``benchmarks/peers/mjlab_workload.py``, fed the same way on both sides).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "benchmarks" / "peers"))

from mjlab_workload import Progress, ReturnTracker, rl8_iteration  # noqa: E402
from run import Venv, cpu_model, ensure_venv, pip_version, rl8_commit, run_side  # noqa: E402

#: rl8's own dependencies (pyproject.toml), so that rl8's side imports this checkout.
RL8_DEPS = (
    "tensordict>=0.15,<0.16",
    "mlflow-skinny==3.17.2",
    "sqlalchemy>=1.4,<3",
    "alembic>=1.0,<2",
    "gymnasium>=1.0",
    "numpy>=1.26",
    "pyyaml>=6.0",
)
SIDES = ("rl8", "rsl_rl")
#: Iterations left out of the env steps per second (first touches, lazy compiles).
WARMUP = 2


def side_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line of one side's run: ``--side``, ``--seed``, ``--env-steps`` (the budget),
    ``--num-envs``, ``--threads`` (torch threads)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--side", choices=SIDES, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--env-steps", type=int, required=True)
    parser.add_argument("--num-envs", type=int, required=True)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    return args


def train_rl8(env, hparams: dict, env_steps: int) -> dict:
    """Train ``PPO(env, **hparams)`` for at least ``env_steps`` env steps; the figures of
    :class:`Progress` (env steps/s after the warm-up, the final mean return)."""
    import rl8
    from rl8 import PPO

    algo = PPO(env, **hparams)
    tracker = ReturnTracker(env.num_envs)
    batch = env.num_envs * algo.hparams.horizon
    progress = Progress(batch, float("inf"), WARMUP)
    while progress.iterations * batch < env_steps:
        progress.iteration(rl8_iteration(algo, tracker), tracker.mean())
    log = env.pop_log() if hasattr(env, "pop_log") else {}
    algo.close()
    return {
        **progress.result(tracker.mean()),
        "env_log": log,
        "rl8": rl8.__version__,
        "rl8_file": rl8.__file__,
    }


class _Stop(Exception):
    """Raised from the runner's logging hook when the budget is spent."""


def train_rsl_rl(vec_env, train_cfg: dict, env_steps: int, init_at_random_ep_len: bool) -> dict:
    """Train rsl_rl's ``OnPolicyRunner(vec_env, train_cfg)`` (no log folder) for at least
    ``env_steps`` env steps, timing each iteration from the ``collect_time`` and
    ``learn_time`` it logs; the figures of :class:`Progress`."""
    import importlib.metadata

    from rsl_rl.runners import OnPolicyRunner

    tracker = ReturnTracker(vec_env.num_envs)
    step = vec_env.step

    def tapped_step(actions):
        out = step(actions)
        tracker.add(out[1], out[2])
        return out

    vec_env.step = tapped_step
    runner = OnPolicyRunner(vec_env, train_cfg, log_dir=None, device=str(vec_env.device))
    batch = vec_env.num_envs * train_cfg["num_steps_per_env"]
    progress = Progress(batch, float("inf"), WARMUP)
    budget = -(-env_steps // batch)
    log = runner.logger.log

    def log_and_check(**kw) -> None:
        log(**kw)
        progress.iteration(kw["collect_time"] + kw["learn_time"], tracker.mean())
        if progress.iterations >= budget:
            raise _Stop

    runner.logger.log = log_and_check
    try:
        runner.learn(num_learning_iterations=budget, init_at_random_ep_len=init_at_random_ep_len)
    except _Stop:
        pass
    return {**progress.result(tracker.mean()), "rsl-rl-lib": importlib.metadata.version("rsl-rl-lib")}


def emit(result: dict, **extra: object) -> None:
    """Print a side's result as its one JSON line (the curve of returns left out)."""
    result = {k: v for k, v in result.items() if k not in ("returns", "target")}
    print(json.dumps({**result, **extra}))


def main(
    script: Path,
    side_main: Callable[[list[str]], None],
    venv: Venv,
    package: str,
    argv: list[str] | None,
    describe: Callable[[argparse.Namespace], str],
    defaults: dict,
) -> int:
    """A simulator script's ``main``: with ``--side`` in ``argv`` (one side's run, in the venv),
    ``side_main(argv)``; else both sides of ``script`` in ``venv``, seed by seed, alternating,
    then the Markdown report (:func:`compare`). Returns the exit status.

    Args:
        script: The simulator's script (run again with ``--side`` for each run).
        side_main: Its one-side run, given the command line.
        venv: The simulator's virtualenv.
        package: The simulator's distribution, whose version the report names.
        argv: The command line (``None``: ``sys.argv[1:]``).
        describe: The task's line of the report, given the parsed arguments.
        defaults: The defaults of ``--env-steps``, ``--num-envs`` and ``--seeds``.
    """
    argv = sys.argv[1:] if argv is None else argv
    if "--side" in argv:
        side_main(argv)
        return 0
    return compare(script, venv, package, argv, describe, defaults)


def compare(
    script: Path,
    venv: Venv,
    package: str,
    argv: list[str],
    describe: Callable[[argparse.Namespace], str],
    defaults: dict,
) -> int:
    """Run both sides of ``script`` (``--side`` mode) in ``venv``, seed by seed, alternating,
    and print the Markdown report; the arguments are :func:`main`'s."""
    parser = argparse.ArgumentParser(description=(script.read_text().split('"""')[1].splitlines()[0]))
    parser.add_argument("--env-steps", type=int, default=defaults["env_steps"], help="budget per run")
    parser.add_argument("--num-envs", type=int, default=defaults["num_envs"])
    parser.add_argument("--seeds", type=int, default=defaults["seeds"], help="seeds 0..N-1, both sides")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads of every run (default 1: on 2 busy cores, 2 threads oversubscribe)",
    )
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds one run may take")
    parser.add_argument("--json", type=Path, help="also write every run's JSON line to this file")
    args = parser.parse_args(argv)

    def log(msg: str) -> None:
        print(f"# {msg}", file=sys.stderr, flush=True)

    python, why = ensure_venv(venv, log)
    if python is None:
        print(f"the virtualenv {venv.name} could not be made: {why}")
        return 1
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PYTHONPATH=str(ROOT), OMP_NUM_THREADS=str(args.threads))
    results: dict[str, list[dict]] = {side: [] for side in SIDES}
    started = datetime.datetime.now()
    for seed in range(args.seeds):
        for side in SIDES if seed % 2 == 0 else SIDES[::-1]:
            log(f"seed {seed}: {side}")
            cmd = [str(python), str(script), "--side", side, "--seed", str(seed)]
            cmd += ["--env-steps", str(args.env_steps), "--num-envs", str(args.num_envs)]
            cmd += ["--threads", str(args.threads)]
            result = run_side(cmd, env, args.timeout)
            if "rl8_file" in result and not result["rl8_file"].startswith(str(ROOT / "rl8")):
                result = {"error": f"imported rl8 from {result['rl8_file']}, not from {ROOT}"}
            results[side].append({"seed": seed, **result})
            log(json.dumps(result)[:300])
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    print(
        f"{describe(args)}; {args.env_steps:,} env steps per run, {args.seeds} seed(s), torch threads "
        f"{args.threads}; {package} {pip_version(python, package)}, rsl-rl-lib "
        f"{pip_version(python, 'rsl-rl-lib')}, torch {pip_version(python, 'torch')}, rl8 {rl8_commit()}; "
        f"{cpu_model()}, {os.cpu_count()} cores, Python {platform.python_version()}; "
        f"{started:%Y-%m-%d %H:%M}, {(datetime.datetime.now() - started).total_seconds() / 60:.0f} min"
    )
    print()
    print(table(results))
    return 0


def table(results: dict[str, list[dict]]) -> str:
    """The Markdown table: per side, env steps/s of whole iterations (median over seeds, with
    the per-seed values) and the mean return after the budget (mean over seeds, per seed); then
    the ratio rl8 / rsl_rl."""
    lines = [
        "| side | env steps/s (median) | per seed | mean return after the budget (mean) | per seed |",
        "|---|---:|---|---:|---|",
    ]
    medians = {}
    for side in SIDES:
        good = [r for r in results[side] if "steps_per_s" in r]
        if not good:
            why = next((r.get("error") for r in results[side]), "not run")
            lines.append(f"| {side} | failed: {why} | | | |")
            continue
        rates = [r["steps_per_s"] for r in good]
        returns = [r["final_return"] for r in good]
        medians[side] = statistics.median(rates)
        lines.append(
            f"| {side} | {medians[side]:,.0f} | {', '.join(f'{x:,.0f}' for x in rates)} | "
            f"{statistics.mean(returns):.2f} | {', '.join(f'{x:.2f}' for x in returns)} |"
        )
    if len(medians) == 2:
        lines.append("")
        lines.append(f"rl8 / rsl_rl, env steps/s: {medians['rl8'] / medians['rsl_rl']:.2f}x")
    return "\n".join(lines)
