"""Tests use rl8's public API: no test touches a private rl8 name (an attribute, function, class
or module whose name starts with one underscore), except the few in ``ALLOWED`` below, each for
the reason given. State a test needs is read through public read-only properties
(``Policy.state``, ``PoolEnv.worker_pids``, ``PPO.compute_advantages``); faults are injected
through public hooks (callbacks, env classes) or the ``ALLOWED`` seams.

A name counts as touched where a test reads an attribute of that name, imports it from rl8, or
names it as the attribute ``monkeypatch.setattr`` replaces; names a test file defines itself
(its own classes' ``self._x``) do not count.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: (test file, private rl8 name): why the test needs it.
ALLOWED = {
    # speed helpers checked against their plain reference (the rule for any speed trick)
    ("test_recurrent_models.py", "_encode"): "the recurrent fast path against the per-step loop",
    ("test_recurrent_models.py", "_run"): "the recurrent fast path against the per-step loop",
    ("test_compile.py", "_training_samples"): "compiled against eager loss on the same batch",
    ("test_compile.py", "_minibatch_loss"): "compiled against eager loss on the same batch",
    ("test_compile.py", "_autocast"): "compiled against eager loss on the same batch",
    (
        "test_compile.py",
        "_optimizer_step",
    ): "the fused compiled step against the plain step on the same batches",
    # faults and process-wide state that no public hook can reach
    ("test_actors.py", "_roles"): "simulates a torchrun rank without starting processes",
    ("test_actors.py", "_leaves"): "the flat layout's round trip of a rollout's tensors",
    (
        "test_distributions.py",
        "_categorical_sample",
    ): "the inverse-CDF sampler at the edges of the uniform draw",
    ("test_distributed.py", "_timeout_from_env"): "parses the torchrun timeout variable",
    ("test_registry.py", "_USER"): "an empty user registry for each test",
    ("test_security.py", "_USER"): "an empty user registry for each test",
    ("test_run_api.py", "_hinted"): "forgets the once-per-process preset hint",
}


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def rl8_private_names() -> set[str]:
    """Every private name rl8 defines: modules, functions, classes, attributes, module globals."""
    names = set()
    for path in (ROOT / "rl8").rglob("*.py"):
        if _private(path.stem):
            names.add(path.stem)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = node.name
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                name = node.attr
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                name = node.id
            else:
                continue
            if _private(name):
                names.add(name)
    return names


def touched(path: Path, private: set[str]) -> set[tuple[str, int]]:
    """(name, line) of each private rl8 name the test file ``path`` touches."""
    tree = ast.parse(path.read_text())
    own = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            own.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            own.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            own.add(node.id)
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in private - own:
            found.add((node.attr, node.lineno))
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("rl8"):
            found |= {(part, node.lineno) for part in node.module.split(".") if _private(part)}
            found |= {(alias.name, node.lineno) for alias in node.names if _private(alias.name)}
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "setattr"
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and node.args[1].value in private - own
        ):
            found.add((node.args[1].value, node.lineno))
    return found


def test_tests_touch_no_private_rl8_name_outside_the_allowed_list():
    private = rl8_private_names()
    seen, offences = set(), []
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        for name, line in sorted(touched(path, private)):
            if (path.name, name) in ALLOWED:
                seen.add((path.name, name))
            else:
                offences.append(f"{path.relative_to(ROOT)}:{line}: {name}")
    assert not offences, "tests touch private rl8 names (use or add a public seam):\n" + "\n".join(
        offences
    )
    assert not set(ALLOWED) - seen, (
        f"ALLOWED lists names no test touches any more: {set(ALLOWED) - seen}"
    )


def test_the_scan_sees_attribute_reads_imports_and_monkeypatched_names(tmp_path):
    probe = tmp_path / "test_probe.py"
    probe.write_text(
        "from rl8.ppo.buffer import _device_memory\n"
        "def test(monkeypatch, policy):\n"
        "    monkeypatch.setattr(registry, '_USER', {})\n"
        "    policy._state\n"
        "    class Own:\n"
        "        def __init__(self):\n"
        "            self._processes = []\n"
        "    Own()._processes\n"
    )
    assert touched(probe, {"_device_memory", "_USER", "_state", "_processes"}) == {
        ("_device_memory", 1),
        ("_USER", 3),
        ("_state", 4),
    }
