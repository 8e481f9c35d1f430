"""The package's architecture, checked: no import cycle between rl8's modules (function-level
imports and ``if TYPE_CHECKING:`` imports, for annotations only, counted), function-level imports
only of optional heavy dependencies, no module importing another module's private name, at most
:data:`MAX_PRIVATE_REACHES` reads of another object's private names, the layer contracts of
pyproject.toml (``lint-imports``), and the code formatted and linted by ruff as pyproject.toml's
``[tool.ruff]`` says (``ruff format --check``, ``ruff check``).

Run ``python tests/test_layers.py`` to print the import graph's counts.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "rl8"

#: What a function may import (not at the top of its module), each for the reason given.
FUNCTION_LEVEL_ALLOWED = {
    "ale_py": "optional (rl8[atari]): the Atari emulator, registered on first use",
    "cv2": "optional (rl8[atari]): image resizing",
    "imageio": "optional (rl8[video]): MP4 writing",
    "imageio_ffmpeg": "optional (rl8[video]): the ffmpeg binary of imageio",
    "mujoco": "optional (rl8[mujoco])",
    "jax": "optional (rl8[gymnax], rl8[playground]): the JAX simulators of rl8/envs/jax.py",
    "gymnax": "optional (rl8[gymnax])",
    "mujoco_playground": "optional (rl8[playground]): MuJoCo Playground's MJX tasks",
    "mjlab": "optional (rl8[mjlab]): mjlab's tasks, imported when one is built (rl8.envs.mjlab)",
    "isaaclab": "optional (rl8[isaaclab], Python 3.12): Isaac Lab's simulation launcher and the "
    "wheel's asset stages (rl8.envs.isaaclab)",
    "isaaclab_tasks": "optional (rl8[isaaclab]): Isaac Lab's task registry (rl8.envs.isaaclab)",
    "mani_skill": "optional (rl8[maniskill]): ManiSkill3's registry and vector wrapper "
    "(rl8.envs.maniskill)",
    "isaaclab_rl": "optional (rl8[isaaclab]): Isaac Lab's rsl_rl wrapper (rl8.envs.isaaclab)",
    "pxr": "optional (rl8[isaaclab]): OpenUSD, which cuts assets out of Isaac Lab's stages "
    "(rl8.envs.isaaclab.local_assets)",
    "warp": "optional (rl8[mjlab]): mjlab's simulator, quietened when a task is built (rl8.envs.mjlab)",
    "cloudpickle": "optional: pickles env factories for worker processes",
    "IPython": "optional: notebooks",
    "mlflow": "heavy (about a second to import): only when tracking is on",
    "alembic": "heavy (with SQLAlchemy, a third of a second): MLflow's migrations, read where a store failed to open",
    "torch": "heavy: the rl8 command parses its arguments and checks its config without it",
    "gymnasium": "heavy: the rl8 command and the env resolver start without it",
    "yaml": "the rl8 command's start-up: only when a config is read",
    "resource": "POSIX only: peak memory of the process",
    "platform": "rl8/training/config.py: read where the run's params are made",
    "onnx": "optional (rl8[onnx]): reading an exported actor's metadata",
    "optuna": "optional (rl8[sweep]): rl8 sweep's studies",
    "matplotlib": "optional (rl8[sweep]): the plots of a sweep",
    "sqlalchemy": "optional (rl8[sweep], optuna's): the errors of a sweep's RDB storage",
}

#: Modules whose functions may import rl8's modules: the ``rl8`` command starts (``--help``, a
#: config's first checks) without torch, so each command imports what it runs, and the config
#: file and the Trainer's options (which the command reads at start-up) import the modules that
#: need torch where they check or use a value.
RL8_FUNCTION_LEVEL_ALLOWED_IN = ("rl8.cli.", "rl8.training.config_file", "rl8.training.config")


def _modules() -> dict[str, tuple[Path, bool]]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        out[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return out


MODULES = _modules()


def _absolute(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    if node.level == 0:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _imports(module: str, text: str | None = None) -> list[tuple[str, str | None, bool]]:
    """``(imported module, name or None, function level)`` of every import statement of
    ``module`` (``from pkg import name`` is the module ``pkg.name`` when that is a module), and
    the modules a package's lazy export table names (``{"Env": "rl8.envs.base", ...}``); of
    ``text`` instead of the module's file when given."""
    path, is_package = MODULES[module]
    tree = ast.parse(path.read_text() if text is None else text)
    out: list[tuple[str, str | None, bool]] = []

    def visit(node: ast.AST, nested: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                out.extend((alias.name, None, nested) for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                source = _absolute(child, module, is_package)
                for alias in child.names:
                    sub = f"{source}.{alias.name}"
                    out.append((sub, None, nested) if sub in MODULES else (source, alias.name, nested))
            elif is_package and isinstance(child, ast.Constant) and child.value in MODULES:
                out.append((child.value, None, False))  # a lazy export table's entry
            visit(
                child, nested or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            )

    visit(tree, False)
    return out


def import_graph() -> dict[str, set[str]]:
    """rl8's modules -> the rl8 modules each imports (at any level)."""
    graph: dict[str, set[str]] = {module: set() for module in MODULES}
    for module in MODULES:
        for target, _, _ in _imports(module):
            while target and target not in MODULES:  # "import rl8.envs.base.Env" -> the module
                target = target.rpartition(".")[0]
            if target and target != module:
                graph[module].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def strongconnect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in sorted(graph[node]):
            if succ not in index:
                strongconnect(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            strongconnect(node)
    return found


def function_level_imports() -> list[str]:
    """``module: imported`` for each import inside a function that is not of the allowed list."""
    return [
        f"{module}: {target}"
        for module in MODULES
        for target, _, nested in _imports(module)
        if nested
        and target.partition(".")[0] not in FUNCTION_LEVEL_ALLOWED
        and not (target.startswith("rl8.") and (module + ".").startswith(RL8_FUNCTION_LEVEL_ALLOWED_IN))
    ]


def private_imports() -> list[str]:
    """``module: source._name`` for each private name (or private module) a module imports from
    another rl8 module."""
    found = []
    for module in MODULES:
        for source, name, _ in _imports(module):
            if source.partition(".")[0] != "rl8":
                continue
            if name is None:  # a module: private when a part of its path is
                if any(part.startswith("_") and not part.startswith("__") for part in source.split(".")):
                    found.append(f"{module}: {source}")
            elif name.startswith("_") and not name.startswith("__"):
                found.append(f"{module}: {source}.{name}")
    return found


#: How many reads of another object's private names rl8/ may make (issue 36: at most 5).
MAX_PRIVATE_REACHES = 5


def package_lines() -> int:
    """Lines of every ``.py`` file of rl8/ (what ``find rl8 -name '*.py' | xargs cat | wc -l`` counts)."""
    return sum(len(path.read_text().splitlines()) for path in PACKAGE.rglob("*.py"))


def private_reaches(source: str | None = None, name: str = "<string>") -> list[str]:
    """``file:line: expression`` for each read of a private name (``obj._name``, not a dunder) of
    an object other than ``self``, ``cls`` or ``super()``: of every module of rl8, or of
    ``source``."""
    sources = (
        [(name, source)]
        if source is not None
        else [(str(path.relative_to(ROOT)), path.read_text()) for path, _ in MODULES.values()]
    )
    found = []
    for where, text in sources:
        for node in ast.walk(ast.parse(text)):
            if (
                not isinstance(node, ast.Attribute)
                or not node.attr.startswith("_")
                or node.attr.startswith("__")
            ):
                continue
            owner = node.value
            if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
                continue
            if (
                isinstance(owner, ast.Call)
                and isinstance(owner.func, ast.Name)
                and owner.func.id == "super"
            ):
                continue
            found.append(f"{where}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_the_graph_sees_function_level_imports_and_lazy_exports():
    graph = import_graph()
    assert "rl8.ppo.algorithm" in graph["rl8"]  # rl8/__init__.py's lazy table
    assert "rl8.envs.cartpole" in graph["rl8.envs"]  # rl8/envs/__init__.py's
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_annotation_only_imports_count_and_private_reaches_are_found():
    text = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from rl8.training.trainer import Trainer\n"
    assert _imports("rl8.training.progress", text) == [
        ("typing", "TYPE_CHECKING", False),
        ("rl8.training.trainer", "Trainer", False),
    ]
    found = private_reaches("a._b\nself._c\ncls._d\nsuper()._e\nx.__dict__\nsys._getframe()\n")
    assert found == ["<string>:1: a._b", "<string>:6: sys._getframe"]


def test_no_import_cycles():
    found = cycles(import_graph())
    assert not found, "import cycles (function-level imports included):\n" + "\n".join(
        " -> ".join(c) for c in found
    )


def test_function_level_imports_are_only_of_optional_heavy_dependencies():
    found = function_level_imports()
    assert not found, (
        "imports inside functions (move them to the top of the module, or add an optional heavy "
        "dependency to FUNCTION_LEVEL_ALLOWED with its reason):\n" + "\n".join(found)
    )


def test_no_module_imports_another_modules_private_name():
    found = private_imports()
    assert not found, "private names imported across modules:\n" + "\n".join(found)


def test_few_reads_of_other_objects_private_names():
    found = private_reaches()
    assert len(found) <= MAX_PRIVATE_REACHES, (
        f"{len(found)} reads of another object's private names (at most {MAX_PRIVATE_REACHES}): give the "
        "owner a public method or pass what is needed:\n" + "\n".join(found)
    )


def _ruff(*args: str) -> subprocess.CompletedProcess:
    executable = shutil.which("ruff") or str(Path(sys.executable).parent / "ruff")
    assert Path(executable).exists(), "ruff is missing: pip install -e '.[dev]'"
    return subprocess.run([executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_the_code_is_formatted_by_ruff():
    result = _ruff("format", "--check", "--diff", ".")
    assert result.returncode == 0, "run `ruff format .`:\n" + result.stdout[-4000:] + result.stderr


def test_the_code_passes_ruff_check():
    result = _ruff("check", "--output-format", "concise", ".")
    assert result.returncode == 0, "run `ruff check .`:\n" + result.stdout[-4000:] + result.stderr


def test_layer_contracts_hold():
    """pyproject.toml's [tool.importlinter] contracts (the layers of docs/architecture.md)."""
    executable = shutil.which("lint-imports") or str(Path(sys.executable).parent / "lint-imports")
    assert Path(executable).exists(), "lint-imports is missing: pip install -e '.[dev]' (import-linter)"
    result = subprocess.run(
        [executable, str(ROOT / "pyproject.toml"), "--no-cache"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr


if __name__ == "__main__":
    graph = import_graph()
    print(f"{len(graph)} modules, {sum(map(len, graph.values()))} imports")
    print(f"cycles: {len(cycles(graph))}")
    for cycle in cycles(graph):
        print("  ", " -> ".join(cycle))
    print(f"function-level imports not allowed: {len(function_level_imports())}")
    for line in function_level_imports():
        print("  ", line)
    print(f"reads of other objects' private names: {len(private_reaches())}")
    for line in private_reaches():
        print("  ", line)
    print(f"private names imported: {len(private_imports())}")
    for line in private_imports():
        print("  ", line)
    print(f"lines of rl8/: {package_lines()}")
