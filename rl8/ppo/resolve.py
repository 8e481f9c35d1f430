"""Names to objects: the one place where rl8 turns a dotted path into a class; a name read from a
file is looked up in :mod:`rl8.registry`, never imported (``docs/security.md``)."""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import gymnasium
import torch

from rl8 import registry
from rl8.envs.atari import is_atari_id
from rl8.envs.base import Env
from rl8.envs.gymnasium import GymnasiumEnv, GymnasiumEnvFactory
from rl8.envs.gymnasium_base import GymnasiumEnvBase
from rl8.envs.rsl_rl import is_rsl_rl_env
from rl8.envs.tasks import is_task_spec
from rl8.envs.torch_vector import is_torch_vector_env, vector_env_device
from rl8.policies.distributions import Distribution
from rl8.policies.models import Model
from rl8.registry import qualified_name

__all__ = [
    "ANY",
    "CheckpointError",
    "DISTRIBUTION",
    "ENV",
    "HPARAM_KINDS",
    "MODEL",
    "MODULE_CLASS",
    "OPTIMIZER",
    "Kind",
    "EnvTarget",
    "check_not_made_gymnasium_env",
    "check_stored_env_kwargs",
    "check_stored_hparams",
    "describe",
    "env_spec_string",
    "env_target",
    "import_user_path",
    "is_built_env",
    "is_dotted_path",
    "qualified_name",
    "resolve",
    "resolve_env",
    "spec_from_env_info",
    "working_dir_on_path",
]


class Kind(NamedTuple):
    """What a name must resolve to: ``description`` for messages, ``check(obj) -> bool``, and
    ``hand_over``: how to pass such an object when loading instead (``{attr}``: its name)."""

    description: str
    check: Callable[[Any], bool]
    hand_over: str = ""


def _subclass_of(base: type | tuple[type, ...]) -> Callable[[Any], bool]:
    return lambda obj: isinstance(obj, type) and issubclass(obj, base)


def _hparam(key: str) -> str:
    return f"Trainer.from_checkpoint(path, hparams={{{{'{key}': {{attr}}}}}})"


#: Model classes (``hparams.model_cls``, a policy file's ``model_cls``).
MODEL = Kind(
    "an rl8 Model subclass (rl8.policies.models.Model)",
    _subclass_of(Model),
    f"load_policy(path, model_cls={{attr}}), {_hparam('model_cls')} or rl8 eval/record/train "
    "--resume ... --model-cls {module}.{attr}",
)
#: Distribution classes (``hparams.distribution_cls``).
DISTRIBUTION = Kind(
    "an rl8 Distribution subclass (rl8.policies.distributions.Distribution)",
    _subclass_of(Distribution),
    f"load_policy(path, distribution_cls={{attr}}) or {_hparam('distribution_cls')}",
)
#: Optimizer classes (``hparams.optimizer_cls``).
OPTIMIZER = Kind(
    "a torch.optim.Optimizer subclass",  # a real one: torch.optim.Optimizer itself is abstract
    lambda obj: _subclass_of(torch.optim.Optimizer)(obj) and obj is not torch.optim.Optimizer,
    _hparam("optimizer_cls"),
)
#: Classes inside a model's config (e.g. ``activation=torch.nn.Tanh``).
MODULE_CLASS = Kind("a torch.nn.Module subclass", _subclass_of(torch.nn.Module))
#: Anything: what a policy file's model config may name with ``trust_code=True``.
ANY = Kind("any object", lambda obj: True)


def _is_env_kind(obj: Any) -> bool:
    return isinstance(obj, GymnasiumEnvFactory) or _subclass_of((Env, gymnasium.Env))(obj)


#: What an env spec names: an rl8 env class, a gymnasium env factory or class.
ENV = Kind(
    "an rl8.Env subclass, a GymnasiumEnv.make_factory(...) factory or a gymnasium.Env subclass",
    _is_env_kind,
    "Trainer.from_checkpoint(path, env={attr}), or --env {module}.{attr} on the command line",
)

#: The hyper-parameters that name a class, and the kind each must be.
HPARAM_KINDS = {"model_cls": MODEL, "distribution_cls": DISTRIBUTION, "optimizer_cls": OPTIMIZER}


def is_built_env(obj: Any) -> bool:
    """Whether ``obj`` is an env already built: an ``rl8.Env``, an rsl_rl ``VecEnv`` or a
    torch-batched gymnasium vector env (``docs/simulators.md``)."""
    return not isinstance(obj, type) and (
        isinstance(obj, Env) or is_rsl_rl_env(obj) or is_torch_vector_env(obj)
    )


def check_not_made_gymnasium_env(env: Any, num_envs: int) -> None:
    """A ``TypeError`` for a gymnasium env made already that rl8 does not take as it is, saying
    the form it takes, ``PPO("CartPole-v1", num_envs=4)`` (the env's id, else a maker): a
    ``gymnasium.Env`` that is not batched (``gymnasium.make``'s), or a gymnasium vector env without
    a device (``gymnasium.make_vec``'s, of numpy arrays).

    Args:
        env: What was given as PPO's env.
        num_envs: The ``num_envs`` of the form: PPO's, or the vector env's own.
    """
    if isinstance(env, gymnasium.vector.VectorEnv) and vector_env_device(env) is None:
        what = (
            f"a gymnasium vector env of numpy arrays ({env.num_envs} envs, as gymnasium.make_vec "
            "makes it; rl8 takes a vector env made already only when it is torch-batched, with a "
            "device)"
        )
    elif isinstance(env, gymnasium.Env) and not is_built_env(env):
        what = "a gymnasium env made already (one env, as gymnasium.make makes it)"
    else:
        return
    env_id = getattr(env.spec, "id", None)
    form = (
        f"PPO({env_id!r}, num_envs={num_envs})"
        if env_id is not None
        else f"PPO(make_one_env, num_envs={num_envs}), make_one_env a function or class that makes one env"
    )
    raise TypeError(
        f"env: got {what}; rl8 makes and batches gymnasium envs itself: {form} (gymnasium.make's "
        "arguments: env_kwargs={'env_kwargs': {...}}; docs/gymnasium.md)"
    )


def describe(obj: Any) -> str:
    """What ``obj`` is, in a few words, for error messages."""
    if inspect.isclass(obj):
        return f"the class {qualified_name(obj)}"
    if inspect.isbuiltin(obj):
        return "a builtin function"
    if inspect.isfunction(obj) or inspect.ismethod(obj):
        return "a function"
    if inspect.ismodule(obj):
        return "a module"
    return f"a {qualified_name(type(obj))} object"


def is_dotted_path(spec: Any) -> bool:
    """Whether an env spec string is a dotted path (``"rl8.envs.CartPole"``) rather than a
    gymnasium id (``"CartPole-v1"``, ``"ALE/Pong-v5"``, which start with an upper-case letter)."""
    return (
        isinstance(spec, str)
        and "." in spec
        and "/" not in spec
        and not spec[0].isupper()
        and not is_task_spec(spec)
    )


class CheckpointError(ValueError):
    """A file cannot be loaded as an rl8 checkpoint (corrupt, foreign, unsafe, or too new)."""


def _refuse(source: Any, message: str) -> CheckpointError:
    return CheckpointError(f"{source}: {message}")


def _wrong_kind(source: Any, field: str, name: Any, obj: Any, kind: Kind) -> Exception:
    return _refuse(
        source,
        f"the file names {field} = {name!r}, which is {describe(obj)}, not "
        f"{kind.description}: an object of the wrong kind, and rl8 refused to call it",
    )


def _import(path: str, field: str) -> Any:
    """Import ``"pkg.module.Qual.Name"``: the longest importable module prefix, then attributes."""
    parts = path.split(".")
    error: BaseException | None = None
    for i in range(len(parts) - 1, 0, -1):
        module = ".".join(parts[:i])
        try:
            obj: Any = importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name and not (module + ".").startswith(exc.name + "."):
                raise  # the module exists but one of its own imports is missing
            error = exc
            continue
        try:
            for name in parts[i:]:
                obj = getattr(obj, name)
        except AttributeError as exc:
            error = exc
            break
        return obj
    raise ImportError(f"cannot import the {field} {path!r} ({error})")


def import_user_path(path: str, *, field: str, search_working_dir: bool = False) -> Any:
    """Import a dotted path that YOU gave (never one read from a file); nothing is called.

    Args:
        path: ``"pkg.module.Qual.Name"``.
        field: Name of the setting, for messages (``"env"``, ``"hparam model_cls"``).
        search_working_dir: Put the current directory first on ``sys.path``, as ``python -m`` does.

    Raises:
        ValueError: ``path`` is not a dotted path of Python names.
        ImportError: Nothing of that name can be imported.
    """
    if not registry.is_name(path):
        raise ValueError(f"{field} {path!r} is not a dotted path of Python names")
    if search_working_dir:
        working_dir_on_path()
    return _import(path, field)


def working_dir_on_path() -> None:
    """Put the current directory first on ``sys.path`` unless it is there, as ``python -m`` does
    (the ``rl8`` console script does not): for the names you give and ``--trust-code``."""
    cwd = os.getcwd()
    if not any(os.path.abspath(entry or os.curdir) == cwd for entry in sys.path):
        sys.path.insert(0, cwd)


def _not_registered(name: str, kind: Kind, field: str, source: Any) -> Exception:
    module, _, attr = name.rpartition(".")
    hand_over = kind.hand_over.format(attr=attr, module="mymodule" if module == "__main__" else module)
    hand_over = f", or pass it yourself: {hand_over}" if hand_over else ""
    if module == "__main__":
        fix = (
            f"It was defined in a script or notebook (__main__): define it in this process, or register "
            f"it under that name with rl8.register({attr}, name={name!r}){hand_over}"
        )
    else:
        fix = (
            f"Import {module} before loading (a subclass of rl8.Env, gymnasium.Env, Model, Distribution or "
            f"torch.optim.Optimizer registers itself when defined; anything else: rl8.register({attr})){hand_over}; "
            "trust_code=True (rl8 --trust-code) imports it, for a file you trust"
        )
    return _refuse(
        source,
        f"the file names {field} = {name!r}, which is not registered in this process; rl8 "
        f"refused to import it (loading a file never imports a module that the file names). "
        f"{fix} (see docs/security.md)",
    )


def _named_object(name: str, kind: Kind, field: str, source: Any, trust_code: bool) -> Any:
    """From the registry, else imported (a name you gave, or ``trust_code``), else refused."""
    if not registry.is_name(name):
        message = f"{field} {name!r} is not a dotted path of Python names"
        raise _refuse(source, message) if source is not None else ValueError(message)
    obj = registry.lookup(name)
    if obj is not None:
        return obj
    if source is None:
        return import_user_path(name, field=field)
    if trust_code:
        return _import(name, f"{field} named in {source}")
    raise _not_registered(name, kind, field, source)


def resolve(value: Any, kind: Kind, *, field: str, source: Any = None, trust_code: bool = False) -> Any:
    """``value`` (a dotted path, the object, or ``None``, kept) as an object of ``kind``,
    checked before anything is called.

    Args:
        value: A dotted path (``"torch.optim.Adam"``), the object itself, or ``None``.
        kind: What the object must be (:data:`MODEL`, :data:`OPTIMIZER`...).
        field: Name of the setting, for messages (``"hparam model_cls"``).
        source: Where the name was read (a file path), or ``None`` for a value you gave.
        trust_code: For a name from a file: import it when the registry does not hold it.

    Raises:
        rl8.io.checkpoint.CheckpointError: A name from a file is refused (``ValueError`` for yours).
        ImportError: A name to import cannot be imported.
    """
    if value is None:
        return None
    obj = _named_object(value, kind, field, source, trust_code) if isinstance(value, str) else value
    if kind.check(obj):
        return obj
    if source is None:
        raise ValueError(
            f"{field}: expected {kind.description} or its dotted path, got {value!r} ({describe(obj)})"
        )
    raise _wrong_kind(source, field, value, obj, kind)


def _check_gymnasium_id(env_id: str, field: str, source: Any, trust_code: bool) -> None:
    """Unless ``trust_code``, refuse an id not in gymnasium's registry or whose ``module:`` is not imported."""
    if trust_code:
        return
    module, colon, bare = env_id.partition(":")
    if colon and module not in sys.modules:
        raise _refuse(
            source,
            f"the file names {field} = {env_id!r}, a gymnasium id that makes gymnasium import the module "
            f"{module!r}; rl8 refused to import it (loading a file never imports a module that the file "
            f"names). Import {module} before loading (it registers {bare!r} with gymnasium); "
            "trust_code=True (rl8 --trust-code) imports it, for a file you trust (see docs/security.md)",
        )
    env_id = bare if colon else env_id
    if is_atari_id(env_id):  # rl8's Atari preset registers ale_py's ids itself
        return
    if not registry.gymnasium_id_registered(env_id):
        raise _refuse(
            source,
            f"the file names {field} = {env_id!r}, a gymnasium id that is not in gymnasium's registry of "
            "this process; import the package that registers it before loading (see docs/security.md)",
        )


def check_stored_env_kwargs(
    target: Any, env_kwargs: Any, *, field: str = "env", source: Any, trust_code: bool = False
) -> None:
    """Check the constructor arguments stored for the env ``target`` (a dict; for a
    ``GymnasiumEnv``, its ``env`` entry a gymnasium id as a file may name), else raise a
    ``CheckpointError``."""
    if env_kwargs is not None and not isinstance(env_kwargs, Mapping):
        raise _refuse(source, f"{field} env_kwargs must be a dict, got {type(env_kwargs).__name__}")
    inner, wrappers = (env_kwargs or {}).get("env"), (env_kwargs or {}).get("wrappers")
    if isinstance(target, type) and issubclass(target, GymnasiumEnvBase) and wrappers:
        raise _refuse(
            source,
            f"{field} env_kwargs['wrappers'] must be empty or None in a file (a wrapper is a "
            f"callable, which a file cannot hold), got {wrappers!r:.200}; pass the env with its "
            "wrappers instead: Trainer.from_checkpoint(path, env=...)",
        )
    if isinstance(target, type) and issubclass(target, GymnasiumEnv) and isinstance(inner, str):
        _check_gymnasium_id(inner, f"{field} env_kwargs['env']", source, trust_code)


def resolve_env(
    spec: Any,
    *,
    field: str = "env",
    source: Any = None,
    trust_code: bool = False,
    env_kwargs: Mapping[str, Any] | None = None,
) -> Any:
    """An env spec as something :func:`rl8.ppo.algorithm.make_env` builds, checked before it
    is called (a spec from a file names an :data:`ENV` object or a function you registered);
    ``field``, ``source``, ``trust_code`` and the errors are :func:`resolve`'s (``trust_code``
    also allows any function and any gymnasium id).

    Args:
        spec: A dotted path, a gymnasium id, or an object (returned as is when you give it).
        env_kwargs: The env's constructor arguments stored with the spec.
    """
    if isinstance(spec, str) and not is_dotted_path(spec):
        if source is not None and not is_task_spec(
            spec
        ):  # a task names one of rl8's own makers (rl8.envs.tasks)
            _check_gymnasium_id(spec, field, source, trust_code)
        return spec
    obj = _named_object(spec, ENV, field, source, trust_code) if isinstance(spec, str) else spec
    if source is None:
        if _is_env_kind(obj) or callable(obj):
            return obj
        raise ValueError(
            f"{field}: expected an rl8.Env subclass, a gymnasium id or a callable "
            f"making a gymnasium env, got {spec!r} ({describe(obj)})"
        )
    if _is_env_kind(obj) or (callable(obj) and (trust_code or registry.is_user_registered(spec, obj))):
        check_stored_env_kwargs(obj, env_kwargs, field=field, source=source, trust_code=trust_code)
        return obj
    raise _wrong_kind(source, field, spec, obj, ENV)


class EnvTarget(NamedTuple):
    """What an env spec builds: ``target`` (a dotted path resolved) and whether it is
    ``gymnasium``'s (wrapped by :class:`~rl8.envs.GymnasiumEnv`) rather than an ``rl8.Env``."""

    target: Any
    gymnasium: bool


def env_target(spec: Any, *, source: Any = None, trust_code: bool = False) -> EnvTarget:
    """The :class:`EnvTarget` of an env ``spec`` (``TypeError`` if it is none): an ``rl8.Env``
    subclass or a dotted path to one, a gymnasium id, a named task (``"mjlab:<task id>"``), a built
    env, a callable making a gymnasium env (or an ``rl8.Env``), or a ``GymnasiumEnv`` factory;
    ``source`` and ``trust_code``: as in :func:`resolve_env`, for a dotted path."""
    target = resolve_env(spec, source=source, trust_code=trust_code) if is_dotted_path(spec) else spec
    if (
        isinstance(target, type)
        and issubclass(target, Env)
        or is_task_spec(target)
        or is_built_env(target)
    ):
        return EnvTarget(target, False)
    if isinstance(target, str) or callable(target):
        return EnvTarget(target, True)
    raise TypeError(
        f"env: expected an rl8.Env subclass, a gymnasium id, a named task, a callable making a gymnasium "
        f"env, or a built env (an rl8.Env, an rsl_rl VecEnv, a torch-batched vector env), got {spec!r}"
    )


def env_spec_string(spec: Any) -> str | None:
    """The env spec as a string that :func:`rl8.ppo.algorithm.make_env` accepts (a class or
    module-level function by its dotted path), or ``None`` when it cannot be named."""
    if isinstance(spec, str):
        return spec
    if not (isinstance(spec, type) or inspect.isfunction(spec)):
        return None
    path = qualified_name(spec)
    if "<" in path:  # <lambda>, <locals>
        return None
    if registry.lookup(path) is not spec and registry.bound_object(path) is not spec:
        return None  # nested classes, objects replaced at import...
    return path if is_dotted_path(path) else None


def spec_from_env_info(info: Mapping[str, Any] | None, *, source: Any, trust_code: bool) -> Any:
    """The checked env of a stored ``{"spec": ..., "env_kwargs": ...}`` entry, or ``None``."""
    info = info or {}
    spec = info.get("spec")
    if spec is None:
        return None
    if not isinstance(spec, str):
        raise _refuse(source, f"the stored env spec must be a string, got {type(spec).__name__}")
    return resolve_env(spec, source=source, trust_code=trust_code, env_kwargs=info.get("env_kwargs"))


def check_stored_hparams(
    hparams: Any, *, source: Any, trust_code: bool = False, given: Mapping[str, Any] | None = None
) -> None:
    """Check the classes that hyper-parameters read from a file name (:func:`resolve`),
    except those you hand over in ``given``."""
    if not isinstance(hparams, Mapping):
        raise _refuse(
            source, f"the stored hyper-parameters must be a dict, got {type(hparams).__name__}"
        )
    for key, kind in HPARAM_KINDS.items():
        value = hparams.get(key)
        if given is not None and given.get(key) is not None:
            continue
        if value is not None and not isinstance(value, str):
            raise _refuse(
                source, f"hparam {key} must be a dotted path (a str), got {type(value).__name__}"
            )
        resolve(value, kind, field=f"hparam {key}", source=source, trust_code=trust_code)
