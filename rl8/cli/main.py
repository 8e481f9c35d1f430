"""The ``rl8`` command's parser and entry point (see ``docs/cli.md``): mistakes in what was
given exit with status 2, other known failures (tracking server down, missing or refused
checkpoint) with 1, each as one line (``--debug`` or ``RL8_DEBUG=1``: after its traceback)."""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import Any

from rl8.cli import evaluate as evaluate_command
from rl8.cli import export as export_command
from rl8.cli import record as record_command
from rl8.cli import runs as runs_command
from rl8.cli import sweep as sweep_command
from rl8.cli import train as train_command
from rl8.fields import read_numbers
from rl8.training.config import TrainerConfig
from rl8.training.config_file import CONFIG_KEYS, ConfigError
from rl8.verbosity import apply_verbosity

__all__ = ["build_parser", "main"]

#: The environment variable that shows the traceback of an error (any value but "" and "0"), as
#: ``--debug`` does.
DEBUG_ENV = "RL8_DEBUG"
_DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_TRUST_CODE_HELP = (
    "trust the {what}: import the modules it names that rl8's registry lacks, and call a plain "
    "function it names as env factory (off by default; see docs/security.md)"
)


def _arg_type(
    read: Callable[[str], Any], ok: Callable[[Any], bool], expected: str
) -> Callable[[str], Any]:
    """An argparse ``type``: ``read(text)`` if ``ok`` accepts it, else an error naming ``expected``."""

    def convert(text: str) -> Any:
        try:
            value = read(text)
        except ValueError:
            value = None
        if value is None or not ok(value):
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
        return value

    return convert


def _seconds(text: str) -> float:
    """Seconds from ``90``, ``90s``, ``30m``, ``12h`` or ``2d``."""
    unit = text[-1:].lower()
    return float(text[:-1]) * _DURATION_UNITS[unit] if unit in _DURATION_UNITS else float(text)


_duration = _arg_type(
    _seconds,
    lambda value: 0 <= value < math.inf,
    "a duration >= 0 (seconds, or with a unit: 30m, 12h, 2d)",
)
_positive_float = _arg_type(float, lambda value: 0 < value < math.inf, "a number > 0")
_positive_int = _arg_type(
    lambda text: read_numbers(text, whole_as_int=True),
    lambda value: isinstance(value, int) and value >= 1,
    "an int >= 1",
)


def _option_flag(name: str) -> Any:
    """The ``type`` of Trainer option ``name``'s flag (:meth:`TrainerConfig.read_option`)."""

    def read(text: str) -> Any:
        try:
            return TrainerConfig.read_option(name, text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    read.__name__ = name
    return read


def _add_policy_run_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of ``rl8 eval`` and ``rl8 record``: which policy, in which env, how."""
    parser.add_argument("policy", metavar="PATH_OR_RUN_ID")
    parser.add_argument("--env", help="env to run in (default: the one the policy was trained on)")
    parser.add_argument(
        "--model-cls",
        metavar="MODULE.CLASS",
        help="the policy's model class, imported (for one stored as __main__.Net)",
    )
    parser.add_argument(
        "--env-config", action="append", metavar="KEY=VALUE", help="env parameter (repeatable)"
    )
    parser.add_argument(
        "--stochastic", action="store_true", help="sample actions instead of taking the modes"
    )
    parser.add_argument("--seed", type=int, help="seed of the env's reset and of sampling")
    parser.add_argument("--tracking-uri", help="MLflow tracking URI, for a run id")
    parser.add_argument("--trust-code", action="store_true", help=_TRUST_CODE_HELP.format(what="file"))


def build_parser() -> argparse.ArgumentParser:
    """The ``rl8`` argument parser."""
    from rl8.version import __version__

    parser = argparse.ArgumentParser(
        prog="rl8", description="Fast PPO for batched environments: train, resume, evaluate."
    )
    parser.add_argument("--version", action="version", version=f"rl8 {__version__}")
    debug_help = f"on an error, show its traceback before its one line (as {DEBUG_ENV}=1)"
    parser.add_argument("--debug", action="store_true", help=debug_help)
    # every command takes it too (rl8 train x.yaml --debug); SUPPRESS keeps rl8 --debug's value
    debug = argparse.ArgumentParser(add_help=False)
    debug.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=debug_help)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    # the commands that build envs or download
    verbosity = argparse.ArgumentParser(add_help=False, parents=[debug])
    verbosity.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="also show other libraries' routine output: warp's kernel cache lines, MLflow's "
        "artifact progress bars (as RL8_VERBOSE=1)",
    )

    train = commands.add_parser(
        "train",
        parents=[verbosity],
        help="train a policy (from a YAML config and/or flags)",
        description="Train with PPO. Flags override the config file. See docs/cli.md.",
    )
    train.add_argument(
        "config",
        nargs="?",
        help="YAML config file, or a preset: NAME or preset:NAME "
        "(rl8.presets.names()) (keys: " + ", ".join(CONFIG_KEYS) + ")",
    )
    train.add_argument(
        "--env", help="env: dotted path (rl8.envs.CartPole) or gymnasium id (CartPole-v1)"
    )
    train.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE",
        help="set a hyper-parameter (repeatable), e.g. --set lr=3e-4 --set model_config.hiddens=[32,32]",
    )
    train.add_argument(
        "--max-steps",
        "--max-env-steps",
        dest="max_steps",
        type=_positive_int,
        metavar="N",
        help="stop after N env steps (Trainer.run(max_env_steps=N))",
    )
    train.add_argument(
        "--task-hparams",
        action="store_true",
        help="start from the hyper-parameters the named task's simulator registers for it "
        "(--env mjlab:... or isaaclab:...: its rsl_rl runner config, through "
        "rl8.presets.from_rsl_rl); the config file's hparams and --set override them",
    )
    train.add_argument(
        "--no-stop-conditions",
        action="store_true",
        help="leave out the config's (a preset's: solved) stop_conditions and train on to max_steps",
    )
    train.add_argument(
        "--steps-per-eval", type=_positive_int, metavar="N", help="evaluate every N training steps"
    )
    train.add_argument(
        "--resume",
        metavar="PATH_OR_RUN_ID",
        help="continue from a checkpoint file, a checkpoint folder (latest) or an MLflow run id",
    )
    for field in dataclasses.fields(TrainerConfig):  # the options marked cli="flag"
        if field.metadata["cli"] == "flag":
            number = str(field.type).startswith(("int", "float"))
            aliases = (
                ["--register"] if field.name == "register_as" else []
            )  # the name rl-zoo users look for
            train.add_argument(
                "--" + field.name.replace("_", "-"),
                *aliases,
                type=_option_flag(field.name),
                metavar="N" if number else None,
                help=field.metadata["doc"],
            )
    train.add_argument(
        "--model-cls",
        metavar="MODULE.CLASS",
        help="with --resume: the model class, imported (for one stored as __main__.Net)",
    )
    train.add_argument("-f", "--file", dest="old_file", help=argparse.SUPPRESS)  # rl8 1.0's: a hint
    train.add_argument("--quiet", action="store_true", help="no progress line")
    train.add_argument(
        "--trust-code",
        action="store_true",
        help="with --resume: " + _TRUST_CODE_HELP.format(what="checkpoint"),
    )
    train.set_defaults(func=train_command.run)

    evaluate = commands.add_parser(
        "eval",
        parents=[verbosity],
        help="run a saved policy and print episode returns",
        description="Run a policy from a policy file, a checkpoint (file or folder) or an MLflow run.",
    )
    _add_policy_run_arguments(evaluate)
    evaluate.add_argument(
        "--episodes", type=_positive_int, default=10, metavar="N", help="episodes to run (default 10)"
    )
    evaluate.add_argument(
        "--num-envs", type=_positive_int, metavar="N", help="envs in parallel (default: --episodes)"
    )
    evaluate.add_argument(
        "--max-steps",
        type=_positive_int,
        metavar="N",
        help="steps per env at most (default 100000; 1000 for envs without episodes)",
    )
    evaluate.set_defaults(func=evaluate_command.run)

    record = commands.add_parser(
        "record",
        parents=[verbosity],
        help="record an MP4 video of a saved policy (needs imageio and imageio-ffmpeg: the video extra)",
        description="Write an MP4 video (H.264) of one episode of a policy file, a checkpoint (file or "
        "folder) or an MLflow run's policy.",
    )
    _add_policy_run_arguments(record)
    record.add_argument(
        "-o",
        "--output",
        default="video.mp4",
        metavar="FILE",
        help="the MP4 file to write (default video.mp4); refused if it exists and is no MP4",
    )
    record.add_argument(
        "--force", action="store_true", help="write over an existing -o file of any kind"
    )
    record.add_argument(
        "--max-steps",
        type=_positive_int,
        metavar="N",
        help="env steps at most (default: one episode, at most the env's episode limit, else 1000)",
    )
    record.add_argument(
        "--fps",
        type=_positive_float,
        metavar="N",
        help="frames per second (default: the env's metadata['render_fps'])",
    )
    record.set_defaults(func=record_command.run)

    runs = commands.add_parser(
        "runs",
        parents=[debug],
        help="list RUNNING MLflow runs and their process; --clean marks dead ones FAILED",
        description="List the RUNNING MLflow runs with the host, pid and state of their process. --clean "
        "marks FAILED those whose process on this host is gone (killed before ending its run).",
    )
    runs.add_argument("--clean", action="store_true", help="mark the runs of dead processes FAILED")
    runs.add_argument(
        "--older-than",
        type=_duration,
        metavar="AGE",
        help="with --clean: also runs of unknown process started more than AGE ago (30m, 12h, 2d)",
    )
    runs.add_argument(
        "--dry-run", action="store_true", help="with --clean: only list what it would mark"
    )
    runs.add_argument("--experiment", help="only this experiment (default: all)")
    runs.add_argument(
        "--tracking-uri",
        help="MLflow tracking URI (default: MLFLOW_TRACKING_URI, else sqlite:///mlflow.db)",
    )
    runs.set_defaults(func=runs_command.run)

    export = commands.add_parser(
        "export",
        parents=[verbosity],
        help="write a saved policy's deterministic actor as ONNX or TorchScript (for a robot)",
        description="Write the deterministic actor (with its observation normalisation) of a policy file, a "
        "checkpoint (file or folder) or an MLflow run as ONNX or TorchScript. See docs/export.md.",
    )
    export.add_argument("policy", metavar="PATH_OR_RUN_ID")
    export.add_argument(
        "--format",
        choices=export_command.DEFAULT_OUTPUTS,
        default="onnx",
        help="onnx (needs the onnx extra) or torchscript (default onnx)",
    )
    export.add_argument(
        "-o",
        "--output",
        metavar="FILE",
        help="the file to write (default policy.onnx, or policy.pt for torchscript)",
    )
    export.add_argument(
        "--force", action="store_true", help="overwrite FILE even if it is not an rl8 export"
    )
    export.add_argument("--tracking-uri", help="MLflow tracking URI, for a run id")
    export.add_argument(
        "--trust-code",
        action="store_true",
        help="trust the file: import the modules it names that rl8's registry lacks",
    )
    export.set_defaults(func=export_command.run)

    sweep = commands.add_parser(
        "sweep",
        parents=[verbosity],
        help="search hyper-parameters with Optuna, each trial a nested MLflow run (the sweep extra)",
        description="Train trials of a config with hyper-parameters sampled from a search space (YAML), JOBS "
        "processes at once, pruned by their evaluations; run again, it continues (see --storage).",
    )
    sweep.add_argument("config", help="YAML config file of rl8 train, or a preset: NAME or preset:NAME")
    sweep.add_argument(
        "--space",
        required=True,
        metavar="SPACE.yaml",
        help="search space: hparam: {type: float|int|categorical, low, high, log, step, choices}",
    )
    sweep.add_argument(
        "--trials",
        type=_positive_int,
        required=True,
        metavar="N",
        help="trials to run (added to the study's)",
    )
    sweep.add_argument(
        "--jobs",
        type=_positive_int,
        default=1,
        metavar="J",
        help="trials at once, in processes (default 1)",
    )
    sweep.add_argument(
        "--study", help="study name (default: the config file's stem or the preset's name)"
    )
    sweep.add_argument(
        "--storage",
        metavar="URL",
        help="Optuna storage, an SQLAlchemy URL (default: sqlite:///optuna.db here)",
    )
    sweep.add_argument(
        "--objective",
        default="eval/episodes/return_mean",
        metavar="STAT",
        help="the stat optimised: its value at a trial's last evaluation (default eval/episodes/return_mean)",
    )
    sweep.add_argument("--direction", choices=("maximize", "minimize"), default="maximize")
    sweep.add_argument(
        "--pruner",
        choices=("median", "halving", "none"),
        default="median",
        help="Optuna's MedianPruner, SuccessiveHalvingPruner, or none (default median)",
    )
    sweep.add_argument(
        "--startup-trials",
        type=_arg_type(int, lambda value: value >= 0, "an int >= 0"),
        default=5,
        metavar="N",
        help="trials sampled at random before TPE and not pruned by median (default 5)",
    )
    sweep.add_argument(
        "--max-env-steps",
        type=_positive_int,
        metavar="N",
        help="each trial's budget (default: the config's max_steps)",
    )
    sweep.add_argument(
        "--max-seconds",
        type=_duration,
        metavar="TIME",
        help="each trial's budget in seconds (or 30m, 2h)",
    )
    sweep.add_argument(
        "--no-stop-conditions",
        action="store_true",
        help="leave out the config's (a preset's: solved) stop_conditions: each trial trains its budget",
    )
    sweep.add_argument(
        "--seed", type=int, help="seed of the sampler (the trials train with the config's seed)"
    )
    sweep.set_defaults(func=sweep_command.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``rl8`` command; returns the exit status.

    Args:
        argv: The command line after ``rl8`` (default: ``sys.argv[1:]``).
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    apply_verbosity(getattr(args, "verbose", False))  # before anything is imported or downloaded
    try:
        if getattr(args, "trust_code", False):  # as python -m rl8: a trusted file's modules here
            from rl8.ppo.resolve import working_dir_on_path

            working_dir_on_path()
        return int(args.func(args) or 0)
    except Exception as exc:
        status = _error_status(exc)
        if status is None:  # a bug (of rl8 or of code it calls): its traceback
            raise
        if args.debug or os.environ.get(DEBUG_ENV, "") not in ("", "0"):
            traceback.print_exc()
        print(f"rl8: error: {exc}", file=sys.stderr)
        return status


def _error_status(exc: Exception) -> int | None:
    """The exit status of an error that ``rl8`` reports in one line, or ``None`` for one that
    shows its traceback (a bug).

    2 for a mistake in what was given: rl8's :class:`ConfigError`, :class:`CheckpointDirError`
    (an unusable checkpoint_dir), :class:`CheckpointError` (a checkpoint or policy file refused),
    :class:`StoreSchemaError` (a store of a newer MLflow than the installed one), and any
    ``ValueError`` or ``TypeError`` that rl8's own code raised (its checks of hyper-parameters,
    run plans, envs and memory name the field, the expected and the given value). 1 for a known
    failure: a missing file or module, a policy that cannot be exported (:class:`ExportError`),
    the tracking server.

    Args:
        exc: The exception that ended the command.
    """
    from rl8.io.checkpoint import CheckpointError
    from rl8.io.checkpoint_dir import CheckpointDirError
    from rl8.mlflow_store import StoreSchemaError
    from rl8.policies.deploy import ExportError
    from rl8.tracking import TrackingError

    if isinstance(exc, (TrackingError, ExportError, FileNotFoundError, ImportError)):
        return 1
    if isinstance(exc, (ConfigError, CheckpointDirError, CheckpointError, StoreSchemaError)):
        return 2
    # rl8 checks its inputs with plain ValueError and TypeError in some 200 places: where the error
    # was raised tells them from one raised in a library rl8 calls (torch, gymnasium, a user's env)
    if isinstance(exc, (ValueError, TypeError)) and _raised_in_rl8(exc):
        return 2
    return None


def _raised_in_rl8(exc: BaseException) -> bool:
    """Whether ``exc`` was raised in a module of rl8 (the innermost frame of its traceback)."""
    frame = exc.__traceback__
    if frame is None:
        return False
    while frame.tb_next is not None:
        frame = frame.tb_next
    module = frame.tb_frame.f_globals.get("__name__", "")
    return module == "rl8" or module.startswith("rl8.")
