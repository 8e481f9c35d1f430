"""The names that checkpoints and policy files may use for classes (``docs/security.md``).

A file names the classes rl8 builds by their dotted path; loading it never imports a module the
file names: the name is looked up here, among rl8's own classes, torch's optimizers and modules,
the existing subclasses of rl8's and torch's base classes, and what you :func:`register`.
"""

from __future__ import annotations

import importlib
import inspect
import keyword
import sys
from collections.abc import Iterator
from typing import Any

__all__ = ["lookup", "register"]

_USER: dict[str, Any] = {}  # what you registered: name -> object
#: rl8's modules whose public classes files may name (one is imported when a file names it).
_RL8_MODULES = (
    "rl8.envs.base",
    "rl8.envs.cartpole",
    "rl8.envs.pendulum",
    "rl8.envs.dummy",
    "rl8.envs.memory",
    "rl8.envs.catch",
    "rl8.envs.gymnasium",
    "rl8.envs.pool",
    "rl8.envs.jax",
    "rl8.policies.models",
    "rl8.policies.encoders",
    "rl8.policies.recurrent",
    "rl8.policies.distributions",
    "rl8.policies.distributions.base",
    "rl8.policies.distributions.discrete",
    "rl8.policies.distributions.continuous",
)
#: rl8's public namespaces (``rl8.X``, ``rl8.envs.X``) and the name of their table of lazy exports.
_PUBLIC = {"rl8": "_EXPORTS", "rl8.envs": "_ENVS"}
#: Base classes whose subclasses are registered by existing.
_AUTO_BASES = (
    ("rl8.envs.base", "Env"),
    ("gymnasium", "Env"),
    ("rl8.policies.models", "Model"),
    ("rl8.policies.distributions", "Distribution"),
    ("torch.optim", "Optimizer"),
)


def qualified_name(obj: Any) -> str:
    """The dotted path of a class or function; builtins by their bare name; else the ``repr``."""
    module = getattr(obj, "__module__", None)
    name = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None)
    if name is None:
        return repr(obj)
    return f"{module}.{name}" if module and module != "builtins" else name


def is_name(name: Any) -> bool:
    """Whether ``name`` is a dotted path of Python names (``"pkg.mod.Class"``)."""
    return isinstance(name, str) and all(
        part.isidentifier() and not keyword.iskeyword(part) for part in name.split(".")
    )


def register(obj: Any = None, name: str | None = None) -> Any:
    """Let checkpoints and policy files name ``obj`` (a class of yours or an env factory
    function); returns ``obj``, so it also works as a decorator. A name registered again for
    an object of the same qualified name (a notebook cell run again) is replaced.

    Args:
        obj: The class or function.
        name: An extra dotted path files use for it (e.g. its module before a move); it is
            registered under its qualified name in any case.

    Raises:
        ValueError: ``name`` is not a dotted path, or is registered for another object.
        TypeError: ``obj`` is not a class or module-level function.
    """
    if obj is None:
        return lambda target: register(target, name)
    own = qualified_name(obj)
    if not hasattr(obj, "__qualname__") or "<" in own:
        raise TypeError(
            f"register: expected a class or a module-level function, got {obj!r}, whose name "
            f"{own!r} files cannot use (a lambda or a local object)"
        )
    names = [own] if name is None or name == own else [name, own]
    for each in names:
        if not is_name(each):
            raise ValueError(
                f"register: name must be a dotted path of Python names ('pkg.module.Class'), got {each!r}"
            )
        old = _USER.get(each)
        if old is not None and old is not obj and qualified_name(old) != own:
            raise ValueError(
                f"register: the name {each!r} is registered already for {qualified_name(old)}; "
                f"choose another name for {own}"
            )
    for each in names:
        _USER[each] = obj
    return obj


def lookup(name: str) -> Any:
    """The object that files may name ``name`` (a dotted path) in this process, or ``None``.
    Imports no module, except one of rl8's own when ``name`` names a class of it."""
    if not is_name(name):
        return None
    if name in _USER:
        return _USER[name]
    return _rl8_object(name) or _torch_object(name) or _existing_subclass(name)


def is_user_registered(name: str, obj: Any) -> bool:
    """Whether you registered ``obj`` under ``name`` (a file may then name it as env factory)."""
    return _USER.get(name) is obj


def bound_object(path: str) -> Any:
    """The object at ``path`` in an already imported module, read without importing or calling
    ``__getattr__``; ``None`` if there is none."""
    parts = path.split(".")
    for i in range(len(parts) - 1, 0, -1):
        module = sys.modules.get(".".join(parts[:i]))
        if module is None:
            continue
        obj: Any = module
        for part in parts[i:]:
            obj = inspect.getattr_static(obj, part, None)
            if obj is None:
                return None
        return obj
    return None


def gymnasium_id_registered(env_id: str) -> bool:
    """Whether gymnasium's registry holds ``env_id`` (any version of an id without one)."""
    import gymnasium
    from gymnasium.envs.registration import find_highest_version, parse_env_id

    if env_id in gymnasium.registry:
        return True
    try:
        namespace, name, version = parse_env_id(env_id)
    except gymnasium.error.Error:
        return False
    return version is None and find_highest_version(namespace, name) is not None


#: The modules by which files written before rl8's modules moved into packages (checkpoints and
#: policy files of commit 13e50a1 and earlier) name classes -> the modules of those classes now.
STORED_MODULES: dict[str, str] = {
    "rl8.atari": "rl8.envs.atari",
    "rl8.distributions": "rl8.policies.distributions",
    "rl8.encoders": "rl8.policies.encoders",
    "rl8.env": "rl8.envs.base",
    "rl8.models": "rl8.policies.models",
    "rl8.recurrent": "rl8.policies.recurrent",
}


def _rl8_object(name: str) -> Any:
    """The public class of :data:`_RL8_MODULES` that ``name`` names (by its module's path, its
    public path or its path before the move, :data:`STORED_MODULES`: ``"rl8.models.MLPModel"``,
    tests/test_legacy_files.py), else ``None``."""
    module_name, _, attr = name.rpartition(".")
    module_name = STORED_MODULES.get(module_name, module_name)
    if module_name in _PUBLIC:
        exports = getattr(importlib.import_module(module_name), _PUBLIC[module_name])
        module_name = exports.get(attr, "")
    if module_name not in _RL8_MODULES:
        return None
    module = importlib.import_module(module_name)
    obj = getattr(module, attr, None) if attr in getattr(module, "__all__", ()) else None
    return obj if isinstance(obj, type) else None


def _torch_object(name: str) -> Any:
    """The ``torch.optim`` optimizer or ``torch.nn`` module class ``name`` names (its qualified
    name, or ``torch.optim.X`` / ``torch.nn.X``), else ``None``: never one found through the
    attributes of another module (``torch.nn.functional.torch.fx.GraphModule``)."""
    import torch

    for prefix, base in (("torch.optim.", torch.optim.Optimizer), ("torch.nn.", torch.nn.Module)):
        if name.startswith(prefix):
            obj = bound_object(name)
            ok = isinstance(obj, type) and issubclass(obj, base)
            return obj if ok and name in (qualified_name(obj), prefix + obj.__name__) else None
    return None


def _subclasses(base: type) -> Iterator[type]:
    """Every subclass of ``base`` that exists, at any depth (one may come twice)."""
    for sub in type.__subclasses__(base):
        yield sub
        yield from _subclasses(sub)


def _existing_subclass(name: str) -> Any:
    """The subclass of one of :data:`_AUTO_BASES` whose qualified name is ``name``; of several
    (a class defined again), the one its module binds to that name now."""
    found: list[type] = []
    for module_name, attr in _AUTO_BASES:
        base = getattr(sys.modules.get(module_name), attr, None)
        if base is not None:
            found += [
                cls for cls in _subclasses(base) if qualified_name(cls) == name and cls not in found
            ]
    if not found:
        return None
    bound = bound_object(name)
    return bound if bound in found else found[-1]
