"""The names that checkpoints and policy files may use for classes.

A checkpoint or policy file names the classes rl8 builds (the env, the model, the action
distribution, the optimizer, an activation in a model's config) by their dotted path, such as
``"rl8.envs.cartpole.CartPole"``. **Loading a file never imports a module that the file
names**: the name is looked up here, among the objects of the running process that rl8 knows:

* rl8's own envs, models, encoders and distributions, the optimizers of ``torch.optim`` and
  the module classes of ``torch.nn`` (activations...), under the paths of the modules that
  define them and under their public paths (``rl8.envs.CartPole``, ``torch.optim.Adam``);
* every subclass of :class:`rl8.Env`, ``gymnasium.Env``, :class:`rl8.policies.models.Model`,
  :class:`rl8.policies.distributions.Distribution` and ``torch.optim.Optimizer`` that exists in this
  process (defined in it, or in a module it imported), under its qualified name
  (``module.QualName``): defining or importing such a class registers it;
* what you register: ``rl8.register(MyEnv)``, ``@rl8.register`` on a class or function, or
  ``rl8.register(make_env, name="mypkg.old_module.make_env")`` for a name older files use.

Stop conditions are rebuilt from their names in :data:`rl8.training.conditions.CONDITIONS`, which is
the same idea. Names you give yourself (in code, on the command line, in your YAML config)
are not limited to the registry: rl8 imports them (see ``docs/security.md``).

::

    import rl8

    @rl8.register
    def make_my_env(**kwargs):          # an env factory named by a checkpoint
        ...
"""

from __future__ import annotations

import importlib
import inspect
import keyword
import sys
from collections.abc import Iterator
from typing import Any

__all__ = ["lookup", "register"]

#: What you registered: name -> object.
_USER: dict[str, Any] = {}
#: rl8's modules whose public classes files may name (one is imported when a file names it).
_RL8_MODULES = (
    "rl8.envs.base", "rl8.envs.cartpole", "rl8.envs.pendulum", "rl8.envs.dummy", "rl8.envs.memory",
    "rl8.envs.catch", "rl8.envs.gymnasium", "rl8.envs.pool", "rl8.policies.models", "rl8.policies.encoders",
    "rl8.policies.recurrent", "rl8.policies.distributions", "rl8.policies.distributions.base",
    "rl8.policies.distributions.discrete", "rl8.policies.distributions.continuous",
)
#: Module paths that files written before rl8's modules moved into packages (rl8 < 2.0, up to
#: commit 13e50a1) name, and where those classes live now: ``"rl8.models.MLPModel"`` is
#: :class:`rl8.policies.models.MLPModel` (tests/test_legacy_files.py proves it).
MOVED_MODULES = {
    "rl8.env": "rl8.envs.base",
    "rl8.models": "rl8.policies.models",
    "rl8.encoders": "rl8.policies.encoders",
    "rl8.recurrent": "rl8.policies.recurrent",
    "rl8.distributions": "rl8.policies.distributions",
}
#: rl8's public namespaces (``rl8.X``, ``rl8.envs.X``) and the name of their table of lazy
#: exports (name -> defining module), read through ``importlib`` (they are rl8's own modules).
_PUBLIC = {"rl8": "_EXPORTS", "rl8.envs": "_ENVS"}
#: Base classes whose subclasses are registered by existing (see the module docstring).
_AUTO_BASES = (
    ("rl8.envs.base", "Env"), ("gymnasium", "Env"), ("rl8.policies.models", "Model"),
    ("rl8.policies.distributions", "Distribution"), ("torch.optim", "Optimizer"),
)


def qualified_name(obj: Any) -> str:
    """The dotted path of a class or function (``"rl8.envs.cartpole.CartPole"``); builtins by
    their bare name; anything without a name by its ``repr``."""
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
    """Let checkpoints and policy files name ``obj``: a class of your own (an env, a model, an
    optimizer, an activation...) or an env factory function.

    Returns ``obj``, so it also works as a decorator: ``@rl8.register`` or
    ``@rl8.register(name="mypkg.old_module.MyEnv")``. Subclasses of ``rl8.Env``,
    ``gymnasium.Env``, ``Model``, ``Distribution`` and ``torch.optim.Optimizer`` need no
    registration: defining or importing them is enough. Registering a name again with another
    object of the same qualified name (a class defined again, as when a notebook cell is run
    again) replaces it.

    Args:
        obj: The class or function.
        name: The dotted path files use for it; ``None``: its qualified name
            (``module.QualName``, what rl8 writes into files). A name given here is an extra
            name (e.g. the path of a module the class was moved from): ``obj`` is registered
            under its qualified name too.

    Raises:
        ValueError: ``name`` is not a dotted path of Python names, or is registered already
            for an object of another qualified name.
        TypeError: ``obj`` is not a class or function (it has no qualified name).
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
            raise ValueError(f"register: name must be a dotted path of Python names ('pkg.module.Class'), got {each!r}")
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
    """The object that files may name ``name`` in this process, or ``None``.

    Looks in what you registered, among rl8's own classes and those of ``torch.optim`` and
    ``torch.nn``, then among the existing subclasses of the base classes listed in the module
    docstring. Imports no module, except one of rl8's own when ``name`` names a class of it.

    Args:
        name: A dotted path (``"rl8.envs.CartPole"``).
    """
    if not is_name(name):
        return None
    if name in _USER:
        return _USER[name]
    for find in (_rl8_object, _torch_object, _existing_subclass):
        obj = find(name)
        if obj is not None:
            return obj
    return None


def is_user_registered(name: str, obj: Any) -> bool:
    """Whether you registered ``obj`` under ``name`` (:func:`register`), which lets a file name
    a plain function as its env factory."""
    return _USER.get(name) is obj


def bound_object(path: str) -> Any:
    """The object at ``path`` in a module that is already imported (``sys.modules``), read
    without importing anything or calling a module's ``__getattr__``; ``None`` if there is none."""
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
    """Whether gymnasium's registry holds ``env_id`` (ids that the packages this process
    imported registered; for an id without version, any version of it). ``env_id`` has no
    ``module:`` part: nothing is imported."""
    import gymnasium
    from gymnasium.envs.registration import find_highest_version, parse_env_id

    if env_id in gymnasium.registry:
        return True
    try:
        namespace, name, version = parse_env_id(env_id)
    except gymnasium.error.Error:
        return False
    return version is None and find_highest_version(namespace, name) is not None


def _rl8_object(name: str) -> Any:
    """The rl8 class ``name`` names: a public class of one of :data:`_RL8_MODULES` (which is
    imported, being rl8's own), under that module's path, the public path ``rl8.X`` /
    ``rl8.envs.X`` or the path it had before it moved (:data:`MOVED_MODULES`); else ``None``."""
    module_name, _, attr = name.rpartition(".")
    module_name = MOVED_MODULES.get(module_name, module_name)
    if module_name in _PUBLIC:
        exports = getattr(importlib.import_module(module_name), _PUBLIC[module_name])
        module_name = exports.get(attr, "")
    if module_name not in _RL8_MODULES:
        return None
    module = importlib.import_module(module_name)
    obj = getattr(module, attr, None) if attr in getattr(module, "__all__", ()) else None
    return obj if isinstance(obj, type) else None


def _torch_object(name: str) -> Any:
    """The ``torch.optim`` optimizer class or ``torch.nn`` module class ``name`` names (by its
    public or defining path; torch imported them already), else ``None``."""
    import torch

    for prefix, base in (("torch.optim.", torch.optim.Optimizer), ("torch.nn.", torch.nn.Module)):
        if name.startswith(prefix):
            obj = bound_object(name)
            return obj if isinstance(obj, type) and issubclass(obj, base) else None
    return None


def _subclasses(base: type) -> Iterator[type]:
    """Every subclass of ``base`` that exists, at any depth."""
    seen: set[type] = set()
    stack = [base]
    while stack:
        for sub in type.__subclasses__(stack.pop()):
            if sub not in seen:
                seen.add(sub)
                stack.append(sub)
                yield sub


def _existing_subclass(name: str) -> Any:
    """The subclass of one of :data:`_AUTO_BASES` whose qualified name is ``name``; of several
    (a class defined again), the one its module binds to that name now. A base whose module is
    not imported has no subclasses yet."""
    found: list[type] = []
    for module_name, attr in _AUTO_BASES:
        module = sys.modules.get(module_name)
        base = getattr(module, attr, None) if module is not None else None
        if base is not None:
            found += [cls for cls in _subclasses(base) if qualified_name(cls) == name and cls not in found]
    if not found:
        return None
    bound = bound_object(name)
    return bound if bound in found else found[-1]

