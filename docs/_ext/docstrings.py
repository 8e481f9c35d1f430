"""A Griffe extension that reads rl8's docstrings the way they are written, for the API reference.

rl8's docstrings are Google style with Sphinx cross-reference roles, as in
``:class:`~rl8.HParams``` or ``:meth:`collect```; mkdocstrings reads Google style but would print
the roles as they are. Loaded by ``mkdocs.yml``, once Griffe has loaded the ``rl8`` package,
this extension:

* rewrites each role as an autorefs link to the object's own entry in the API reference,
  ``[`HParams`][rl8.ppo.hparams.HParams]`` (:func:`link_roles`). A target is looked up the way
  Sphinx does: a dotted path from ``rl8`` (the names that ``rl8/__init__.py`` and
  ``rl8/envs/__init__.py`` export lazily are mapped to the modules that define them), else a
  name in the scope of the documented object, then its parents' (a method's class, its module,
  the names that module imports). ``~`` shows only the last part of the path; ``title <target>``
  shows the title. A role whose target is outside rl8 (``torch.Tensor``) is printed as code; one
  that names no rl8 object is a warning, which fails ``mkdocs build --strict``;
* drops reStructuredText's ``::`` before literal blocks (:func:`literal_markers`);
* reads the ``#:`` comments above module constants (:func:`comment_docstrings`), docstrings
  assembled from shared text, ``__doc__ = "..." + _ARGS_DOC`` (:func:`assigned_docstrings`),
  and the docs of fields declared with their own (``_hparam(..., doc="...")``), listed as the
  class's attributes (:func:`field_docstrings`);
* lists the names that ``rl8`` and ``rl8.envs`` export lazily, linked to their entries, in the
  docstrings of those packages (:func:`export_tables`).

Nothing of rl8 is imported or run: everything is read from the source.
"""

from __future__ import annotations

import ast
import builtins
import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:py:)?(class|meth|func|attr|mod|data|exc|obj|const):`([^`]+)`")
_TITLED = re.compile(r"^(.*?)\s*<([^<>]+)>$")


def lazy_exports(root: Any) -> dict[str, str]:
    """The public paths that rl8's packages export lazily (their ``_EXPORTS`` and ``_ENVS``
    tables, read from the source), mapped to where each object is defined:
    ``{"rl8.PPO": "rl8.ppo.algorithm.PPO", "rl8.envs.CartPole": "rl8.envs.cartpole.CartPole", ...}``."""
    exports = {}
    for package, table in ((root, "_EXPORTS"), (root.members["envs"], "_ENVS")):
        for name, module in ast.literal_eval(str(package.members[table].value)).items():
            exports[f"{package.path}.{name}"] = f"{module}.{name}"
    return exports


def _member(obj: Any, parts: list[str]) -> Any | None:
    """``obj``'s member at the dotted ``parts`` (inherited members included), or None."""
    for part in parts:
        if obj.is_alias:
            try:
                obj = obj.final_target
            except (griffe.AliasResolutionError, griffe.CyclicAliasError):
                return None
        members = obj.all_members if obj.is_class else obj.members
        if part not in members:
            return None
        obj = members[part]
    return obj


def _canonical(obj: Any) -> Any | None:
    """The object an alias stands for (where it is defined, not where it is imported), None for
    an object of another library; an inherited member stays the subclass's (the reference shows
    it on the subclass)."""
    if obj.is_alias and not obj.inherited:
        try:
            return _canonical(obj.final_target)
        except (griffe.AliasResolutionError, griffe.CyclicAliasError):
            return None  # imported from outside rl8 (``from torch import Tensor``)
    return obj


def _entry(obj: Any) -> str | None:
    """The path of ``obj``'s entry in the API reference: its own path if the reference shows it
    (a public object with a docstring), else the entry of the object that documents it (a class
    lists its attributes in its docstring; a module holds the names outside its ``__all__``);
    None for private objects, which the reference leaves out."""
    parts = obj.path.split(".")
    module_parts = obj.module.path.split(".") if not obj.is_module else parts
    if any(part.startswith("_") and not part.startswith("__") for part in parts[len(module_parts) :]):
        return None
    while (obj.docstring is None or not obj.is_public) and obj.parent is not None and not obj.is_module:
        obj = obj.parent
    return obj.path


def resolve(target: str, scope: Any, root: Any, exports: dict[str, str]) -> Any | None:
    """The rl8 object (a Griffe object) that ``target`` names in the docstring of ``scope``, or
    None.

    Args:
        target: The role's target, without ``~`` or a title (``"collect"``, ``"rl8.PPO.collect"``).
        scope: The Griffe object whose docstring holds the role.
        root: The Griffe object of the ``rl8`` package.
        exports: :func:`lazy_exports` of ``root``.
    """
    target = target.lstrip(".")
    for public, defined in exports.items():  # rl8.PPO.collect -> rl8.ppo.algorithm.PPO.collect
        if target == public or target.startswith(public + "."):
            target = defined + target[len(public) :]
            break
    parts = target.split(".")
    if parts[0] == root.name:
        found = _member(root, parts[1:])
    else:
        found = None
        while scope is not None and found is None:
            found = _member(scope, parts)
            scope = scope.parent
    return None if found is None else _canonical(found)


def _is_rl8_target(target: str, scope: Any, root: Any) -> bool:
    """Whether a target that did not resolve names an rl8 object (a typo to report) rather than
    one of another library (``torch.Tensor``, ``gymnasium.spaces.Box``)."""
    first = target.lstrip(".").split(".")[0]
    if first == root.name:
        return True
    while scope is not None:  # a name the module imported from outside rl8 is not ours
        if first in scope.members:
            member = scope.members[first]
            return not member.is_alias or member.target_path.startswith(root.name + ".")
        scope = scope.parent
    if first in vars(builtins):  # TimeoutError
        return False
    return "." not in target  # a bare name (`step`) is meant to be one of the object's neighbours


def convert(text: str, scope: Any, root: Any, exports: dict[str, str]) -> tuple[str, list[str]]:
    """``text`` with its Sphinx roles as autorefs links, and the rl8 targets that did not resolve."""
    missing: list[str] = []

    def link(match: re.Match[str]) -> str:
        content = match.group(2)
        titled = _TITLED.match(content)
        title, target = titled.groups() if titled else (None, content)
        shown = title or (
            target.lstrip("~.").rsplit(".", 1)[-1] if target.startswith("~") else target.lstrip(".")
        )
        target = target.lstrip("~")
        found = resolve(target, scope, root, exports)
        if found is None:
            if _is_rl8_target(target, scope, root):
                missing.append(target)
            return f"`{shown}`"
        entry = _entry(found)
        return f"`{shown}`" if entry is None else f"[`{shown}`][{entry}]"

    return ROLE.sub(link, text), missing


def _objects(obj: Any):
    """``obj`` and every object defined under it (aliases left out)."""
    yield obj
    for member in obj.members.values():
        if not member.is_alias:
            yield from _objects(member)


def comment_docstrings(root: Any) -> None:
    """Give the attributes that have no docstring the ``#:`` comment lines right above them
    (Sphinx's form of an attribute's docstring, which Griffe does not read)."""
    for obj in _objects(root):
        if not obj.is_attribute or obj.docstring is not None or obj.lineno is None:
            continue
        lines = obj.lines_collection[obj.filepath] if obj.filepath in obj.lines_collection else []
        start = obj.lineno - 1  # the attribute's line, 0-based
        while start > 0 and lines[start - 1].strip().startswith("#:"):
            start -= 1
        comment = [line.strip()[2:].strip() for line in lines[start : obj.lineno - 1]]
        if comment:
            obj.docstring = griffe.Docstring("\n".join(comment), lineno=start + 1, parent=obj)


def _string_value(source: str, module: Any) -> str | None:
    """The string that the expression ``source`` makes from string literals, ``+`` and names of
    ``module``'s string constants; None for anything else (nothing is run)."""

    def value(node: ast.AST) -> str | None:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            left, right = value(node.left), value(node.right)
            return None if left is None or right is None else left + right
        if isinstance(node, ast.Name) and node.id in module.members:
            member = module.members[node.id]
            if member.is_attribute and member.value is not None:
                return _string_value(str(member.value), module)
        return None

    try:
        return value(ast.parse(source, mode="eval").body)
    except SyntaxError:
        return None


def assigned_docstrings(root: Any) -> None:
    """Give the classes that set ``__doc__ = "..." + SHARED_TEXT`` (a docstring shared in part
    between classes) that text as their docstring, which Griffe does not compute."""
    for obj in _objects(root):
        if not obj.is_class or obj.docstring is not None or "__doc__" not in obj.members:
            continue
        assigned = obj.members["__doc__"]
        text = _string_value(str(assigned.value), obj.module) if assigned.value is not None else None
        if text is not None:
            obj.docstring = griffe.Docstring(text, lineno=assigned.lineno, parent=obj)
        del obj.members["__doc__"]


def _field_doc(source: str) -> str | None:
    """The ``doc`` of a field declared as ``_hparam(default, check, doc="...")`` or
    ``_option(default, "doc", ...)``: the string literal given as the keyword ``doc``, else as
    the second positional argument; None for anything else."""
    try:
        call = ast.parse(source, mode="eval").body
    except SyntaxError:
        return None
    if not isinstance(call, ast.Call):
        return None
    given = [k.value for k in call.keywords if k.arg == "doc"] or call.args[1:2]
    if given and isinstance(given[0], ast.Constant) and isinstance(given[0].value, str):
        return given[0].value
    return None


def field_docstrings(root: Any) -> None:
    """Give the classes whose fields carry their own docs (``HParams``, ``TrainerConfig``: the
    docstring the class assembles at import, ``__doc__ += attributes_doc(cls)``) an
    ``Attributes:`` section listing each field with its doc."""
    for obj in _objects(root):
        if not obj.is_class:
            continue
        rows = []
        for name, member in obj.members.items():
            if member.is_alias or not member.is_attribute or member.value is None:
                continue
            doc = _field_doc(str(member.value))
            if doc is not None:
                rows.append(f"    {name}: {doc}")
        if rows:
            text = (
                (obj.docstring.value if obj.docstring is not None else "")
                + "\n\nAttributes:\n"
                + "\n".join(rows)
            )
            obj.docstring = griffe.Docstring(text, lineno=obj.lineno, parent=obj)


def literal_markers(text: str) -> str:
    """``text`` without reStructuredText's ``::`` before a literal block: ``example::`` ends
    with ``example:``, a ``::`` line goes (the indented block after it is code in Markdown too)."""
    lines = text.split("\n")
    kept = []
    for i, line in enumerate(lines):
        before_blank = i + 1 < len(lines) and not lines[i + 1].strip()
        if before_blank and line.strip() == "::":
            continue
        if before_blank and line.endswith("::"):
            line = line[:-1]
        kept.append(line)
    return "\n".join(kept)


def export_tables(root: Any) -> None:
    """Append to the docstrings of ``rl8`` and ``rl8.envs`` a table of the names they export
    lazily, each linked to its entry in the module that defines it (Griffe cannot see them:
    they are looked up on first access)."""
    exports = lazy_exports(root)
    for package in (root, root.members["envs"]):
        rows = []
        for public, defined in exports.items():
            exporter, name = public.rsplit(".", 1)
            module = defined.rsplit(".", 1)[0]
            if exporter == package.path:
                rows.append(f"| [`{name}`][{defined}] | [`{module}`][{module}] |")
        header = [f"The names `{package.path}` exports:", "", "| name | defined in |", "|---|---|"]
        table = "\n".join(header + rows)
        if package.docstring is None:
            package.docstring = griffe.Docstring(table, parent=package)
        else:
            package.docstring.value += "\n\n" + table


def _shown(obj: Any) -> bool:
    """Whether the API reference shows ``obj``: a public object (in its module's ``__all__``, no
    ``_`` name) with a docstring, in a module that declares ``__all__`` (the modules that
    ``docs/api/`` renders)."""
    module = obj if obj.is_module else obj.module
    return "__all__" in module.members and _entry(obj) == obj.path


def link_roles(root: Any) -> list[str]:
    """Convert the roles (and :func:`literal_markers`) of every docstring under ``root``; return
    the rl8 targets that do not resolve in the docstrings of public objects (those the
    reference shows), as ``"path: target"``."""
    exports = lazy_exports(root)
    problems = []
    for obj in _objects(root):
        if obj.docstring is None:
            continue
        obj.docstring.value, missing = convert(literal_markers(obj.docstring.value), obj, root, exports)
        if _shown(obj):
            problems += [f"{obj.path}: {target}" for target in missing]
    return problems


class RL8Docstrings(griffe.Extension):
    """Prepares the docstrings of the ``rl8`` package for mkdocstrings (see the module)."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        """Prepare every docstring of ``pkg`` once it is loaded; warn about the roles that name
        an rl8 object that does not exist."""
        if pkg.name != "rl8":
            return
        comment_docstrings(pkg)
        assigned_docstrings(pkg)
        field_docstrings(pkg)
        export_tables(pkg)
        for problem in link_roles(pkg):
            griffe.logger.warning("unresolved cross-reference %s", problem)
