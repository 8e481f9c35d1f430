"""Names to objects: the one place where rl8 turns a dotted path into a class.

Checkpoints, policy files and hyper-parameters name classes by dotted path
(``"rl8.envs.cartpole.CartPole"``, ``"torch.optim.Adam"``). Turning such a name into an object
imports a module; calling the object runs code. A name read from a file is therefore only used
as what it claims to be: :func:`resolve` imports it, then checks that the object is of the
claimed :class:`Kind` (an ``rl8.Env`` subclass, a ``Model`` subclass...) *before* anything
calls it, and raises :class:`~rl8.checkpoint.CheckpointError` otherwise. The path itself is
checked before it is imported (:func:`_check_path`: public parts only, no :data:`IMPORT_ACTS`,
installed modules only); ``trust_code=True`` lifts the path rules and allows a plain function
as an env factory. ``docs/security.md`` states every rule.

Names given in code (``PPO("mypkg.envs.MyEnv", model_cls="mypkg.Net")``) go through the same
functions with ``source=None``: a wrong kind is then a ``ValueError`` naming the field.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import keyword
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

__all__ = [
    "DISTRIBUTION", "ENV", "HPARAM_KINDS", "IMPORT_ACTS", "MODEL", "MODULE_CLASS", "OPTIMIZER",
    "Kind", "describe", "EnvTarget", "env_spec_string", "env_target", "import_path",
    "is_dotted_path", "qualified_name", "resolve", "resolve_env", "check_stored_hparams",
    "spec_from_env_info",
]

#: Top-level standard packages whose import (or that of one of their modules) does something on
#: its own: opens a browser (``antigravity``), prints (``this``, ``__hello__``, ``__phello__``),
#: starts a program (``idlelib``, ``turtledemo``, ``tkinter``, ``turtle``) or runs CPython's
#: test suite (``test.autotest``). A name read from a file may not import anything under them.
IMPORT_ACTS = frozenset({
    "antigravity", "this", "__hello__", "__phello__", "idlelib", "turtledemo", "tkinter", "turtle",
    "test",
})


class Kind(NamedTuple):
    """What a name must resolve to: ``description`` for messages, ``check(obj) -> bool``."""

    description: str
    check: Callable[[Any], bool]


def _subclass_of(module: str, name: str) -> Callable[[Any], bool]:
    """``obj`` is a class deriving from ``module.name`` (imported lazily: rl8 imports this module)."""
    return lambda obj: isinstance(obj, type) and issubclass(obj, getattr(importlib.import_module(module), name))


#: Model classes (``hparams.model_cls``, a config's ``model_cls``).
MODEL = Kind("an rl8 Model subclass (rl8.models.Model)", _subclass_of("rl8.models", "Model"))
#: Distribution classes (``hparams.distribution_cls``).
DISTRIBUTION = Kind("an rl8 Distribution subclass (rl8.distributions.Distribution)",
                    _subclass_of("rl8.distributions", "Distribution"))
#: Optimizer classes (``hparams.optimizer_cls``).
OPTIMIZER = Kind("a torch.optim.Optimizer subclass", _subclass_of("torch.optim", "Optimizer"))
#: Classes inside a model's config (e.g. ``activation=torch.nn.Tanh``).
MODULE_CLASS = Kind("a torch.nn.Module subclass", _subclass_of("torch.nn", "Module"))


def _is_env_kind(obj: Any) -> bool:
    """An ``rl8.Env`` subclass, a ``GymnasiumEnv`` factory, or a ``gymnasium.Env`` subclass."""
    import gymnasium

    from .env import Env
    from .envs.gymnasium import GymnasiumEnvFactory

    if isinstance(obj, GymnasiumEnvFactory):
        return True
    return isinstance(obj, type) and issubclass(obj, (Env, gymnasium.Env))


#: What an env spec names: an rl8 env class, a gymnasium env factory or class.
ENV = Kind("an rl8.Env subclass, a GymnasiumEnv.make_factory(...) factory or a gymnasium.Env "
           "subclass", _is_env_kind)

#: The hyper-parameters that name a class, and the kind each must be.
HPARAM_KINDS = {"model_cls": MODEL, "distribution_cls": DISTRIBUTION, "optimizer_cls": OPTIMIZER}


def qualified_name(obj: Any) -> str:
    """The dotted path of a class or function (``"rl8.envs.cartpole.CartPole"``); builtins by
    their bare name; anything without a name by its ``repr``."""
    module = getattr(obj, "__module__", None)
    name = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None)
    if name is None:
        return repr(obj)
    return f"{module}.{name}" if module and module != "builtins" else name


def describe(obj: Any) -> str:
    """What ``obj`` is, in a few words, for error messages (``"a builtin function"``...)."""
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
    gymnasium id (``"CartPole-v1"``, ``"ALE/Pong-v5"``): it has a dot, no slash, and does not
    start with an upper-case letter (gymnasium ids do; Python module names do not)."""
    return isinstance(spec, str) and "." in spec and "/" not in spec and not spec[0].isupper()


def _refuse(source: Any, message: str) -> Exception:
    from .checkpoint import CheckpointError

    return CheckpointError(f"{source}: {message}")


def _check_path(path: str, field: str, source: Any, trust_code: bool) -> list[str]:
    """The parts of ``path``; for an untrusted file, refuse paths that importing could abuse."""
    parts = path.split(".")
    if not all(part.isidentifier() and not keyword.iskeyword(part) for part in parts):
        message = f"{field} {path!r} is not a dotted path of Python names"
        raise _refuse(source, message) if source is not None else ValueError(message)
    if source is not None and not trust_code:
        if any(part.startswith("_") for part in parts):
            raise _refuse(
                source,
                f"{field} names {path!r}, which has a private or special part (starting with "
                "'_'); rl8 refused to import it from a file. Pass trust_code=True (rl8 "
                "--trust-code) if you trust the file (see docs/security.md)",
            )
        if parts[0] in IMPORT_ACTS:
            raise _refuse(
                source,
                f"{field} names {path!r}, in the module {parts[0]!r} whose import acts on its "
                "own; rl8 refused to import it from a file",
            )
        found_in = _working_dir_location(parts[0])
        if found_in is not None:
            raise _refuse(
                source,
                f"{field} names {path!r}, whose module {parts[0]!r} is not installed but found "
                f"in the current directory ({found_in}); rl8 imports installed modules only for a "
                "name read from a file. Pass trust_code=True (rl8 --trust-code) if you trust the "
                "file, or run rl8 from another folder (see docs/security.md)",
            )
    return parts


def _working_dir_location(top: str) -> str | None:
    """Where the top-level module ``top`` would be imported from when that is the current
    directory (which ``python -m`` and an interactive session put first on ``sys.path``);
    ``None`` when it is found elsewhere, is already imported, or is not found. Finding the
    spec of a top-level name imports nothing."""
    if top in sys.modules:
        return None
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if spec.submodule_search_locations:  # a package: the folders holding it
        locations = [Path(folder).parent for folder in spec.submodule_search_locations]
    elif spec.has_location and spec.origin:
        locations = [Path(spec.origin).parent]
    else:  # built-in or frozen
        return None
    cwd = Path.cwd().resolve()
    for location in locations:
        if location.resolve() == cwd:
            return str(cwd)
    return None


def import_path(path: str, *, field: str, source: Any = None, trust_code: bool = False) -> Any:
    """Import ``"pkg.module.Qual.Name"``: the longest importable module prefix, then attributes.

    Nothing is called: the module is imported (which runs its top-level code, as any import
    does) and attributes are read. See :func:`resolve` for ``field``, ``source`` and
    ``trust_code``.

    Raises:
        ImportError: Nothing of that name can be imported.
        rl8.checkpoint.CheckpointError: ``source`` is given and the path is refused.
        ValueError: ``source`` is ``None`` and the path is not a dotted path of names.
    """
    parts = _check_path(path, field, source, trust_code)
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
    where = f"named in {source} " if source is not None else ""
    hint = (" (loading a file imports the module its classes are defined in; define them in an "
            "importable module rather than a script's __main__)" if source is not None else "")
    raise ImportError(f"cannot import the {field} {path!r} {where}({error}){hint}")


def resolve(value: Any, kind: Kind, *, field: str, source: Any = None, trust_code: bool = False) -> Any:
    """``value`` as an object of ``kind``: a dotted path is imported, an object kept; ``None``
    stays ``None`` (the default is used). The kind is checked before anything is called.

    Args:
        value: A dotted path (``"torch.optim.Adam"``), the object itself, or ``None``.
        kind: What the object must be (:data:`MODEL`, :data:`DISTRIBUTION`, :data:`OPTIMIZER`,
            :data:`MODULE_CLASS`).
        field: Name of the setting, for messages (``"hparam model_cls"``).
        source: Where the name was read (a file path, shown in messages), or ``None`` for a
            value given in code.
        trust_code: For a name from a file: allow private paths and the modules of
            :data:`IMPORT_ACTS` (the kind is checked all the same).

    Raises:
        rl8.checkpoint.CheckpointError: ``source`` is given and the object is not of ``kind``
            (or its path is refused).
        ValueError: ``source`` is ``None`` and the object is not of ``kind``.
        ImportError: The path cannot be imported.
    """
    if value is None:
        return None
    obj = value
    if isinstance(value, str):
        obj = import_path(value, field=field, source=source, trust_code=trust_code)
    if kind.check(obj):
        return obj
    if source is None:
        raise ValueError(f"{field}: expected {kind.description} or its dotted path, got "
                         f"{value!r} ({describe(obj)})")
    raise _refuse(
        source,
        f"the file names {field} = {value!r}, which is {describe(obj)}, not "
        f"{kind.description}: an object of the wrong kind, and rl8 refused to call it",
    )


def _check_gymnasium_id(env_id: str, field: str, source: Any, trust_code: bool) -> None:
    """A ``"module:EnvId-v0"`` id makes gymnasium import ``module``: check it as a path."""
    module, colon, _ = env_id.partition(":")
    if colon:
        _check_path(module, field, source, trust_code)


def resolve_env(spec: Any, *, field: str = "env", source: Any = None, trust_code: bool = False,
                env_kwargs: Mapping[str, Any] | None = None) -> Any:
    """An env spec as something :func:`rl8.ppo.make_env` builds, checked before it is called.

    A dotted path is imported (:func:`import_path`); other strings are gymnasium ids and stay
    strings. For a spec read from a file (``source`` given) the object must be an
    ``rl8.Env`` subclass, a :meth:`GymnasiumEnv.make_factory
    <rl8.envs.GymnasiumEnv.make_factory>` factory or a ``gymnasium.Env`` subclass; a plain
    function (a user's env factory) is only called with ``trust_code=True``. A gymnasium id,
    and the ``env`` entry of ``env_kwargs`` for a ``GymnasiumEnv``, may name a module to import
    (``"module:Env-v0"``); that module path is checked like a dotted path.

    Args:
        spec: The env spec: a dotted path, a gymnasium id, or an object (returned as is when
            given in code).
        field: Name of the setting, for messages.
        source: The file the spec was read from, or ``None`` for a spec given in code.
        trust_code: Allow a plain function as env factory, and private paths.
        env_kwargs: The env's constructor arguments stored with the spec (checked for a
            ``GymnasiumEnv``'s ``env`` entry).

    Raises:
        rl8.checkpoint.CheckpointError: A spec from a file names an object of the wrong kind
            (or a refused path).
        ValueError: A spec given in code names something that is neither an env class nor
            callable.
        ImportError: The path cannot be imported.
    """
    if isinstance(spec, str) and not is_dotted_path(spec):
        if source is not None:
            _check_gymnasium_id(spec, field, source, trust_code)
        return spec
    obj = spec
    if isinstance(spec, str):
        obj = import_path(spec, field=field, source=source, trust_code=trust_code)
    if _is_env_kind(obj) or (callable(obj) and (source is None or trust_code)):
        if source is not None:
            from .envs.gymnasium import GymnasiumEnv

            if env_kwargs is not None and not isinstance(env_kwargs, Mapping):
                raise _refuse(source, f"{field} env_kwargs must be a dict, got {type(env_kwargs).__name__}")
            inner = (env_kwargs or {}).get("env")
            if isinstance(obj, type) and issubclass(obj, GymnasiumEnv) and isinstance(inner, str):
                _check_gymnasium_id(inner, f"{field} env_kwargs['env']", source, trust_code)
        return obj
    if source is None:
        raise ValueError(f"{field}: expected an rl8.Env subclass, a gymnasium id or a callable "
                         f"making a gymnasium env, got {spec!r} ({describe(obj)})")
    hint = (" A plain function is only called as an env factory with trust_code=True (rl8 "
            "--trust-code), for files you trust (see docs/security.md)." if callable(obj) else "")
    raise _refuse(
        source,
        f"the file names {field} = {spec!r}, which is {describe(obj)}, not {ENV.description}: "
        f"an object of the wrong kind, and rl8 refused to call it.{hint}",
    )


class EnvTarget(NamedTuple):
    """What an env spec builds (see :func:`env_target`).

    Attributes:
        target: The spec with a dotted path resolved: an ``rl8.Env`` subclass, a gymnasium id,
            a callable making a gymnasium env or a ``GymnasiumEnv`` factory.
        gymnasium: Whether :func:`rl8.ppo.make_env` wraps it in a
            :class:`~rl8.envs.GymnasiumEnv` (a gymnasium id or maker, a factory) rather than
            building an ``rl8.Env`` subclass directly.
    """

    target: Any
    gymnasium: bool


def env_target(spec: Any, *, source: Any = None, trust_code: bool = False) -> EnvTarget:
    """The one rule telling a dotted path from a gymnasium id, and an ``rl8.Env`` subclass
    from what :class:`~rl8.envs.GymnasiumEnv` wraps.

    Args:
        spec: An env spec: an ``rl8.Env`` subclass or a dotted path (``"rl8.envs.CartPole"``)
            to one, a gymnasium id (``"CartPole-v1"``), a callable making a gymnasium env, or
            a ``GymnasiumEnv`` factory.
        source: The file a dotted path was read from (checked as :func:`resolve_env` does),
            or ``None`` for a spec given in code.
        trust_code: See :func:`resolve_env`.

    Raises:
        TypeError: ``spec`` is none of these (and not a string).
    """
    from .env import Env

    target = resolve_env(spec, source=source, trust_code=trust_code) if is_dotted_path(spec) else spec
    if isinstance(target, type) and issubclass(target, Env):
        return EnvTarget(target, False)
    if isinstance(target, str) or callable(target):
        return EnvTarget(target, True)
    raise TypeError(
        f"env: expected an rl8.Env subclass, a gymnasium id or a callable making a gymnasium "
        f"env, got {spec!r}"
    )


def env_spec_string(spec: Any) -> str | None:
    """The env spec as a string that :func:`rl8.ppo.make_env` accepts, or ``None``.

    An :class:`rl8.Env` subclass or a module-level function becomes its dotted path (when
    importing that path gives the object back), a gymnasium id stays as is; anything else
    (lambdas, local functions, factory objects) cannot be named and gives ``None``.
    """
    if isinstance(spec, str):
        return spec
    if not (isinstance(spec, type) or inspect.isfunction(spec)):
        return None
    path = qualified_name(spec)
    if "<" in path:  # <lambda>, <locals>
        return None
    try:
        found = import_path(path, field="env")
    except (ImportError, ValueError):
        found = None
    if found is not spec:  # nested classes, objects replaced at import...
        return None
    # a dotted path is told from a gymnasium id by its lower-case start
    return path if is_dotted_path(path) else None


def spec_from_env_info(info: Mapping[str, Any] | None, *, source: Any, trust_code: bool) -> Any:
    """The checked env of a stored ``{"spec": ..., "env_kwargs": ...}`` entry (``None`` when it
    names none)."""
    info = info or {}
    spec = info.get("spec")
    if spec is None:
        return None
    if not isinstance(spec, str):
        raise _refuse(source, f"the stored env spec must be a string, got {type(spec).__name__}")
    return resolve_env(spec, source=source, trust_code=trust_code, env_kwargs=info.get("env_kwargs"))


def check_stored_hparams(hparams: Any, *, source: Any, trust_code: bool = False) -> None:
    """Import and check the classes named by hyper-parameters read from a file
    (``model_cls``, ``distribution_cls``, ``optimizer_cls``, see :func:`resolve`); the names
    stay as stored (PPO resolves them again, to the same objects)."""
    if not isinstance(hparams, Mapping):
        raise _refuse(source, f"the stored hyper-parameters must be a dict, got {type(hparams).__name__}")
    for key, kind in HPARAM_KINDS.items():
        value = hparams.get(key)
        if value is not None and not isinstance(value, str):
            raise _refuse(source, f"hparam {key} must be a dotted path (a str), got {type(value).__name__}")
        resolve(value, kind, field=f"hparam {key}", source=source, trust_code=trust_code)
