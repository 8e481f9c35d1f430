"""Policy files (``docs/trainer.md``, ``docs/security.md``): what acting needs (spaces, classes
by dotted path, model config, weights), written atomically and read without executing code or
importing a module the file names (the classes are looked up in :mod:`rl8.registry`)."""

from __future__ import annotations

import math
import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gymnasium import spaces

from rl8.envs.spaces import space_to_dict
from rl8.io.checkpoint import (
    CheckpointError,
    download_artifact,
    is_run_ref,
    load_checkpoint,
    load_torch_file,
    save_checkpoint,
)
from rl8.io.checkpoint_dir import CheckpointManager
from rl8.io.rsl_rl import is_rsl_rl_checkpoint, rsl_rl_policy_description
from rl8.policies.policy import Policy
from rl8.ppo.resolve import ANY, DISTRIBUTION, MODEL, MODULE_CLASS, qualified_name, resolve

__all__ = [
    "MAX_SPACE_ELEMENTS",
    "MODEL_FLAVOR",
    "MODEL_POLICY_FILE",
    "POLICY_ARTIFACT",
    "POLICY_FORMAT",
    "check_env_spaces",
    "check_finite_weights",
    "load_policy",
    "load_rsl_rl_policy",
    "policy_from_dict",
    "policy_to_dict",
    "read_policy",
    "save_policy",
    "space_from_dict",
    "space_to_dict",
]

#: Value of the ``"format"`` entry of a policy file.
POLICY_FORMAT = "rl8-policy"
#: Version of the policy file layout.
POLICY_VERSION = 1
#: Where the Trainer stores the policy among an MLflow run's artifacts.
POLICY_ARTIFACT = "policy/policy.pt"
#: The flavor of an rl8 policy in an MLflow model folder's ``MLmodel`` (:mod:`rl8.io.mlflow_model`).
MODEL_FLAVOR = "rl8"
#: The policy file of an MLflow model folder, the only file its ``rl8`` flavor may name.
MODEL_POLICY_FILE = "policy.pt"
#: Most elements a space read from a file may declare (in all), checked before anything is
#: allocated, so that a crafted file cannot ask for gigabytes.
MAX_SPACE_ELEMENTS = 2**24


def _space_elements(d: Any, where: str) -> int:
    """The elements a space description declares, checked to be well formed (no allocation)."""

    def bad(message: str) -> CheckpointError:
        return CheckpointError(f"{where}: {message}")

    def count(value: Any, name: str) -> int:
        if isinstance(value, torch.Tensor):
            if value.dtype.is_floating_point or value.dtype.is_complex or value.dim() > 1:
                raise bad(
                    f"{name} must be a 1-d integer tensor, got {value.dtype} of shape {list(value.shape)}"
                )
            value = value.tolist()
        items = value if isinstance(value, (list, tuple)) else [value]
        if not all(type(x) is int and x >= 0 for x in items):  # [] : a scalar Box
            raise bad(f"{name} must be an int >= 0 or a list of them, got {value!r:.80}")
        return math.prod(items)

    if not isinstance(d, Mapping):
        raise bad(f"expected a space description (a dict), got {type(d).__name__}")
    kind = d.get("type")
    if kind == "Box":
        for key in ("low", "high"):
            if not isinstance(d.get(key), torch.Tensor):
                raise bad(f"'{key}' must be a tensor, got {type(d.get(key)).__name__}")
        return count(d.get("shape"), "'shape'")
    if kind in ("Discrete", "MultiBinary"):
        return count(d.get("n"), "'n'")
    if kind == "MultiDiscrete":
        nvec = d.get("nvec")
        if (
            not isinstance(nvec, torch.Tensor)
            or nvec.dtype.is_floating_point
            or nvec.numel() > MAX_SPACE_ELEMENTS
        ):
            raise bad(f"'nvec' must be an integer tensor of at most {MAX_SPACE_ELEMENTS} values")
        if bool((nvec < 0).any()):
            raise bad("'nvec' must hold ints >= 0")
        return int(nvec.sum())
    if kind == "Dict":
        subs = d.get("spaces")
        if not isinstance(subs, (list, tuple)) or not all(
            isinstance(s, (list, tuple)) and len(s) == 2 and isinstance(s[0], str) for s in subs
        ):
            raise bad("'spaces' must be a list of [name, space] pairs")
        return sum(_space_elements(sub, f"{where}[{key!r}]") for key, sub in subs)
    raise bad(f"unknown space description {kind!r}")


def space_from_dict(d: Mapping[str, Any], *, where: str = "space") -> spaces.Space:
    """Rebuild a space from its description ``d`` (:func:`space_to_dict`); a ``CheckpointError``
    naming ``where`` (what ``d`` is: ``"policy.pt: observation_space"``) for a bad description or
    one of more than :data:`MAX_SPACE_ELEMENTS` elements."""
    elements = _space_elements(d, where)
    if elements > MAX_SPACE_ELEMENTS:
        raise CheckpointError(
            f"{where}: the space declares {elements} elements, more than rl8 loads "
            f"(MAX_SPACE_ELEMENTS = {MAX_SPACE_ELEMENTS}); the file is damaged or crafted"
        )
    kind = d["type"]
    try:
        if kind == "Box":
            dtype = np.dtype(d["dtype"])
            low = d["low"].numpy().astype(dtype)
            high = d["high"].numpy().astype(dtype)
            return spaces.Box(low, high, tuple(d["shape"]), dtype)
        if kind == "Discrete":
            return spaces.Discrete(int(d["n"]), start=int(d["start"]))
        if kind == "MultiDiscrete":
            return spaces.MultiDiscrete(
                d["nvec"].numpy(), dtype=np.dtype(d["dtype"]), start=d["start"].numpy()
            )
        if kind == "MultiBinary":
            return spaces.MultiBinary(d["n"])
        return spaces.Dict(
            {key: space_from_dict(sub, where=f"{where}[{key!r}]") for key, sub in d["spaces"]}
        )
    except CheckpointError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError, RuntimeError) as exc:
        missing = (
            f"no entry {exc}"
            if isinstance(exc, KeyError)
            else str(exc).splitlines()[0]
            if str(exc)
            else ""
        )
        raise CheckpointError(
            f"{where}: not a valid {kind} space description ({type(exc).__name__}: {missing})"
        ) from None


def check_env_spaces(
    env: Any,
    observation_space: spaces.Space,
    action_space: spaces.Space,
    *,
    what: str,
    source: Any,
    actor_space: spaces.Space | None = None,
) -> None:
    """Raise ``ValueError`` when ``env``'s spaces differ from those a policy was trained on.

    Args:
        env: The env (an :class:`rl8.Env`: its ``observation_space`` and ``action_space``).
        observation_space: The policy's observation space.
        action_space: The policy's action space.
        what: The env as the caller names it in the message (``"--env CartPole-v1"``).
        source: Where the policy comes from (a path), for the message.
        actor_space: For an env the policy only acts in: the part of the observation space its
            actor reads (:attr:`rl8.Policy.actor_observation_space`); a ``Dict`` observation
            space with those entries is accepted too (a robot's env without the critic's
            privileged groups). ``None``: the spaces must be the same.
    """
    for name, expected in (("observation", observation_space), ("action", action_space)):
        given = getattr(env, f"{name}_space")
        if given == expected or (name == "observation" and _has_entries(given, actor_space)):
            continue
        enough = (
            f" or a Dict observation space with the actor's entries {actor_space}"
            if name == "observation" and isinstance(actor_space, spaces.Dict)
            else ""
        )
        raise ValueError(
            f"{what} has the {name} space {given}, but the policy of {source} was trained "
            f"on the {name} space {expected}; the policy can only act in an env with the "
            f"same spaces{enough}"
        )


def _has_entries(given: spaces.Space, needed: spaces.Space | None) -> bool:
    """Whether ``given`` is a ``Dict`` space with each entry of the ``Dict`` ``needed``."""
    return (
        isinstance(given, spaces.Dict)
        and isinstance(needed, spaces.Dict)
        and all(given.spaces.get(key) == sub for key, sub in needed.spaces.items())
    )


def _to_plain(value: Any) -> Any:
    """Model config values as plain data: classes and functions become ``{"__class__": path}``."""
    if isinstance(value, Mapping):
        return {str(k): _to_plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_to_plain(v) for v in value)
    if isinstance(value, type) or callable(value) and hasattr(value, "__qualname__"):
        return {"__class__": qualified_name(value)}
    return value


def _from_plain(value: Any, source: Any, trust_code: bool, where: str = "model_config") -> Any:
    """Model config values from plain data: ``{"__class__": path}`` becomes the class, which
    must be a ``torch.nn.Module`` subclass (an activation...) unless ``trust_code``."""
    if isinstance(value, Mapping):
        if set(value) == {"__class__"}:
            kind = ANY if trust_code else MODULE_CLASS
            return resolve(value["__class__"], kind, field=where, source=source, trust_code=trust_code)
        return {k: _from_plain(v, source, trust_code, f"{where}[{k!r}]") for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(
            _from_plain(v, source, trust_code, f"{where}[{i}]") for i, v in enumerate(value)
        )
    return value


def _stored_class(
    d: Mapping[str, Any], key: str, kind: Any, source: Any, trust_code: bool, given: Any
) -> Any:
    """The class of ``kind`` whose dotted path is stored under ``key``, or ``given`` (yours)."""
    if given is not None:
        return resolve(given, kind, field=key)
    value = d.get(key)
    if not isinstance(value, str):
        raise CheckpointError(
            f"{source}: {key} must be a dotted path (a str), got {type(value).__name__}"
        )
    return resolve(value, kind, field=key, source=source, trust_code=trust_code)


def policy_to_dict(
    policy: Any, *, include_state: bool = True, env: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The dict a policy file holds: a :class:`~rl8.policies.policy.Policy` as plain data.

    Args:
        policy: The policy (e.g. ``algo.policy``).
        include_state: Include the weights (``state_dict``, moved to the CPU).
        env: Optional description of the env the policy acts in (see :func:`save_policy`).
    """
    out = {
        "format": POLICY_FORMAT,
        "version": POLICY_VERSION,
        "observation_space": space_to_dict(policy.observation_space),
        "action_space": space_to_dict(policy.action_space),
        "model_cls": qualified_name(policy.model_cls),
        "model_config": _to_plain(policy.model_config),
        "distribution_cls": qualified_name(policy.distribution_cls),
        "normalize_observations": policy.obs_normalizer is not None,
        "env": _to_plain(env) if env is not None else None,
    }
    if include_state:
        out["state_dict"] = {k: v.detach().cpu().clone() for k, v in policy.state_dict().items()}
    return out


def policy_from_dict(
    d: Mapping[str, Any],
    *,
    map_location: Any = "cpu",
    source: Any = None,
    trust_code: bool = False,
    model_cls: Any = None,
    distribution_cls: Any = None,
) -> Any:
    """Build a :class:`~rl8.policies.policy.Policy` (in eval mode) from :func:`policy_to_dict`'s
    output, its classes looked up in :mod:`rl8.registry` and checked before anything is called.

    Args:
        d: The description, with its ``state_dict``.
        map_location: Device of the policy's parameters.
        source: Where ``d`` was read from (a path, shown in messages), or ``None``.
        trust_code: Trust the file: import the names the registry does not hold and allow any
            object in the model config.
        model_cls: The model class (or your dotted path to it) to use instead of the stored one.
        distribution_cls: Likewise for the distribution class.

    Raises:
        ValueError: Not a policy description this rl8 reads, or a class given of another kind.
        rl8.io.checkpoint.CheckpointError: A class is not registered or of the wrong kind, or an
            entry is malformed, non-finite or does not match the model; the message names it.
    """
    if not isinstance(d, Mapping):
        raise ValueError(f"not an rl8 policy (a {type(d).__name__}, expected a dict)")
    if d.get("format") != POLICY_FORMAT:
        raise ValueError(f"not an rl8 policy (format {d.get('format')!r}, expected {POLICY_FORMAT!r})")
    version = d.get("version")
    if not isinstance(version, int) or version > POLICY_VERSION:
        raise ValueError(
            f"policy format version {version!r} is not supported (this rl8 reads up to "
            f"{POLICY_VERSION}); upgrade rl8"
        )
    if "state_dict" not in d:
        raise ValueError("the policy description holds no weights (state_dict)")
    source = "the policy description" if source is None else source
    state = d["state_dict"]
    if not isinstance(state, Mapping) or not all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items()
    ):
        raise CheckpointError(
            f"{source}: entry 'state_dict' must be a dict of tensors by name, got {type(state).__name__}"
        )
    check_finite_weights(state, f"{source}:")
    if not isinstance(d.get("model_config") or {}, Mapping):
        raise CheckpointError(
            f"{source}: entry 'model_config' must be a dict, got {type(d['model_config']).__name__}"
        )
    model_cls = _stored_class(d, "model_cls", MODEL, source, trust_code, model_cls)
    distribution_cls = _stored_class(
        d, "distribution_cls", DISTRIBUTION, source, trust_code, distribution_cls
    )
    model_config = _from_plain(d.get("model_config") or {}, source, trust_code)
    observation_space = space_from_dict(
        d.get("observation_space"), where=f"{source}: entry 'observation_space'"
    )
    action_space = space_from_dict(d.get("action_space"), where=f"{source}: entry 'action_space'")
    try:
        policy = Policy(
            observation_space,
            action_space,
            model_cls=model_cls,
            model_config=model_config,
            distribution_cls=distribution_cls,
            device=map_location,
            normalize_observations=bool(d.get("normalize_observations", False)),
        )
    except (TypeError, ValueError, KeyError) as exc:  # what the file's model_config asks for
        raise CheckpointError(
            f"{source}: the policy it describes cannot be built (entry 'model_config' "
            f"{d.get('model_config')!r:.200}): {exc}"
        ) from None
    try:
        policy.load_state_dict(state)
    except RuntimeError as exc:  # missing, unexpected or differently shaped weights
        detail = " ".join(line.strip() for line in str(exc).splitlines()[1:4])
        raise CheckpointError(
            f"{source}: entry 'state_dict' does not match the model that its "
            f"'model_config' and spaces describe: {detail}"
        ) from None
    policy.eval()
    return policy


def check_finite_weights(state: Mapping[str, torch.Tensor], where: str) -> None:
    """Refuse (``CheckpointError``) weights holding NaN or inf; ``where`` begins the message."""
    bad = [k for k, v in state.items() if v.is_floating_point() and not bool(torch.isfinite(v).all())]
    if bad:
        raise CheckpointError(
            f"{where} the policy's weights hold NaN or inf: state_dict[{bad[0]!r}]"
            + (f" and {len(bad) - 1} more" if len(bad) > 1 else "")
            + " (written by a run that diverged, or damaged); use an earlier checkpoint"
        )


def save_policy(policy: Any, path: str | os.PathLike[str], *, env: dict[str, Any] | None = None) -> Path:
    """Write a policy file atomically; returns the path written.

    Args:
        policy: A :class:`~rl8.policies.policy.Policy`, e.g. ``algo.policy``.
        path: Destination file (conventionally ``*.pt``); its folder is created if missing.
        env: Optional description of the env, ``{"spec": ..., "env_kwargs": ...,
            "env_config": ...}`` (``rl8 eval`` uses it).

    Raises:
        TypeError: ``policy`` is not a Policy (a :class:`~rl8.PPO`: pass ``algo.policy``).
    """
    if not isinstance(policy, Policy):
        given = type(policy).__name__
        owner = " (it holds one: pass its .policy, e.g. save_policy(algo.policy, path))"
        raise TypeError(
            f"save_policy: policy must be a rl8.policies.policy.Policy, got a {given}"
            f"{owner if isinstance(getattr(policy, 'policy', None), Policy) else ''}"
        )
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return save_checkpoint(policy_to_dict(policy, env=env), path)


def _policy_from_checkpoint_state(state: Mapping[str, Any], source: Any) -> dict[str, Any]:
    if state.get("format") == POLICY_FORMAT:
        return dict(state)
    trainer = state.get("trainer")
    algo = state.get("algo")
    if isinstance(trainer, Mapping) and isinstance(algo, Mapping) and "policy" in trainer:
        return {**trainer["policy"], "state_dict": algo["policy"]}
    raise CheckpointError(
        f"{source} is an rl8 checkpoint but holds no policy (neither a policy file nor a "
        f"Trainer checkpoint)"
    )


def _model_policy_file(folder: Path, source: Any) -> Path:
    """The policy file of an MLflow model folder, after checking that its ``MLmodel`` (read as
    YAML data: nothing imported, no pickle) names the ``rl8`` flavor with ``policy.pt``."""
    import yaml

    try:
        meta = yaml.safe_load((folder / "MLmodel").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise CheckpointError(
            f"{source}: its MLmodel file cannot be read ({type(exc).__name__}: {exc})"
        ) from None
    flavors = meta.get("flavors") if isinstance(meta, Mapping) else None
    flavor = flavors.get(MODEL_FLAVOR) if isinstance(flavors, Mapping) else None
    if not isinstance(flavor, Mapping) or flavor.get("data") != MODEL_POLICY_FILE:
        names = sorted(map(str, flavors)) if isinstance(flavors, Mapping) else []
        raise CheckpointError(
            f"{source} is an MLflow model folder but not an rl8 policy: its MLmodel has no "
            f"{MODEL_FLAVOR!r} flavor with data {MODEL_POLICY_FILE!r} (flavors: {names}); rl8 loads "
            "only its own flavor's policy file, never a pickled python_model or a loader module"
        )
    return folder / MODEL_POLICY_FILE


def read_policy(
    run_id_or_path: str | os.PathLike[str], *, tracking_uri: str | None = None
) -> dict[str, Any]:
    """The policy description (see :func:`policy_to_dict`) that ``run_id_or_path`` names, as for
    :func:`load_policy` (a folder without checkpoints: its ``policy.pt``; run ids of the store
    ``tracking_uri``, ``None``: MLflow's default), with the same errors."""
    ref = os.fspath(run_id_or_path)
    path, model = Path(ref), ref.startswith("models:/")
    if model or not path.exists():
        if not model and not is_run_ref(ref):
            raise FileNotFoundError(f"no policy at {ref!r}: not a file or folder, nor an MLflow run id")
        with tempfile.TemporaryDirectory(prefix="rl8-policy-") as tmp:
            local = download_artifact(ref, "" if model else POLICY_ARTIFACT, tracking_uri, tmp)
            if model or (local / "MLmodel").is_file():  # runs:/ID/policy is a model folder too
                local = _model_policy_file(local, ref)
            return _policy_from_checkpoint_state(load_checkpoint(local), ref if model else f"run {ref}")
    if (path / "MLmodel").is_file():
        path = _model_policy_file(path, path)
    elif path.is_dir():
        latest = CheckpointManager(path, keep_last=None).latest()
        if latest is None:
            latest = path / "policy.pt"
            if not latest.is_file():
                raise FileNotFoundError(f"{path} holds neither checkpoint-*.pt files nor a policy.pt")
        path = latest
    state = load_torch_file(path)
    if is_rsl_rl_checkpoint(state):  # the weights of rsl_rl's runner: an MLP actor, mapped
        return _rsl_rl_description(state, path)
    return _policy_from_checkpoint_state(load_checkpoint(path), path)


def _rsl_rl_description(state: Mapping[str, Any], source: Any, **options: Any) -> dict[str, Any]:
    description = rsl_rl_policy_description(state, source=source, **options)
    return {"format": POLICY_FORMAT, "version": POLICY_VERSION, **description}


def load_policy(
    run_id_or_path: str | os.PathLike[str],
    *,
    map_location: Any = "cpu",
    tracking_uri: str | None = None,
    trust_code: bool = False,
    model_cls: Any = None,
    distribution_cls: Any = None,
) -> Any:
    """Load a :class:`rl8.Policy` (in eval mode; ``policy(obs)`` gives deterministic env
    actions) without any training state.

    Args:
        run_id_or_path: A policy file, a Trainer checkpoint file, a folder of checkpoints (the
            latest), an MLflow model folder of the ``rl8`` flavor, an MLflow run id or
            ``runs:/`` URI (its ``policy/policy.pt`` artifact), or a ``models:/`` URI: a logged
            model (``models:/m-...``), a registered version (``models:/NAME/VERSION``) or alias
            (``models:/NAME@ALIAS``); a model folder's ``MLmodel`` must name the ``rl8`` flavor
            (see ``docs/security.md``).
        map_location: Device for the parameters.
        tracking_uri: MLflow tracking URI (and registry) of run ids and ``models:/`` URIs
            (``None``: MLflow's default).
        trust_code: Trust the file: the only way to import a module the file names.
        model_cls: The model class to use instead of the stored one (e.g. one a notebook
            defined); ``None``: the stored one.
        distribution_cls: Likewise for the distribution class.

    Raises:
        FileNotFoundError: Nothing found at ``run_id_or_path``.
        rl8.io.checkpoint.CheckpointError: A corrupt, truncated, foreign or unsafe file, or one
            that names a class that is not registered or of the wrong kind.
        rl8.mlflow_store.StoreSchemaError: A run id or ``models:/`` URI of a SQLite store that a
            newer MLflow than the installed one wrote.
    """
    description = read_policy(run_id_or_path, tracking_uri=tracking_uri)
    return policy_from_dict(
        description,
        map_location=map_location,
        source=os.fspath(run_id_or_path),
        trust_code=trust_code,
        model_cls=model_cls,
        distribution_cls=distribution_cls,
    )


def load_rsl_rl_policy(
    path: str | os.PathLike[str],
    *,
    model: str | None = None,
    observation_space: spaces.Space | None = None,
    obs_groups: Sequence[str] | None = None,
    activation: str = "elu",
    map_location: Any = "cpu",
) -> Any:
    """An rsl_rl checkpoint's MLP model (``model_<iteration>.pt``) as an :class:`rl8.Policy` in
    eval mode, read with ``torch.load(weights_only=True)``; :func:`load_policy` reads such a file
    with the defaults (the observations a flat ``Box``).

    Args:
        path: The checkpoint file.
        model: ``"actor"`` (``OnPolicyRunner``), ``"student"`` or ``"teacher"``
            (``DistillationRunner``), ``"model"`` (rsl_rl 2 to 4's ``ActorCritic``); ``None``: the
            actor, else the student.
        observation_space: The env's observation space (a ``Dict`` of groups, e.g.
            ``env.observation_space``); ``None``: an unbounded ``Box`` of the model's input width.
        obs_groups: The groups of a ``Dict`` space that the model reads, in rsl_rl's order (its
            ``obs_groups`` set, e.g. ``["policy"]``, or the teacher's ``["policy", "privileged"]``).
        activation: The hidden layers' activation (the file does not record it; rsl_rl's default
            ``"elu"``).
        map_location: Device for the parameters.

    Raises:
        rl8.io.checkpoint.CheckpointError: Not an rsl_rl checkpoint, an unsafe file, or a layout
            rl8 cannot map (naming the keys found and expected).
    """
    state = load_torch_file(path)
    if not is_rsl_rl_checkpoint(state):
        found = sorted(map(str, state)) if isinstance(state, Mapping) else type(state).__name__
        raise CheckpointError(
            f"{path} is not an rsl_rl checkpoint: expected an 'iter' entry and a model's weights "
            f"(actor_state_dict, student_state_dict, teacher_state_dict or model_state_dict), found {found}"
        )
    options = {"model": model, "observation_space": observation_space, "obs_groups": obs_groups}
    description = _rsl_rl_description(state, path, activation=activation, **options)
    return policy_from_dict(description, map_location=map_location, source=path)
