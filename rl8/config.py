"""The Trainer's options, declared once: :class:`TrainerConfig`.

Each option is one field of a frozen dataclass, with its default, its meaning and its check.
Where an option goes is read from the field, never listed again:

* ``param``: logged as the MLflow param ``trainer/<name>``;
* ``stored``: written in the checkpoint's ``trainer`` section and restored by
  :meth:`rl8.Trainer.from_checkpoint`;
* ``names_run``: says which MLflow run the Trainer writes to, so a resumed Trainer keeps the
  checkpoint's value unless the caller of ``from_checkpoint`` passes another;
* ``cli``: ``"flag"`` (an ``rl8 train`` flag and a config file key), ``"config"`` (a config
  file key only) or ``None``, with ``cli_type`` (``int``, ``float`` or ``str``) the type the command
  reads it as (``cli_min``: the smallest int the flag takes).
"""

from __future__ import annotations

import dataclasses
import difflib
import os
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .distributed import DistContext
    from .ppo import PPO

__all__ = ["TrainerConfig", "run_params"]


def _int_at_least_1(name: str, value: Any) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ValueError(f"Trainer: {name} must be an int >= 1 or None, got {value!r}")


def _bool_or_none(name: str, value: Any) -> None:
    if value is not None and not isinstance(value, bool):
        raise ValueError(f"Trainer: {name} must be None, True or False, got {value!r}")


def _bool(name: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise ValueError(f"Trainer: {name} must be True or False, got {value!r}")


def _int_at_least_0(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"Trainer: {name} must be an int >= 0, got {value!r}")


def _positive_or_none(name: str, value: Any) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0):
        raise ValueError(f"Trainer: {name} must be a number > 0 or None, got {value!r}")


def _weight_sync(name: str, value: Any) -> None:
    from .actors import WEIGHT_SYNC_METHODS

    if value not in WEIGHT_SYNC_METHODS:
        raise ValueError(f"Trainer: {name} must be one of {', '.join(map(repr, WEIGHT_SYNC_METHODS))}, got {value!r}")


def _seconds(name: str, value: Any) -> None:
    if isinstance(value, bool) or not (isinstance(value, (int, float)) and value > 0):
        raise ValueError(f"Trainer: {name} must be a number of seconds > 0, got {value!r}")


def _checkpoint_data(name: str, value: Any) -> None:
    """Plain data a checkpoint can hold, checked now rather than at the first checkpoint."""
    from .checkpoint import _check_loadable

    if value is None:
        return
    if not isinstance(value, Mapping):
        raise TypeError(f"Trainer: {name} must be a mapping or None, got {value!r}")
    try:
        _check_loadable(dict(value), name, set())
    except TypeError as err:
        raise TypeError(f"Trainer: {name} cannot be stored in a checkpoint: {err}") from None


def _option(
    default: Any,
    doc: str,
    check: Callable[[str, Any], None] | None = None,
    *,
    param: bool = True,
    stored: bool = True,
    names_run: bool = False,
    cli: str | None = None,
    cli_type: type = str,
    cli_min: int = 1,
) -> Any:
    """A :class:`TrainerConfig` field: its default, its one-line meaning (``doc``, also the
    ``rl8 train`` help), its check (``check(name, value)`` raising ``ValueError`` or
    ``TypeError``) and where it goes (see the module docstring)."""
    metadata = {"doc": doc, "check": check, "param": param, "stored": stored,
                "names_run": names_run, "cli": cli, "cli_type": cli_type, "cli_min": cli_min}
    return dataclasses.field(default=default, metadata=metadata)


@dataclasses.dataclass(frozen=True)
class TrainerConfig:
    """Every option of a :class:`rl8.Trainer`, checked when made.

    ``Trainer(algo, experiment="x")`` and ``Trainer(algo, TrainerConfig(experiment="x"))`` are
    the same Trainer. A bad value is a ``ValueError`` (a ``TypeError`` for ``metadata``) naming
    the option, what it must be and the value given.

    The options, their defaults and meanings are the fields below (``help(TrainerConfig)``
    lists them with their meanings).
    """

    experiment: str | None = _option(
        None, "MLflow experiment name; None: the env's name (CartPole, CartPole-v1)",
        param=False, names_run=True, cli="flag")
    run_name: str | None = _option(
        None, "MLflow run name; None: MLflow picks one", param=False, names_run=True, cli="flag")
    tracking_uri: str | None = _option(
        None, "where runs go (http://host:port, sqlite:///file.db, a folder); None: "
        "MLFLOW_TRACKING_URI, else sqlite:///mlflow.db in the current folder",
        param=False, names_run=True, cli="flag")
    tracking: bool = _option(
        True, "False: no MLflow at all (no run, nothing logged)", _bool, param=False, names_run=True)
    run_id: str | None = _option(
        None, "continue this existing MLflow run instead of creating one (from_checkpoint sets it)",
        param=False, names_run=True)
    checkpoint_dir: str | os.PathLike[str] | None = _option(
        None, "folder of the numbered checkpoints, made and claimed (one run's alone) when the Trainer "
        "is made; None: checkpoints/<run id> in the current folder (checkpoints/<time stamp>-<random> "
        "without tracking)", param=False, cli="flag")
    checkpoint_every: int | None = _option(
        None, "Trainer.run writes a checkpoint every this many training steps; None: only at the "
        "end of the run and on signals", _int_at_least_1, cli="flag", cli_type=int)
    keep_checkpoints: int | None = _option(
        5, "how many checkpoints to keep in checkpoint_dir (the latest); None: all",
        _int_at_least_1, param=False, cli="config", cli_type=int)
    eval_num_envs: int | None = _option(
        None, "envs of a dedicated eval env; None: evaluate on the training envs at env-reset "
        "boundaries, else on min(num_envs, 16) envs built on demand",
        _int_at_least_1, cli="flag", cli_type=int)
    eval_num_steps: int | None = _option(
        None, "steps per env of one evaluation; None: horizon * max(1, horizons_per_env_reset), "
        "or on a dedicated env of an episodic env its episode limit",
        _int_at_least_1, cli="config", cli_type=int)
    progress: bool | None = _option(
        None, "progress line on stderr during Trainer.run, and a summary line: None or True: in "
        "place on a terminal, else a plain line every progress_every_s; False: nothing",
        _bool_or_none, param=False, stored=False)
    progress_every_s: float = _option(
        10.0, "seconds between two plain progress lines when stderr is not a terminal", _seconds,
        param=False, stored=False)
    async_logging: bool = _option(
        True, "send metrics to MLflow from a background thread; False: before Trainer.step returns",
        _bool, param=False, stored=False)
    metadata: Mapping[str, Any] | None = _option(
        None, "plain data (dicts, lists, numbers, strings, tensors) stored in every checkpoint "
        "(rl8 train stores its config here)", _checkpoint_data, param=False)
    record_every: int | None = _option(
        None, "Trainer.run records a video at every this many-th evaluation (checkpoint_dir/videos/"
        "eval-<env steps>.mp4, MLflow artifact videos/); None: never; needs rl8[video]",
        _int_at_least_1)
    actors: int | None = _option(
        None, "under torchrun: this many ranks only collect (actors) and the others only update "
        "(learners; see docs/distributed.md); None: data-parallel, every rank collects and updates",
        _int_at_least_1, cli="flag", cli_type=int)
    weight_sync_interval: int = _option(
        1, "with actors: learner updates between two weight syncs of an actor (an actor also gets "
        "weights whenever it would exceed max_staleness)", _int_at_least_1, cli="flag", cli_type=int)
    max_staleness: int = _option(
        1, "with actors: a rollout collected with weights more than this many updates behind the "
        "learner's is dropped; 0: synchronous (actors wait for every update)",
        _int_at_least_0, cli="flag", cli_type=int, cli_min=0)
    weight_sync: str = _option(
        "broadcast", "with actors: how weights reach the actors: 'broadcast' (over the process "
        "group) or 'checkpoint' (a file in weight_sync_dir that actors read)", _weight_sync,
        cli="flag")
    importance_weight_cap: float | None = _option(
        None, "with actors: truncated importance weights: the clipped ratio is taken against the "
        "learner's weights at the start of the update and each transition's advantage is weighted "
        "by min(cap, their probability / the behaviour probability); None: the ratio is against the "
        "behaviour policy, unweighted", _positive_or_none, cli="config", cli_type=float)
    weight_sync_dir: str | None = _option(
        None, "with weight_sync='checkpoint': the folder of the weights file, on storage every "
        "rank sees", cli="flag")

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            check = field.metadata["check"]
            if check is not None:
                check(field.name, getattr(self, field.name))
        if self.max_staleness < self.weight_sync_interval - 1:
            raise ValueError(
                f"Trainer: max_staleness must be >= weight_sync_interval - 1 (actors keep weights for "
                f"weight_sync_interval updates, so their rollouts are that stale), got max_staleness="
                f"{self.max_staleness} with weight_sync_interval={self.weight_sync_interval}"
            )
        if self.weight_sync == "checkpoint" and self.weight_sync_dir is None:
            raise ValueError("Trainer: weight_sync='checkpoint' needs weight_sync_dir (a folder every rank sees), got None")

    @classmethod
    def names(cls, **where: Any) -> list[str]:
        """The options whose field metadata match ``where`` (e.g. ``names(param=True)``), in
        declaration order."""
        return [f.name for f in dataclasses.fields(cls)
                if all(f.metadata[key] == value for key, value in where.items())]

    @classmethod
    def check_names(cls, options: Mapping[str, Any], where: str = "Trainer") -> None:
        """Raise ``TypeError`` naming an option of ``options`` that is not a field, with its
        close matches."""
        names = cls.names()
        for key in options:
            if key not in names:
                close = difflib.get_close_matches(str(key), names, n=3)
                hint = f"; did you mean {', '.join(close)}?" if close else ""
                raise TypeError(f"{where}: unknown option {key!r}{hint} (valid: {', '.join(names)})")

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
        """The config a checkpoint's ``trainer`` section records (:meth:`stored`); an option
        that an older checkpoint lacks gets its default."""
        return cls(**{name: saved[name] for name in cls.names(stored=True) if name in saved})


TrainerConfig.__doc__ = (TrainerConfig.__doc__ or "") + "\n    Attributes:\n" + "".join(
    f"        {field.name}: {field.metadata['doc']}\n" for field in dataclasses.fields(TrainerConfig)
)


def run_params(algo: PPO, config: TrainerConfig, env_spec: str | None, dist: DistContext) -> dict[str, Any]:
    """A training run's configuration as nested MLflow params: hyper-parameters (the values in
    use), env, model, distribution, optimizer, versions, the Trainer options marked ``param``
    and, in data-parallel training, the world size.

    Args:
        algo: The algorithm.
        config: The Trainer's options.
        env_spec: The env as a dotted path or gymnasium id (``None``: one a file cannot name).
        dist: The process group.
    """
    import platform

    import torch

    from . import __version__
    from ._resolve import qualified_name
    from .ppo import _plain_hparams

    policy = algo.policy
    optimizer_kwargs = {**algo.hparams.optimizer_kwargs, "lr": algo.hparams.lr}
    # each param once: hparams/seed and hparams/device are the values in use (a seed drawn
    # at random, the device "auto" resolved to)
    hparams = {**_plain_hparams(algo.hparams), "seed": algo.seed, "device": str(algo.device)}
    env = env_spec if env_spec is not None else repr(algo.env_spec)
    params = {
        "hparams": hparams,
        "env": env,
        "model": {"class": qualified_name(policy.model_cls), "config": dict(policy.model_config)},
        "distribution": {"class": qualified_name(policy.distribution_cls)},
        "optimizer": {"class": qualified_name(type(algo.optimizer)), "kwargs": optimizer_kwargs},
        "versions": {"rl8": __version__, "torch": str(torch.__version__), "python": platform.python_version()},
        "trainer": config.params(),
    }
    if qualified_name(type(algo.env)) != env:  # a gymnasium id, a factory: the rl8 class around it
        params["env_class"] = qualified_name(type(algo.env))
    from .distributed import current_roles

    roles = current_roles()
    if roles is not None:  # actors and learners: num_envs is one learner's batch, split among its actors
        params["distributed"] = {"world_size": roles.world_size, "actors": roles.actors, "learners": roles.learners}
    elif dist.enabled:  # hparams are per rank (num_envs: each rank's envs)
        params["distributed"] = {"world_size": dist.world_size}
    return params
