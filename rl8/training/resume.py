"""The pieces :meth:`rl8.Trainer.save_checkpoint` and :meth:`rl8.Trainer.from_checkpoint` are
made of: what a checkpoint holds beyond the algorithm, writing it, rebuilding the algorithm."""

from __future__ import annotations

import contextvars
import dataclasses
import json
import math
import tempfile
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from rl8.io.checkpoint import CHECKPOINT_POINTER_ARTIFACT, CheckpointError, save_checkpoint
from rl8.io.checkpoint_dir import CheckpointManager
from rl8.io.export import (
    POLICY_ARTIFACT,
    check_env_spaces,
    check_finite_weights,
    policy_from_dict,
    space_from_dict,
)
from rl8.io.mlflow_model import save_model
from rl8.ppo.algorithm import PPO, NonFiniteError
from rl8.ppo.distillation import Distillation
from rl8.ppo.distributed import DistContext, current_roles, derive_seed, rank_device, to_cpu
from rl8.ppo.resolve import (
    check_stored_env_kwargs,
    check_stored_hparams,
    env_target,
    spec_from_env_info,
)
from rl8.tracking.common import TrackingWarning
from rl8.training.conditions import Condition, with_current_stat_names

__all__ = [
    "ALGORITHMS",
    "BEST_POLICY_ARTIFACT",
    "RESUMING",
    "CheckpointModels",
    "LoggedModels",
    "RunRecord",
    "absolute_tracking_uri",
    "algo_from_checkpoint",
    "check_finite_policy",
    "model_name",
    "rank_entry",
]


#: Entries of ``PPO.state_dict()`` that are the same on every rank: stored once (rank 0's
#: ``algo``), not in the per-rank entries of a data-parallel checkpoint.
_SHARED_ALGO_KEYS = (
    "algorithm",
    "hparams",
    "seed",
    "policy",
    "teacher",
    "optimizer",
    "grad_scaler",
    "counters",
)

#: The algorithms a checkpoint may name (its ``algo.algorithm`` entry; none: ``"PPO"``, written
#: before the entry existed), looked up here and never imported.
ALGORITHMS: dict[str, type[PPO]] = {"PPO": PPO, "Distillation": Distillation}


@dataclasses.dataclass
class RunRecord:
    """What a checkpoint records about :meth:`rl8.Trainer.run`.

    Attributes:
        run: Its ``env_config``, ``eval_env_config`` and ``steps_per_eval``, or ``None``.
        stop_conditions: The stop conditions' states (``Condition.state_dict``), or ``None``.
        stop_condition_configs: Their ``Condition.to_config()`` mappings (``None`` for one
            that has none).
        stop_conditions_met: Whether one of them held at the checkpoint's step.
        best_checkpoint: The run's best checkpoint so far by the ranking stat
            (:attr:`LoggedModels.best`), or ``None``.
    """

    run: dict[str, Any] | None = None
    stop_conditions: list[dict[str, Any]] | None = None
    stop_condition_configs: list[Any] | None = None
    stop_conditions_met: bool = False
    best_checkpoint: dict[str, Any] | None = None

    @classmethod
    def from_checkpoint(cls, saved: Mapping[str, Any]) -> RunRecord:
        """The record in a checkpoint's ``trainer`` section (with the current stat names)."""
        return cls(
            run=saved.get("run"),
            stop_conditions=with_current_stat_names(saved.get("stop_conditions")),
            stop_condition_configs=with_current_stat_names(saved.get("stop_condition_configs")),
            stop_conditions_met=bool(saved.get("stop_conditions_met")),
            best_checkpoint=saved.get("best_checkpoint"),
        )

    def restore(self, conditions: Sequence[Condition]) -> bool:
        """Load the recorded states into ``conditions`` (once: the record then forgets them);
        conditions that do not match start afresh, with a warning. Returns whether they are
        the very conditions that held at the checkpoint's step (the run is finished)."""
        saved = self.stop_conditions
        if not saved or not conditions:
            return False
        self.stop_conditions = None
        try:
            if len(saved) != len(conditions):
                raise ValueError(f"{len(saved)} conditions saved, {len(conditions)} given")
            for condition, state in zip(conditions, saved):
                condition.load_state_dict(state)
        except (ValueError, TypeError, KeyError) as exc:
            for condition in conditions:
                condition.reset()
            warnings.warn(
                f"the stop conditions differ from those saved in the checkpoint ({exc}); they "
                "start afresh (patience counters and clocks at zero)",
                stacklevel=3,
            )
            return False
        configs = [condition.to_config() for condition in conditions]
        return (
            self.stop_conditions_met and None not in configs and configs == self.stop_condition_configs
        )


#: While :meth:`rl8.Trainer.from_checkpoint` builds a Trainer: the checkpoint file it resumes from
#: (absolute; the Trainer may write into its folder) and the file's record of the run.
RESUMING: contextvars.ContextVar[tuple[Path, RunRecord] | None] = contextvars.ContextVar(
    "rl8_resuming", default=None
)


def check_finite_policy(policy: torch.nn.Module, step: int, last_checkpoint: Path | None) -> None:
    """Refuse to checkpoint a policy holding NaN/inf: a :class:`~rl8.ppo.algorithm.NonFiniteError`
    naming the env ``step`` and the ``last_checkpoint`` (the last good one, or ``None``)."""
    tensors = {k: v for k, v in policy.state_dict().items() if v.is_floating_point()}
    if not tensors:
        return
    finite = torch.stack([torch.isfinite(v).all() for v in tensors.values()]).tolist()
    if all(finite):
        return
    bad = [name for name, ok in zip(tensors, finite) if not ok]
    kept = f"; the last good checkpoint is {last_checkpoint}" if last_checkpoint else ""
    raise NonFiniteError(
        f"refusing to write a checkpoint at env step {step}: the policy's "
        f"{', '.join(bad[:5])}{' ...' if len(bad) > 5 else ''} hold NaN or inf{kept}"
    )


def rank_entry(algo_state: Mapping[str, Any]) -> dict[str, Any]:
    """The part of a ``PPO.state_dict()`` that is this rank's own (envs, RNG streams,
    episodes...): what a per-rank entry of a checkpoint holds."""
    return {k: v for k, v in algo_state.items() if k not in _SHARED_ALGO_KEYS}


def write_checkpoint(
    state: dict[str, Any],
    path: Any,
    folder: Path | None,
    keep_last: int | None,
    step: int,
    dist: DistContext,
    actors: dict[int, dict[str, Any]] | None = None,
) -> Path:
    """Write a Trainer checkpoint on rank 0 to ``path``, or (``None``) as ``folder``'s numbered
    checkpoint keeping the last ``keep_last``, with every rank's own algo state and every
    learner's ``actors`` states by rank (:meth:`rl8.training.actors.Learner.actor_states`).
    Every rank gets the absolute path written, or rank 0's error."""
    ranks, actor_states = None, [actors]
    if dist.enabled:
        gathered = dist.gather_to_main((to_cpu(rank_entry(state["algo"])), actors))
        if gathered is not None:
            ranks, actor_states = [own for own, _ in gathered], [theirs for _, theirs in gathered]
    roles = current_roles()

    def write() -> Path:
        if ranks is not None:
            state["distributed"] = {"world_size": dist.world_size, "ranks": ranks}
        entries = {
            rank: entry for states in actor_states or () for rank, entry in (states or {}).items()
        }
        if roles is not None and entries and len(entries) == roles.actors:  # all of them or none
            state["actors"] = {"world_size": roles.world_size, "actors": roles.actors, "ranks": entries}
        if path is None:
            return CheckpointManager(folder, keep_last=keep_last).save(state, step).absolute()
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        return save_checkpoint(state, target).absolute()

    return dist.on_main(write)


#: The run artifact folder of the best checkpoint's policy under ``log_models="none"``.
BEST_POLICY_ARTIFACT = "best_policy"


def model_name(step: int) -> str:
    """The name of the logged model of the checkpoint at env step ``step``."""
    return f"checkpoint-{step}"


@dataclasses.dataclass
class CheckpointModels:
    """What :func:`log_policy_artifacts` logs of one checkpoint besides the run's ``policy/``.

    Attributes:
        log_model: Log it as the logged model :func:`model_name`.
        replaces: Names of the run's logged models that it replaces (deleted once it is logged).
        best_policy: Log it also as the run artifact folder :data:`BEST_POLICY_ARTIFACT`.
    """

    log_model: bool
    replaces: tuple[str, ...] = ()
    best_policy: bool = False


class LoggedModels:
    """Which checkpoints of a run are MLflow logged models (``TrainerConfig.log_models``), ranked
    by the stat ``metric`` as :meth:`rl8.tracking.Tracker.register_best` ranks them.

    Args:
        keep: ``"all"``, ``"best_and_last"`` or ``"none"`` (see ``docs/models.md``).
        metric: The ranking stat (``register_metric``; ``None``: not known yet, see
            :meth:`rank_by`); a checkpoint without it is never best.
        mode: ``"max"`` or ``"min"``: which value of ``metric`` is best (``register_mode``).
        best: The best checkpoint a resumed run recorded (:attr:`best`); kept when its metric
            (once known) and mode are these, else forgotten.

    Attributes:
        best: ``{"metric", "mode", "step", "value"}`` of the best checkpoint so far, or ``None``.
    """

    def __init__(
        self, keep: str, metric: str | None, mode: str, best: Mapping[str, Any] | None = None
    ) -> None:
        self.keep, self.metric, self.mode = keep, metric, mode
        same_ranking = best is not None and best.get("mode") == mode
        self.best: dict[str, Any] | None = dict(best) if same_ranking else None
        if metric is not None:
            self.rank_by(metric)
        elif self.best is not None:  # a resumed run ranks as it did until its plan says otherwise
            self.metric = self.best.get("metric")

    def rank_by(self, metric: str) -> None:
        """Rank the checkpoints by ``metric`` from now on (the run plan decides the default of
        ``register_metric``); a best checkpoint ranked by another stat is forgotten."""
        self.metric = metric
        if self.best is not None and self.best.get("metric") != metric:
            self.best = None

    def is_better(self, value: float | None) -> bool:
        """Whether a checkpoint whose ranking stat is ``value`` (``None``: none) beats the best."""
        if value is None or not math.isfinite(value):
            return False
        if self.best is None:
            return True
        return value > self.best["value"] if self.mode == "max" else value < self.best["value"]

    def checkpoint(self, step: int, value: float | None, last_step: int | None) -> CheckpointModels:
        """What to log of the checkpoint at env step ``step`` whose ranking stat is ``value``
        (``None``: it has none), the previous checkpoint of the run being at ``last_step``
        (``None``: none); a new best becomes :attr:`best`."""
        previous_best = None if self.best is None else self.best["step"]
        new_best = self.is_better(value)
        if new_best:
            self.best = {"metric": self.metric, "mode": self.mode, "step": step, "value": value}
        if self.keep == "none":
            return CheckpointModels(log_model=False, best_policy=new_best)
        if self.keep == "all":
            return CheckpointModels(log_model=True)
        kept = {step, None if self.best is None else self.best["step"]}
        replaced = dict.fromkeys(
            s for s in (last_step, previous_best) if s is not None and s not in kept
        )
        return CheckpointModels(log_model=True, replaces=tuple(map(model_name, replaced)))


def log_policy_artifacts(
    tracker: Any,
    policy: torch.nn.Module,
    env: dict[str, Any],
    checkpoint: Path,
    step: int,
    models: CheckpointModels,
) -> None:
    """Log the policy as an MLflow model folder (:func:`rl8.io.mlflow_model.save_model`: the
    run's ``policy/`` artifacts and, as ``models`` says, the logged model ``checkpoint-<step>``
    linked to the metrics of env step ``step`` and the ``best_policy/`` artifacts) and the
    ``rl8/checkpoint.json`` pointer to ``checkpoint``; a failure is a warning, never an error
    (the checkpoint is written already)."""
    try:
        with tempfile.TemporaryDirectory(prefix="rl8-artifacts-", ignore_cleanup_errors=True) as name:
            tmp = Path(name)
            pointer = tmp / Path(CHECKPOINT_POINTER_ARTIFACT).name
            pointer.write_text(json.dumps({"path": str(checkpoint), "env/steps": step}))
            tracker.log_artifact(pointer, str(Path(CHECKPOINT_POINTER_ARTIFACT).parent))
            folder = save_model(policy, tmp / Path(POLICY_ARTIFACT).parent, env=env)
            tracker.log_artifacts(folder, str(Path(POLICY_ARTIFACT).parent))
            if models.best_policy:
                tracker.log_artifacts(folder, BEST_POLICY_ARTIFACT)
            if models.log_model:
                tracker.log_model(folder, model_name(step), step, replaces=models.replaces)
    except Exception as exc:  # noqa: BLE001 - tracking never fails training
        warnings.warn(
            f"the policy and checkpoint pointer of {checkpoint} were not (all) logged to MLflow run "
            f"{tracker.run_id}: {type(exc).__name__}: {exc} (staging folder {tempfile.gettempdir()}); "
            "the checkpoint is written and training goes on",
            TrackingWarning,
            stacklevel=3,
        )


def algo_from_checkpoint(
    file: Path,
    state: Mapping[str, Any],
    *,
    env: Any,
    hparams: Mapping[str, Any] | None,
    trust_code: bool,
) -> PPO:
    """The PPO that the Trainer checkpoint ``state`` (read from ``file``) describes, with its state
    loaded, its ``env`` (``None``: the stored one) and ``hparams`` given over the stored ones;
    every class the file names is looked up in :mod:`rl8.registry` and checked for its kind
    unless ``trust_code`` (see :meth:`rl8.Trainer.from_checkpoint` and ``docs/security.md``).

    Raises:
        rl8.io.checkpoint.CheckpointError: Not a Trainer checkpoint, or a stored name that is not
            registered or of the wrong kind.
        ValueError: An env that the checkpoint cannot name and that is not given, or whose
            spaces differ from the checkpoint's.
    """
    if not all(isinstance(state.get(k), Mapping) for k in ("algo", "trainer", "env")):
        raise CheckpointError(
            f"{file} is an rl8 checkpoint but not a Trainer checkpoint (it has no "
            "'algo', 'trainer' and 'env' entries)"
        )
    algo_state = state["algo"]
    stored = algo_state.get("hparams")
    check_stored_hparams(stored, source=file, trust_code=trust_code, given=hparams)
    spec = env
    if env is None:
        env_info = {"spec": state["env"].get("spec"), "env_kwargs": stored.get("env_kwargs")}
        if spec_from_env_info(env_info, source=file, trust_code=trust_code) is not None:
            spec = env_info["spec"]
    else:  # the stored env_kwargs go to your env: a GymnasiumEnv's env id is checked
        check_stored_env_kwargs(
            env_target(env).target, stored.get("env_kwargs"), source=file, trust_code=trust_code
        )
    if spec is None:
        raise ValueError(
            f"{file}: the env was a callable or an env object that a checkpoint cannot name; pass it "
            "(the env built again, for an env object) with Trainer.from_checkpoint(path, env=...)"
        )
    hp = {**stored, **dict(hparams or {})}
    hp["device"] = rank_device(hp.get("device", "auto"))  # torchrun: cuda:LOCAL_RANK
    algo_cls = _stored_algorithm(algo_state, file)
    extra = {"teacher": _stored_teacher(state, file, trust_code)} if algo_cls is Distillation else {}
    try:
        algo = algo_cls(spec, **hp, **extra)
    except (TypeError, ValueError) as exc:  # one line naming the field, the value and what it must be
        raise (
            exc
            if isinstance(exc, CheckpointError)
            else CheckpointError(
                f"{file}: its hyper-parameters{' (with those given)' if hparams else ''} do not build: {exc}"
            )
        ) from exc
    policy_info = state["trainer"].get("policy")
    if isinstance(policy_info, Mapping) and env is not None:
        check_env_spaces(
            algo.env,
            space_from_dict(policy_info["observation_space"]),
            space_from_dict(policy_info["action_space"]),
            what=f"Trainer.from_checkpoint: env={env!r}",
            source=file,
        )
    roles = current_roles()
    is_actor = roles is not None and roles.is_actor  # its weights come from its learner
    if is_actor and state.get("actor") is None:
        # no actor states: its envs start anew, seeded apart from those before the checkpoint
        algo.env_seed = derive_seed(algo.env_seed, int(algo_state["counters"]["steps"]) + 1)
        algo.generator.manual_seed(algo.env_seed)
    else:  # an actor's envs, RNG streams and episodes go on where they were
        _load_algo_state(algo, {**algo_state, **(state["actor"] if is_actor else {})}, file)
    return algo


def _stored_algorithm(algo_state: Mapping[str, Any], file: Path) -> type[PPO]:
    """The class of the checkpoint's ``algo.algorithm`` entry (:data:`ALGORITHMS`)."""
    name = algo_state.get("algorithm", "PPO")
    if not isinstance(name, str) or name not in ALGORITHMS:
        raise CheckpointError(
            f"{file}: entry 'algo.algorithm' must be one of {sorted(ALGORITHMS)}, got {name!r:.80}"
        )
    return ALGORITHMS[name]


def _stored_teacher(state: Mapping[str, Any], file: Path, trust_code: bool) -> Any:
    """A distillation checkpoint's teacher: its description (``trainer.teacher``) with its
    weights (``algo.teacher``), built as a policy file is (classes from :mod:`rl8.registry`)."""
    described, weights = state["trainer"].get("teacher"), state["algo"].get("teacher")
    if not isinstance(described, Mapping) or not isinstance(weights, Mapping):
        raise CheckpointError(
            f"{file}: a Distillation checkpoint needs the entries 'trainer.teacher' (a policy "
            f"description) and 'algo.teacher' (its weights), got {type(described).__name__} and "
            f"{type(weights).__name__}"
        )
    return policy_from_dict(
        {**described, "state_dict": weights},
        source=f"{file}: entry 'trainer.teacher'",
        trust_code=trust_code,
    )


def _load_algo_state(algo: PPO, algo_state: Mapping[str, Any], file: Path) -> None:
    """``algo.load_state_dict(algo_state)``; a :class:`~rl8.io.checkpoint.CheckpointError` naming
    the entry for weights that hold NaN or inf or do not fit the model."""
    weights = algo_state.get("policy")
    if not isinstance(weights, Mapping) or not all(
        isinstance(v, torch.Tensor) for v in weights.values()
    ):
        raise CheckpointError(
            f"{file}: entry 'algo.policy' must be a dict of tensors by name, "
            f"got {type(weights).__name__}"
        )
    check_finite_weights(weights, f"{file}: entry 'algo.policy':")
    try:
        algo.load_state_dict(algo_state)
    except (RuntimeError, KeyError, TypeError, ValueError) as exc:
        if isinstance(exc, CheckpointError):
            raise
        detail = " ".join(line.strip() for line in str(exc).splitlines()[:4])
        raise CheckpointError(
            f"{file}: entry 'algo' does not fit the PPO its hyper-parameters (entry 'algo.hparams') "
            f"describe: {type(exc).__name__}: {detail}"
        ) from None


def absolute_tracking_uri(uri: str) -> str:
    """A tracking URI that still names the same store from another working directory."""
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        path = uri[len("sqlite:///") :]
        if path and path != ":memory:":
            return "sqlite:///" + str(Path(path).absolute())
    elif "://" not in uri and Path(uri).is_dir():  # a plain folder (file store)
        return str(Path(uri).absolute())
    return uri
