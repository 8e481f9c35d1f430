"""The Trainer's options, declared once: :class:`TrainerConfig`, one frozen dataclass field per
option with its default, ``doc`` and ``check``, and where it goes: ``param`` (the MLflow param
``trainer/<name>``), ``stored`` (in checkpoints), ``names_run`` (names the MLflow run, so a
resumed Trainer keeps it), ``cli`` (``"flag"``: an ``rl8 train`` flag and config key,
``"config"``: a config key only)."""

from __future__ import annotations

import dataclasses
import importlib.util
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from rl8.fields import (
    Check,
    attributes_doc,
    check,
    did_you_mean,
    first_invalid,
    int_at_least,
    is_int,
    optional,
    read_numbers,
)
from rl8.registry import qualified_name
from rl8.version import __version__

if TYPE_CHECKING:
    from rl8.ppo.algorithm import PPO
    from rl8.ppo.distributed import DistContext

__all__ = ["LOG_MODELS", "TrainerConfig", "run_params"]

#: The values of ``TrainerConfig.log_models`` (docs/tracking.md#policies-as-mlflow-models).
LOG_MODELS = ("all", "best_and_last", "none")

# the checks of the options (see rl8.fields.Check)
_COUNT = optional(int_at_least(1))
_BOOL = check("True or False", lambda v: isinstance(v, bool))
_TEXT = optional(check("a string", lambda v: isinstance(v, str)))
_NAME = optional(check("a non-empty string", lambda v: isinstance(v, str) and v.strip() != ""))
_PATH = optional(check("a path (a string or os.PathLike)", lambda v: isinstance(v, (str, os.PathLike))))
_SECONDS = check("a number of seconds > 0", lambda v: (is_int(v) or isinstance(v, float)) and v > 0)
_POSITIVE = optional(check("a number > 0", lambda v: (is_int(v) or isinstance(v, float)) and v > 0))


def _weight_sync(value: Any, name: str) -> str | None:
    from rl8.ppo.distributed import WEIGHT_SYNC_METHODS

    return (
        None if value in WEIGHT_SYNC_METHODS else f"one of {', '.join(map(repr, WEIGHT_SYNC_METHODS))}"
    )


def _checkpoint_data(value: Any, name: str) -> str | None:
    """Plain data a checkpoint can hold, checked now rather than at the first checkpoint."""
    from rl8.io.checkpoint import check_loadable

    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise TypeError(f"Trainer: {name} must be a mapping or None, got {value!r}")
    try:
        check_loadable(dict(value), name, set())
    except TypeError as err:
        raise TypeError(f"Trainer: {name} cannot be stored in a checkpoint: {err}") from None
    return None


def _system_metrics(value: Any, name: str) -> str | None:
    if not isinstance(value, bool):
        return "True or False"
    missing = value and importlib.util.find_spec("psutil") is None
    return (
        'False without psutil (python -m pip install -e ".[system]" from the rl8 clone)'
        if missing
        else None
    )


def _option(
    default: Any,
    doc: str,
    check: Check | None = None,
    *,
    param: bool = True,
    stored: bool = True,
    names_run: bool = False,
    cli: str | None = None,
) -> Any:
    """A :class:`TrainerConfig` field: its default, its one-line meaning (``doc``, also the
    ``rl8 train`` help), its check (``None``: any value) and where it goes (module docstring)."""
    metadata = {
        "doc": doc,
        "check": check,
        "param": param,
        "stored": stored,
        "names_run": names_run,
        "cli": cli,
    }
    return dataclasses.field(default=default, metadata=metadata)


@dataclasses.dataclass(frozen=True)
class TrainerConfig:
    """Every option of a :class:`rl8.Trainer` (``Trainer(algo, experiment="x")`` is
    ``Trainer(algo, TrainerConfig(experiment="x"))``), checked when made: a bad value is a
    ``ValueError`` (a ``TypeError`` for ``metadata``) naming the option."""

    experiment: str | None = _option(
        None,
        "MLflow experiment name; None: the env's name (CartPole, CartPole-v1)",
        _TEXT,
        param=False,
        names_run=True,
        cli="flag",
    )
    run_name: str | None = _option(
        None,
        "MLflow run name (not empty); None: MLflow picks one",
        _NAME,
        param=False,
        names_run=True,
        cli="flag",
    )
    tracking_uri: str | None = _option(
        None,
        "where runs go (http://host:port, sqlite:///file.db; not a folder nor file://, which MLflow 3 "
        "refuses); None: MLFLOW_TRACKING_URI, else sqlite:///mlflow.db in the current folder",
        _TEXT,
        param=False,
        names_run=True,
        cli="flag",
    )
    tracking: bool = _option(
        True, "False: no MLflow at all (no run, nothing logged)", _BOOL, param=False, names_run=True
    )
    run_id: str | None = _option(
        None,
        "continue this existing MLflow run instead of creating one (from_checkpoint sets it)",
        _TEXT,
        param=False,
        names_run=True,
    )
    parent_run_id: str | None = _option(
        None,
        "a new MLflow run is nested under this run (the tag mlflow.parentRunId; rl8 sweep's "
        "trials under their study's run)",
        _TEXT,
        param=False,
        stored=False,
        names_run=True,
    )
    checkpoint_dir: str | os.PathLike[str] | None = _option(
        None,
        "folder of the numbered checkpoints, made and claimed (one run's alone) when the Trainer "
        "is made; None: checkpoints/<run id> in the current folder (checkpoints/<time stamp>-<random> "
        "without tracking)",
        _PATH,
        param=False,
        cli="flag",
    )
    checkpoint_every: int | None = _option(
        None,
        "Trainer.run writes a checkpoint every this many training steps; None: only at the "
        "end of the run and on signals, and with register_as ranking them by an eval/ stat at "
        "every evaluation (every steps_per_eval steps)",
        _COUNT,
        cli="flag",
    )
    keep_checkpoints: int | None = _option(
        5,
        "how many checkpoints to keep in checkpoint_dir (the latest); None: all",
        _COUNT,
        param=False,
        cli="config",
    )
    eval_num_envs: int | None = _option(
        None,
        "envs of a dedicated eval env; None: evaluate on the training envs at env-reset "
        "boundaries, else on min(num_envs, 16) envs built on demand",
        _COUNT,
        cli="flag",
    )
    eval_num_steps: int | None = _option(
        None,
        "steps per env of one evaluation; None: horizon * max(1, horizons_per_env_reset), "
        "or on a dedicated env of an episodic env its episode limit",
        _COUNT,
        cli="config",
    )
    progress: bool | None = _option(
        None,
        "progress line on stderr during Trainer.run, and a summary line: None or True: in "
        "place on a terminal, else a plain line every progress_every_s; False: nothing",
        optional(_BOOL),
        param=False,
        stored=False,
    )
    progress_every_s: float = _option(
        10.0,
        "seconds between two plain progress lines when stderr is not a terminal",
        _SECONDS,
        param=False,
        stored=False,
    )
    async_logging: bool = _option(
        True,
        "send metrics to MLflow from a background thread; False: before Trainer.step returns",
        _BOOL,
        param=False,
        stored=False,
    )
    metadata: Mapping[str, Any] | None = _option(
        None,
        "plain data (dicts, lists, numbers, strings, tensors) stored in every checkpoint "
        "(rl8 train stores its config here)",
        _checkpoint_data,
        param=False,
    )
    record_every: int | None = _option(
        None,
        "Trainer.run records a video at every this many-th evaluation (checkpoint_dir/videos/"
        "eval-<env steps>.mp4, MLflow artifact videos/); None: never; needs the video extra (pip install -e '.[video]')",
        _COUNT,
    )
    actors: int | None = _option(
        None,
        "under torchrun: this many ranks only collect (actors) and the others only update "
        "(learners; see docs/distributed.md); None: data-parallel, every rank collects and updates",
        _COUNT,
        cli="flag",
    )
    weight_sync_interval: int = _option(
        1,
        "with actors: learner updates between two weight syncs of an actor (an actor also gets "
        "weights whenever it would exceed max_staleness)",
        int_at_least(1),
        cli="flag",
    )
    max_staleness: int = _option(
        1,
        "with actors: a rollout collected with weights more than this many updates behind the "
        "learner's is dropped; 0: synchronous (actors wait for every update)",
        int_at_least(0),
        cli="flag",
    )
    weight_sync: str = _option(
        "broadcast",
        "with actors: how weights reach the actors: 'broadcast' (over the process "
        "group) or 'checkpoint' (a file in weight_sync_dir that actors read)",
        _weight_sync,
        cli="flag",
    )
    importance_weight_cap: float | None = _option(
        None,
        "with actors: truncated importance weights: the clipped ratio is taken against the "
        "learner's weights at the start of the update and each transition's advantage is weighted "
        "by min(cap, their probability / the behaviour probability); None: the ratio is against the "
        "behaviour policy, unweighted",
        _POSITIVE,
        cli="config",
    )
    weight_sync_dir: str | None = _option(
        None,
        "with weight_sync='checkpoint': the folder of the weights file, on storage every rank sees",
        _TEXT,
        cli="flag",
    )

    log_models: str = _option(
        "best_and_last",
        "which checkpoints become MLflow logged models (the Models tab): 'all'; 'best_and_last': "
        "the best by register_metric and the latest (older ones are deleted); 'none': none (the "
        "policy is still the run artifact policy/, the best one best_policy/)",
        check(
            "one of " + ", ".join(map(repr, LOG_MODELS)),
            lambda v: v in LOG_MODELS,
        ),
        cli="flag",
    )
    register_as: str | None = _option(
        None,
        "at the end of Trainer.run, register the run's best checkpoint (by register_metric) in "
        "MLflow's Model Registry under this name, as a new version with the alias 'best' "
        "(models:/NAME@best); None: no registration",
        _TEXT,
        cli="flag",
    )
    register_metric: str | None = _option(
        None,
        "the stat that ranks the checkpoints for register_as and log_models (an eval/ stat is linked to the "
        "checkpoints written at evaluation steps: checkpoint_every must be a multiple of "
        "steps_per_eval); None: eval/episodes/return_mean in a run that evaluates (steps_per_eval), "
        "else the training return episodes/return_mean",
        _TEXT,
        cli="config",
    )
    register_mode: str = _option(
        "max",
        "'max' or 'min': which value of register_metric is best",
        check("'max' or 'min'", lambda v: v in ("max", "min")),
        cli="config",
    )
    log_every: int | None = _option(
        None,
        "training steps between two metric logs to MLflow (each logs the latest value of every stat, "
        "at its step; 1: every step); None: every step for the first minute (at most 1,000 steps), "
        "then one step per 10 s; evaluations, checkpoints and the last step are always logged",
        _COUNT,
        cli="config",
    )
    system_metrics: bool = _option(
        False,
        "log MLflow's system metrics (system/*: CPU, memory, disk, network; GPU with nvidia-ml-py) "
        "every 10 s (MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL); needs psutil "
        '(python -m pip install -e ".[system]" from the rl8 clone)',
        _system_metrics,
        param=False,
        stored=False,
        cli="config",
    )

    def __post_init__(self) -> None:
        invalid = first_invalid(self)
        if invalid is not None:
            raise ValueError(
                f"Trainer: {invalid.name} must be {invalid.expected}, got {invalid.value!r}"
            )
        if self.max_staleness < self.weight_sync_interval - 1:
            raise ValueError(
                f"Trainer: max_staleness must be >= weight_sync_interval - 1 (actors keep weights for "
                f"weight_sync_interval updates, so their rollouts are that stale), got max_staleness="
                f"{self.max_staleness} with weight_sync_interval={self.weight_sync_interval}"
            )
        if self.register_as is not None and not self.tracking:
            raise ValueError(
                f"Trainer: register_as={self.register_as!r} registers in MLflow's Model Registry, "
                "but tracking=False"
            )
        if self.weight_sync == "checkpoint" and self.weight_sync_dir is None:
            raise ValueError(
                "Trainer: weight_sync='checkpoint' needs weight_sync_dir (a folder every rank sees), got None"
            )

    @classmethod
    def names(cls, **where: Any) -> list[str]:
        """The options whose field metadata match ``where`` (``names(param=True)``), in order."""
        return [
            f.name
            for f in dataclasses.fields(cls)
            if all(f.metadata[key] == value for key, value in where.items())
        ]

    @classmethod
    def check_names(cls, options: Mapping[str, Any]) -> None:
        """A ``TypeError`` naming an option of ``options`` that is not a field (close matches)."""
        names = cls.names()
        for key in options:
            if key not in names:
                raise TypeError(
                    f"Trainer: unknown option {key!r}{did_you_mean(key, names)} (valid: {', '.join(names)})"
                )

    @classmethod
    def read_option(cls, name: str, value: Any) -> Any:
        """Option ``name``'s ``value`` as a config file (YAML) or a flag's text gives it, read as
        its type says (numeric strings as numbers, ``"1e3"``: 1000; a YAML number as a string for
        a string option) and checked (a ``ValueError`` ``"NAME must be ..., got VALUE"``)."""
        field = next(f for f in dataclasses.fields(cls) if f.name == name)
        kind = str(field.type).split(" ")[0]  # "int | None" -> "int"
        if kind in ("int", "float"):
            value = read_numbers(value, whole_as_int=kind == "int")
            value = float(value) if kind == "float" and is_int(value) else value
        elif kind == "str" and isinstance(value, (int, float)):
            value = str(value)
        expected = field.metadata["check"](value, name) if field.metadata["check"] else None
        if expected is not None:
            raise ValueError(f"{name} must be {expected}, got {value!r}")
        return value

    def replace(self, **options: Any) -> TrainerConfig:
        """A copy with ``options`` changed (checked like a new config)."""
        self.check_names(options)
        return dataclasses.replace(self, **options)

    def params(self) -> dict[str, Any]:
        """The options logged as the MLflow params ``trainer/<name>``."""
        return {name: getattr(self, name) for name in self.names(param=True)}

    def stored(self) -> dict[str, Any]:
        """The options written in a checkpoint's ``trainer`` section (plain values)."""
        out = {name: getattr(self, name) for name in self.names(stored=True)}
        if out.get("checkpoint_dir") is not None:
            out["checkpoint_dir"] = os.fspath(out["checkpoint_dir"])
        if out.get("metadata") is not None:
            out["metadata"] = dict(out["metadata"])
        return out

    @classmethod
    def from_stored(cls, saved: Mapping[str, Any]) -> TrainerConfig:
        """The config a checkpoint's ``trainer`` section records (defaults for missing options)."""
        return cls(**{name: saved[name] for name in cls.names(stored=True) if name in saved})


TrainerConfig.__doc__ = (TrainerConfig.__doc__ or "") + attributes_doc(TrainerConfig)


def run_params(
    algo: PPO, config: TrainerConfig, env_spec: str | None, dist: DistContext
) -> dict[str, Any]:
    """The configuration of a run of ``algo`` with the Trainer options ``config`` as nested MLflow
    params: hyper-parameters (the values in use), env (``env_spec``: its dotted path or gymnasium
    id, ``None``: one a file cannot name), model, distribution, optimizer, versions, Trainer
    options and the world size of the process group ``dist``."""
    import platform

    import torch

    policy = algo.policy
    optimizer_kwargs = {**algo.hparams.optimizer_kwargs, "lr": algo.hparams.lr}
    # hparams/seed and hparams/device are the values in use (a random seed, "auto" resolved)
    hparams = {**algo.hparams.to_plain(), "seed": algo.seed, "device": str(algo.device)}
    env = env_spec if env_spec is not None else repr(algo.env_spec)
    if env_spec is None and not callable(
        algo.env_spec
    ):  # an env given built: its class, not its address
        env = f"a {qualified_name(type(algo.env_spec))} object"
    params = {
        "hparams": hparams,
        "env": env,
        "model": {"class": qualified_name(policy.model_cls), "config": dict(policy.model_config)},
        "distribution": {"class": qualified_name(policy.distribution_cls)},
        "optimizer": {"class": qualified_name(type(algo.optimizer)), "kwargs": optimizer_kwargs},
        "versions": {
            "rl8": __version__,
            "torch": str(torch.__version__),
            "python": platform.python_version(),
        },
        "trainer": config.params(),
        "amp_dtype": str(algo.amp_dtype).removeprefix("torch."),  # enable_amp's choice (float32: off)
    }
    if qualified_name(type(algo.env)) != env:  # a gymnasium id, a factory: the rl8 class around it
        params["env_class"] = qualified_name(type(algo.env))
    if algo.algorithm != "PPO":  # the runs of PPO log what they logged before the name existed
        params["algorithm"] = algo.algorithm
    teacher = getattr(algo, "teacher", None)
    if teacher is not None:
        params["teacher"] = {
            "class": qualified_name(teacher.model_cls),
            "config": dict(teacher.model_config),
        }
    from rl8.ppo.distributed import current_roles

    roles = current_roles()
    if roles is not None:  # actors and learners: num_envs is one learner's batch, split among its actors
        params["distributed"] = {
            "world_size": roles.world_size,
            "actors": roles.actors,
            "learners": roles.learners,
        }
    elif dist.enabled:  # hparams are per rank (num_envs: each rank's envs)
        params["distributed"] = {"world_size": dist.world_size}
    return params
