"""Train presets over seeds; write their return curves, a results table and plots.

Run (from the repository root)::

    python -m benchmarks.learning.run CartPole-v1 Pendulum-v1 --seeds 3
    python -m benchmarks.learning.run HalfCheetah-v5 --seeds 1 --first-seed 2   # one more seed
    python -m benchmarks.learning.run --report                                  # tables, plots only
    python -m benchmarks.learning.run Pendulum-v1 --seeds 1 --set lr=3e-4 --out /tmp/sweep/lr  # a sweep variant

Each (preset, seed) is one MLflow run (experiment: the preset's name; tags ``preset`` and
``seed``) in ``--tracking-uri`` (default: rl8's, ``MLFLOW_TRACKING_URI`` else
``./mlflow.db``), and one curve file ``OUT/curves/PRESET/seed-S.csv``: after every training step the env steps, the
training wall time so far, the mean return of the training episodes that ended in the step and,
at evaluations, the deterministic evaluation's mean return. Training runs the preset's
``max_steps`` budget (its other stop conditions are not used: the curve goes to the end of the
budget), unless ``--max-steps``. The curve file is rewritten at every evaluation, so a run
stopped early leaves its curve so far.

**Resuming.** After every evaluation the run also writes a Trainer checkpoint (the last two are
kept) in ``OUT/.checkpoints/PRESET/seed-S/``, after its curve. Run the same command again and
each seed whose curve ends short of its budget continues from its latest checkpoint, through
:meth:`rl8.Trainer.from_checkpoint` (what ``rl8 train --resume`` uses), in the same MLflow run;
its curve keeps the rows up to that checkpoint and marks the first row after it (column
``resumed``), and the table says how many seeds were resumed. The training wall time adds up
across sittings; the envs start new episodes where the run resumes (gymnasium envs cannot be
saved), as with ``rl8 train --resume``. A seed whose curve reached its budget is skipped;
``--restart`` trains it again from scratch (its curve and checkpoints are replaced). A
checkpoint made with other hyper-parameters than the command's is refused, naming them.

How it is measured, the same way in ``sb3.py``:

* **Wall time**: the sum of the training steps' durations (``Trainer.step``: one collect, one
  update, its MLflow logging); building the algorithm and the envs, and the evaluations, are
  left out. SB3's: the time since ``learn`` started, its evaluations left out.
* **Evaluations**: after the first training step at or after every multiple of ``eval_every``
  env steps (the task's ``eval_every`` in ``references.py``, the same number for SB3; else the
  preset's ``steps_per_eval`` training steps), and after the last step. Each runs the
  deterministic policy on the preset's dedicated eval env (``eval_num_envs`` envs of
  ``eval_num_steps`` steps: 10 envs, one whole episode each for CartPole-v1 and Pendulum-v1),
  put back in the same first state every time. "Steps to threshold" is the env step count at
  the first evaluation at or above the threshold: an upper bound at that granularity.

The report (also copied into ``OUT/index.md`` between its two results-table markers) reads
every curve file there, rl8's and those of ``benchmarks/learning/sb3.py`` (``OUT/curves/sb3/``), so seeds run
by separate commands add up. Per preset: the final evaluation return (mean +- std over seeds),
the env steps and training wall time until the first evaluation at or above the threshold
(mean over the seeds that reached it, and how many did), written as ``results.md``,
``results.csv`` and ``results.json``, and ``plots/PRESET.png``: the mean over seeds and its
min-max range against env steps, the threshold and the published references
(``references.py``) as horizontal lines.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import platform
import statistics
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import rl8
import rl8.presets
from benchmarks.learning.references import TASKS
from rl8.io.checkpoint_dir import CheckpointManager
from rl8.ppo.hparams import changed_hparams

if TYPE_CHECKING:
    from rl8 import Trainer

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
DEFAULT_OUT = ROOT / "docs" / "results"
FIELDS = ("env_steps", "wall_s", "train_return", "eval_return", "resumed")
#: Trainer checkpoints kept per run (the latest), for resuming.
KEEP_CHECKPOINTS = 2


# --------------------------------------------------------------------------------------------
# training


def train(
    preset: str,
    seed: int,
    *,
    out: Path,
    tracking_uri: str | None,
    max_steps: int | None = None,
    threads: int = 1,
    overrides: dict[str, Any] | None = None,
    steps_per_eval: int | None = None,
    eval_every: int | None = None,
    restart: bool = False,
) -> Path:
    """Train ``preset`` with ``seed`` for its budget, or resume it; write and return its curve file.

    Args:
        preset: A name from :func:`rl8.presets.names`.
        seed: The run's ``hparams.seed`` (replaces the preset's).
        out: Results folder; the curve goes to ``out/curves/PRESET/seed-SEED.csv``, the
            checkpoints to ``out/.checkpoints/PRESET/seed-SEED/``.
        tracking_uri: MLflow tracking URI of the run (``None``: rl8's default).
        max_steps: Env steps to train (default: the preset's ``max_steps``).
        threads: ``torch.set_num_threads`` for the run.
        overrides: Hyper-parameters replacing the preset's (for sweeps: ``--set lr=3e-4``).
        steps_per_eval: Training steps between evaluations (default: ``eval_every``).
        eval_every: Env steps between evaluations (default: the task's ``eval_every`` in
            ``references.py``, else the preset's ``steps_per_eval`` training steps): evaluate
            after the first training step at or after every multiple, and after the last.
        restart: Train from scratch even where a curve or checkpoint of this seed exists
            (default: skip a seed whose curve reached the budget, resume one that stopped short).

    Raises:
        SystemExit: The seed's checkpoint was made with other hyper-parameters.
    """
    import torch

    config = rl8.presets.load(preset)
    config["hparams"] = {**config["hparams"], **(overrides or {}), "seed": seed}
    hparams = rl8.presets.hparams(config)
    budget = max_steps or int(config["max_steps"])
    if eval_every is None:
        task = TASKS.get(preset)
        if steps_per_eval is None and task is not None and task.eval_every is not None:
            eval_every = task.eval_every
        else:
            steps_per_eval = steps_per_eval or int(config.get("steps_per_eval") or 10)
            eval_every = steps_per_eval * hparams.num_envs * hparams.horizon
    torch.set_num_threads(threads)

    path = out / "curves" / preset / f"seed-{seed}.csv"
    folder = out / ".checkpoints" / preset / f"seed-{seed}"
    rows = [] if restart or not path.exists() else read_curve(path)
    if rows and rows[-1]["env_steps"] >= budget:
        print(
            f"{preset} seed {seed}: done ({rows[-1]['env_steps']:.0f} env steps in {path}); "
            "--restart trains it again",
            flush=True,
        )
        return path
    trainer = None if restart else _resume(folder, hparams.to_dict(), tracking_uri)
    if trainer is None:
        if rows:
            print(
                f"{preset} seed {seed}: no checkpoint in {folder}; training again from scratch",
                flush=True,
            )
        _remove_checkpoints(folder)
        rows = []
        algo = rl8.PPO(config["env"], **hparams.to_dict())
        trainer = rl8.Trainer(
            algo,
            tracking_uri=tracking_uri,
            experiment=preset,
            run_name=f"{preset}-seed{seed}",
            eval_num_envs=config.get("eval_num_envs"),
            eval_num_steps=config.get("eval_num_steps"),
            progress=False,
            metadata={"config": config, "preset": preset},
            checkpoint_dir=folder,
            keep_checkpoints=KEEP_CHECKPOINTS,
        )
    else:
        algo = trainer.algo
        rows = [r for r in rows if r["env_steps"] <= algo.env_steps]
        print(
            f"{preset} seed {seed}: resuming at {algo.env_steps} env steps from {trainer.last_checkpoint}",
            flush=True,
        )
    resumed = bool(rows)
    wall_s = rows[-1]["wall_s"] if rows else 0.0
    next_eval = next_eval_at(algo.env_steps, eval_every)
    try:
        while algo.env_steps < budget:
            start = time.perf_counter()
            stats = trainer.step()
            wall_s += time.perf_counter() - start
            row = {
                "env_steps": algo.env_steps,
                "wall_s": wall_s,
                "eval_return": math.nan,
                "train_return": stats.get("episodes/return_mean", math.nan),
                "resumed": float(resumed),
            }
            resumed = False
            if algo.env_steps >= next_eval or algo.env_steps >= budget:
                next_eval = next_eval_at(algo.env_steps, eval_every)
                row["eval_return"] = trainer.eval()["eval/episodes/return_mean"]
                print(
                    f"{preset} seed {seed}: {algo.env_steps} env steps, {wall_s:.0f} s, "
                    f"eval return {row['eval_return']:.1f}",
                    flush=True,
                )
            rows.append(row)
            if not math.isnan(row["eval_return"]):
                write_curve(path, rows)  # the curve first: a checkpoint never runs ahead of it
                trainer.save_checkpoint()
    finally:
        _set_tags(trainer, {"preset": preset, "seed": str(seed)})
        trainer.close()
    return path


def _resume(folder: Path, hparams: dict[str, Any], tracking_uri: str | None) -> Trainer | None:
    """The Trainer of the latest checkpoint in ``folder`` (``None`` if there is none); exits if
    it was trained with other hyper-parameters than ``hparams``."""
    if not folder.is_dir() or CheckpointManager(folder, keep_last=None).latest() is None:
        return None
    trainer = rl8.Trainer.from_checkpoint(folder, tracking_uri=tracking_uri, progress=False)
    changed = changed_hparams(trainer.algo.hparams.to_dict(), hparams)
    if changed:
        trainer.close()
        detail = ", ".join(
            f"{k}: checkpoint {saved!r}, now {now!r}" for k, (saved, now) in sorted(changed.items())
        )
        raise SystemExit(
            f"{folder}: the checkpoint was trained with other hyper-parameters ({detail}); "
            "run with the same --set values, or --restart to train again from scratch"
        )
    return trainer


def _remove_checkpoints(folder: Path) -> None:
    if folder.is_dir():
        for file in CheckpointManager(folder, keep_last=None).list():
            file.unlink()


def next_eval_at(env_steps: int, eval_every: int) -> int:
    """The env step count of the next evaluation after one at ``env_steps``: the next multiple
    of ``eval_every`` (shared with ``sb3.py``)."""
    return (env_steps // eval_every + 1) * eval_every


def _set_tags(trainer: Any, tags: dict[str, str]) -> None:
    from mlflow import MlflowClient

    trainer.flush()
    client = MlflowClient(trainer.tracker.tracking_uri)
    for key, value in tags.items():
        client.set_tag(trainer.run_id, key, value)


def write_curve(path: Path, rows: Sequence[dict[str, float]]) -> Path:
    """Write curve rows (keys :data:`FIELDS`) as CSV; return ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS)
        writer.writeheader()
        writer.writerows(rows)
    return path


def read_curve(path: Path) -> list[dict[str, float]]:
    """The rows :func:`write_curve` wrote, as floats (NaN where there was no value)."""
    with path.open() as f:
        rows = [
            {k: float(row[k]) if row.get(k) not in (None, "", "nan") else math.nan for k in FIELDS}
            for row in csv.DictReader(f)
        ]
    for row in rows:  # curves written before resuming existed, and SB3's, have no "resumed"
        row["resumed"] = 0.0 if math.isnan(row["resumed"]) else row["resumed"]
    return rows


# --------------------------------------------------------------------------------------------
# summary


def summarize(curves: Sequence[Sequence[dict[str, float]]], threshold: float) -> dict[str, Any]:
    """One results row from the curves of several seeds.

    Returns a dict: ``seeds``; ``env_steps`` (the last env step of the shortest curve);
    ``final_mean`` and ``final_std`` (over seeds, of the last evaluation return; the std is
    the population std, 0 for one seed); ``reached`` (seeds whose evaluation return reached
    ``threshold``); ``steps_to_threshold`` and ``wall_s_to_threshold`` (means over those seeds
    of the env steps and training seconds at the first such evaluation; NaN if none did);
    ``wall_s`` (mean training seconds of the whole curve); ``resumed`` (seeds resumed from a
    checkpoint at least once, with the env steps where: ``resumed_at``).
    """
    finals, steps_at, walls_at, walls, resumed_at = [], [], [], [], []
    for rows in curves:
        resumed_at.append([int(r["env_steps"]) for r in rows if r.get("resumed", 0.0) == 1.0])
        evals = [r for r in rows if not math.isnan(r["eval_return"])]
        finals.append(evals[-1]["eval_return"] if evals else math.nan)
        walls.append(rows[-1]["wall_s"])
        hit = next((r for r in evals if r["eval_return"] >= threshold), None)
        if hit is not None:
            steps_at.append(hit["env_steps"])
            walls_at.append(hit["wall_s"])
    mean = lambda xs: statistics.fmean(xs) if xs else math.nan  # noqa: E731
    return {
        "seeds": len(curves),
        "env_steps": int(min(rows[-1]["env_steps"] for rows in curves)),
        "final_mean": mean(finals),
        "final_std": statistics.pstdev(finals) if len(finals) > 1 else 0.0,
        "reached": len(steps_at),
        "steps_to_threshold": mean(steps_at),
        "wall_s_to_threshold": mean(walls_at),
        "wall_s": mean(walls),
        "resumed": sum(1 for at in resumed_at if at),
        "resumed_at": resumed_at,
    }


def _curves(folder: Path) -> list[list[dict[str, float]]]:
    return [read_curve(p) for p in sorted(folder.glob("seed-*.csv"))]


def _fmt(x: float, digits: int = 1) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:,.{digits}f}"


def _steps(x: float) -> str:
    if isinstance(x, float) and math.isnan(x):
        return "-"
    return f"{x / 1e6:.2f}M" if x >= 1e6 else f"{x / 1e3:.0f}k"


def report(out: Path) -> list[dict[str, Any]]:
    """Write ``results.md``, ``results.csv``, ``results.json`` and ``plots/*.png`` under ``out``
    from every curve file there; return the rows."""
    rows = []
    for folder in sorted(p for p in (out / "curves").glob("*") if p.is_dir() and p.name != "sb3"):
        task = TASKS[folder.name]
        curves = _curves(folder)
        if not curves:
            continue
        row = {"preset": folder.name, "threshold": task.threshold, **summarize(curves, task.threshold)}
        sb3 = _curves(out / "curves" / "sb3" / folder.name)
        if sb3:
            theirs = summarize(sb3, task.threshold)
            row.update({f"sb3_{k}": v for k, v in theirs.items()})
            row["wall_ratio"] = row["wall_s_to_threshold"] / theirs["wall_s_to_threshold"]
            if not theirs["reached"]:  # SB3 trained this long without reaching it: an upper bound
                row["wall_ratio_below"] = row["wall_s_to_threshold"] / theirs["wall_s"]
        row["references"] = {f"{r.source} ({r.note})": r.value for r in task.references}
        rows.append(row)
        plot(out / "plots" / f"{folder.name}.png", folder.name, curves, task, sb3)
    (out / "results.json").write_text(json.dumps({"machine": machine(), "rows": rows}, indent=1) + "\n")
    columns = [
        "preset",
        "threshold",
        "seeds",
        "env_steps",
        "final_mean",
        "final_std",
        "reached",
        "steps_to_threshold",
        "wall_s_to_threshold",
        "wall_s",
        "sb3_seeds",
        "sb3_final_mean",
        "sb3_wall_s",
        "sb3_wall_s_to_threshold",
        "wall_ratio",
        "wall_ratio_below",
        "resumed",
    ]
    with (out / "results.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    table = markdown_table(rows)
    (out / "results.md").write_text(table)
    _insert_table(out / "index.md", table, machine())
    return rows


BEGIN, END = (
    "<!-- results table: written by benchmarks/learning/run.py -->",
    "<!-- end of results table -->",
)


def _insert_table(page: Path, table: str, where: dict[str, str]) -> None:
    """Put ``table`` (and the machine it came from) between :data:`BEGIN` and :data:`END` in
    ``page``, when the page exists and has both markers."""
    if not page.exists():
        return
    text = page.read_text()
    if BEGIN not in text or END not in text:
        return
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    machine_line = (
        f"Report written at commit `{where['commit']}` on {where['cpu']} ({where['cores']} cores), "
        f"Python {where['python']}, torch {where['torch']}, rl8 {where['rl8']}.\n"
    )
    page.write_text(f"{head}{BEGIN}\n{table}\n{machine_line}{END}{tail}")


def markdown_table(rows: Sequence[dict[str, Any]]) -> str:
    """The results table in markdown (one line per preset)."""
    lines = [
        "| preset | threshold | seeds | env steps | final return (mean ± std) | reached | "
        "steps to threshold | wall s to threshold | wall s total | SB3 wall s to threshold | "
        "rl8 / SB3 wall time | resumed | published references |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        refs = "; ".join(f"{name}: {value:g}" for name, value in r["references"].items()) or "-"
        lines.append(
            f"| {r['preset']} | {r['threshold']:g} | {r['seeds']} | {_steps(r['env_steps'])} | "
            f"{_fmt(r['final_mean'])} ± {_fmt(r['final_std'])} | {r['reached']}/{r['seeds']} | "
            f"{_steps(r['steps_to_threshold'])} | {_fmt(r['wall_s_to_threshold'])} | {_fmt(r['wall_s'])} | "
            f"{_sb3_wall(r)} | {_ratio(r)} | "
            f"{r.get('resumed', 0)}/{r['seeds']} | {refs} |"
        )
    return "\n".join(lines) + "\n"


def _sb3_wall(row: dict[str, Any]) -> str:
    """SB3's mean wall time to the threshold, or, where no SB3 seed reached it, how long they
    trained without ("not in N")."""
    if row.get("sb3_seeds") and not row["sb3_reached"]:
        return f"not in {_fmt(row['sb3_wall_s'])}"
    return _fmt(row.get("sb3_wall_s_to_threshold", math.nan))


def _ratio(row: dict[str, Any]) -> str:
    """rl8's wall time to the threshold over SB3's, or its upper bound ("< r") where SB3 did
    not reach the threshold."""
    if not math.isnan(row.get("wall_ratio_below", math.nan)):
        return f"< {row['wall_ratio_below']:.2f}"
    return _fmt(row.get("wall_ratio", math.nan), 2)


def plot(
    path: Path,
    preset: str,
    curves: Sequence[Sequence[dict[str, float]]],
    task: Any,
    sb3: Sequence[Sequence[dict[str, float]]] = (),
) -> None:
    """PNG of the evaluation return against env steps: mean over seeds and min-max range, for
    rl8 (and SB3 when its curves are given), with the threshold and references as lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=100)
    for label, runs, color in (
        (f"rl8 ({len(curves)} seeds)", curves, "C0"),
        (f"SB3 zoo ({len(sb3)} seeds)", sb3, "C1"),
    ):
        evals = [
            [(r["env_steps"], r["eval_return"]) for r in rows if not math.isnan(r["eval_return"])]
            for rows in runs
        ]
        evals = [e for e in evals if e]
        if not evals:
            continue
        end = min(e[-1][0] for e in evals)
        grid = np.array(sorted({s for e in evals for s, _ in e if s <= end}))
        ys = np.array([np.interp(grid, [s for s, _ in e], [v for _, v in e]) for e in evals])
        ax.plot(grid, ys.mean(0), color=color, label=label)
        ax.fill_between(grid, ys.min(0), ys.max(0), color=color, alpha=0.2)
    ax.axhline(task.threshold, color="k", linestyle=":", label=f"threshold {task.threshold:g}")
    for i, ref in enumerate(task.references):
        ax.axhline(
            ref.value,
            color=f"C{i + 2}",
            linestyle="--",
            label=f"{ref.source} {ref.value:g} ({ref.note})",
        )
    ax.set_xlabel("env steps")
    ax.set_ylabel("deterministic eval return")
    ax.set_title(preset)
    ax.legend(fontsize=7, loc="best")
    ax.grid(alpha=0.3)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def machine() -> dict[str, str]:
    """Where the results come from: git commit, CPU, core count, Python, torch and rl8."""
    import os

    import torch

    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "commit": commit,
        "cpu": cpu,
        "cores": str(os.cpu_count()),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "rl8": rl8.__version__,
    }


def _assignment(text: str) -> tuple[str, Any]:
    from rl8.cli import parse_assignment

    path, value = parse_assignment(text, "--set")
    if len(path) != 1:
        raise SystemExit(
            f"--set {text}: give a whole hyper-parameter (model_config={{hiddens: [64, 64]}})"
        )
    return path[0], value


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("presets", nargs="*", help=f"preset names ({', '.join(rl8.presets.names())})")
    parser.add_argument("--seeds", type=int, default=3, help="number of seeds (default 3)")
    parser.add_argument("--first-seed", type=int, default=0, help="first seed (default 0)")
    parser.add_argument(
        "--max-steps", type=int, help="env steps per run (default: the preset's max_steps)"
    )
    parser.add_argument(
        "--out", type=Path, default=DEFAULT_OUT, help="results folder (default docs/results)"
    )
    parser.add_argument("--tracking-uri", help="MLflow tracking URI of the runs (default: rl8's)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="replace a hyper-parameter of the preset (repeatable; for sweeps, with --out)",
    )
    parser.add_argument(
        "--steps-per-eval", type=int, help="training steps between evaluations (default: --eval-every)"
    )
    parser.add_argument(
        "--eval-every",
        type=int,
        metavar="ENV_STEPS",
        help="env steps between evaluations (default: the task's eval_every in references.py, "
        "else the preset's steps_per_eval)",
    )
    parser.add_argument(
        "--restart",
        action="store_true",
        help="train again from scratch seeds whose curve or checkpoint exists (default: skip "
        "finished seeds, resume unfinished ones from their latest checkpoint)",
    )
    parser.add_argument("--report", action="store_true", help="only rebuild the tables and plots")
    args = parser.parse_args(argv)
    if args.seeds < 1:
        parser.error(f"--seeds must be >= 1, got {args.seeds}")
    for preset in args.presets:
        rl8.presets.path(preset)  # an unknown name fails before anything trains
        if preset not in TASKS:
            parser.error(f"no threshold for preset {preset!r} in benchmarks/learning/references.py")
    overrides = dict(_assignment(text) for text in args.set)
    if not args.report:
        for preset in args.presets:
            for seed in range(args.first_seed, args.first_seed + args.seeds):
                train(
                    preset,
                    seed,
                    out=args.out,
                    tracking_uri=args.tracking_uri,
                    max_steps=args.max_steps,
                    threads=args.threads,
                    overrides=overrides,
                    steps_per_eval=args.steps_per_eval,
                    eval_every=args.eval_every,
                    restart=args.restart,
                )
    print(markdown_table(report(args.out)))


if __name__ == "__main__":
    main()
