"""The documentation site builds: ``mkdocs build --strict`` (mkdocs.yml), offline, with an API
reference that holds every public name.

A broken link, a missing anchor, a docstring the reference cannot parse or a cross-reference
(``:class:`~rl8.HParams```) that names no rl8 object fails the build; the test lists the
build's warnings. The test skips when mkdocs is not installed (``pip install -e ".[docs]"``),
except in CI (``CI=true``), where the docs extra is installed with ``.[dev]`` and a skip would
hide a broken site.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS_PACKAGES = ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers.python", "griffe")


def _missing_docs_packages() -> list[str]:
    return [
        name
        for name in DOCS_PACKAGES
        if importlib.util.find_spec(name.split(".")[0]) is None or importlib.util.find_spec(name) is None
    ]


def require_docs_packages() -> None:
    """Skip without the docs extra; fail instead in CI, which installs it."""
    missing = _missing_docs_packages()
    if not missing:
        return
    reason = f"the docs extra is not installed (missing {missing}): pip install -e '.[docs]'"
    if os.environ.get("CI", "").lower() in ("true", "1"):
        pytest.fail(f"CI=true: {reason}; the docs site must be built in CI")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The site built with ``mkdocs build --strict`` into a temporary folder."""
    require_docs_packages()
    site_dir = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "PYTHONWARNINGS": "ignore::DeprecationWarning"}
    build = subprocess.run(
        [
            sys.executable,
            "-m",
            "mkdocs",
            "build",
            "--strict",
            "--config-file",
            str(ROOT / "mkdocs.yml"),
            "--site-dir",
            str(site_dir),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if build.returncode != 0:
        problems = [
            line for line in build.stderr.splitlines() if re.match(r"\s*(WARNING|ERROR)\b", line)
        ]
        pytest.fail(
            f"mkdocs build --strict failed (exit {build.returncode}) with {len(problems)} warnings/errors:\n"
            + "\n".join(problems or build.stderr.splitlines()[-40:]),
            pytrace=False,
        )
    return site_dir


def _anchors(site_dir: Path) -> set[str]:
    """The ids of the site's HTML elements (mkdocstrings gives each object its dotted path)."""
    return {
        anchor
        for page in site_dir.rglob("*.html")
        for anchor in re.findall(r'id="([^"]+)"', page.read_text())
    }


def _declared_all(path: Path) -> list[str] | None:
    """A module's ``__all__`` as written (None without one); for the lazy packages ``rl8`` and
    ``rl8.envs``, whose ``__all__`` is computed, the keys of their export table."""
    tree = ast.parse(path.read_text())
    values = {
        target.id: node.value
        for node in tree.body
        if isinstance(node, (ast.Assign, ast.AnnAssign))
        for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
        if isinstance(target, ast.Name)
    }
    if "__all__" not in values:
        return None
    for table in ("_EXPORTS", "_ENVS"):
        if table in values:
            return list(ast.literal_eval(values[table]))
    return list(ast.literal_eval(values["__all__"]))


def public_names() -> dict[str, list[str]]:
    """``{module path: its public names}`` for every module of rl8 that declares ``__all__``."""
    modules = {}
    for path in sorted((ROOT / "rl8").rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        names = _declared_all(path)
        if names is not None:
            modules[module] = names
    return modules


@pytest.mark.slow
def test_site_builds_strict_and_offline(site):
    home = (site / "index.html").read_text()
    assert "fonts.googleapis.com" not in home, "the theme loads Google Fonts: set theme.font: false"
    assert not re.search(r'<(?:link|script)[^>]+(?:href|src)="https?://', home), (
        "the page loads a remote asset"
    )
    assert (site / "api" / "ppo" / "index.html").exists()


@pytest.mark.slow
def test_api_reference_has_every_public_name(site):
    """Every module that declares ``__all__`` has its entry in the API reference, and so does
    each of its names (``rl8.PPO`` under ``rl8.ppo.algorithm.PPO``, where it is defined)."""
    anchors = _anchors(site)
    modules = public_names()
    lazy = {"rl8": "rl8/__init__.py", "rl8.envs": "rl8/envs/__init__.py"}
    expected = []
    for module, names in modules.items():
        expected.append(module)
        if module in lazy:  # documented where they are defined: rl8.PPO is rl8.ppo.algorithm.PPO
            tree = ast.parse((ROOT / lazy[module]).read_text())
            table = next(
                ast.literal_eval(node.value)
                for node in tree.body
                if isinstance(node, ast.Assign)
                and getattr(node.targets[0], "id", "") in ("_EXPORTS", "_ENVS")
            )
            expected += [f"{table[name]}.{name}" for name in names]
        else:
            expected += [f"{module}.{name}" for name in names]
    assert "rl8.ppo.algorithm.PPO" in expected and "rl8.envs.cartpole.CartPole" in expected
    missing = [name for name in expected if name not in anchors]
    assert not missing, f"not in the API reference (docs/api/*.md, or a docstring missing): {missing}"


@pytest.mark.slow
def test_sphinx_roles_become_links(site):
    """The docstrings' ``:class:`~rl8.HParams``` roles are links in the reference, none is left
    as text."""
    ppo_page = (site / "api" / "ppo" / "index.html").read_text()
    assert re.search(
        r'<a[^>]+href="[^"]*#rl8\.ppo\.hparams\.HParams"[^>]*>\s*<code>HParams</code>', ppo_page
    )
    role = re.compile(r":(?:class|meth|func|attr|mod|data|exc|obj):<code>[^<]*</code>")
    leftover = {match for page in site.rglob("*.html") for match in role.findall(page.read_text())}
    assert not leftover, f"Sphinx roles left as text: {sorted(leftover)[:10]}"


def test_docs_pages_are_in_nav():
    """Every page under docs/ is in mkdocs.yml's nav (a page left out builds but is hard to find)."""
    config = (ROOT / "mkdocs.yml").read_text()
    nav = "\n".join(
        line
        for line in config[config.index("\nnav:") :].splitlines()
        if not line.lstrip().startswith("#")
    )
    pages = [p.relative_to(ROOT / "docs").as_posix() for p in (ROOT / "docs").rglob("*.md")]
    missing = [
        page for page in pages if not re.search(rf"(:|-)\s+{re.escape(page)}\s*$", nav, re.MULTILINE)
    ]
    assert not missing, f"pages not in mkdocs.yml's nav: {missing}"


def _docstrings_extension():
    spec = importlib.util.spec_from_file_location(
        "rl8_docstrings", ROOT / "docs" / "_ext" / "docstrings.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _toy_package(tmp_path):
    """A small ``rl8`` package, loaded with Griffe and the docstrings extension applied."""
    require_docs_packages()
    import griffe

    package = tmp_path / "rl8"
    (package / "envs").mkdir(parents=True)
    (package / "__init__.py").write_text('_EXPORTS = {"Algo": "rl8.algo"}\n__all__ = sorted(_EXPORTS)\n')
    (package / "envs" / "__init__.py").write_text("_ENVS = {}\n__all__ = sorted(_ENVS)\n")
    (package / "algo.py").write_text(
        '"""Algorithms."""\nfrom torch import Tensor\n__all__ = ["Algo", "LIMIT", "Shared"]\n\n'
        "#: Steps at most.\nLIMIT = 10\n\n"
        '_DOC = """\n    Args:\n        x: A value.\n"""\n\n'
        'class Shared:\n    __doc__ = """Shared part.\n""" + _DOC\n\n'
        "class Algo:\n"
        '    """Uses :meth:`collect`, :class:`~rl8.Algo`, :data:`LIMIT`, :meth:`run <rl8.Algo.collect>`,\n'
        "    :class:`Tensor`, :exc:`TimeoutError` and :meth:`missing`."
        ""
        '"""\n\n'
        '    def collect(self):\n        """Collect (see :attr:`Algo.nope`)."""\n\n'
        'class Config:\n    """Options."""\n\n'
        '    steps: int = _option(1, "steps per :class:`Algo`", _check)\n'
        '    mode: str = _hparam("sync", _check, doc="how it runs")\n'
    )
    extension = _docstrings_extension()
    extensions = griffe.load_extensions(extension.RL8Docstrings)
    return griffe.load("rl8", search_paths=[tmp_path], extensions=extensions), extension


def test_docstrings_extension_links_roles_and_reads_shared_and_comment_docstrings(tmp_path, caplog):
    package, extension = _toy_package(tmp_path)
    doc = package["algo.Algo"].docstring.value
    assert "[`collect`][rl8.algo.Algo.collect]" in doc  # a neighbour, by its bare name
    assert "[`Algo`][rl8.algo.Algo]" in doc  # a lazy export, shortened by ~
    assert "[`LIMIT`][rl8.algo.LIMIT]" in doc  # an attribute documented by a #: comment
    assert "[`run`][rl8.algo.Algo.collect]" in doc  # title <target>
    assert "`Tensor`" in doc and "`TimeoutError`" in doc and "[`Tensor`]" not in doc  # outside rl8: code
    assert package["algo.LIMIT"].docstring.value == "Steps at most."
    assert package["algo.Shared"].docstring.value.startswith("Shared part.")
    assert "x: A value." in package["algo.Shared"].docstring.value
    assert (
        "| [`Algo`][rl8.algo.Algo] | [`rl8.algo`][rl8.algo] |" in package.docstring.value
    )  # the exports
    # fields that carry their doc (HParams, TrainerConfig) are listed as the class's attributes
    config = package["algo.Config"].docstring.value
    assert "Attributes:\n    steps: steps per [`Algo`][rl8.algo.Algo]\n    mode: how it runs" in config
    # the roles that name no rl8 object are warnings (which fail the strict build)
    assert "unresolved cross-reference rl8.algo.Algo: missing" in caplog.text
    assert "unresolved cross-reference rl8.algo.Algo.collect: Algo.nope" in caplog.text


def test_docstrings_extension_reports_unresolved_roles(tmp_path):
    require_docs_packages()
    import griffe

    extension = _docstrings_extension()
    package = tmp_path / "rl8"
    (package / "envs").mkdir(parents=True)
    (package / "__init__.py").write_text("_EXPORTS = {}\n")
    (package / "envs" / "__init__.py").write_text("_ENVS = {}\n")
    (package / "algo.py").write_text(
        '__all__ = ["Algo"]\n\nclass Algo:\n    """See :meth:`missing` and :class:`rl8.algo.Nope`."""\n\n'
        'class _Private:\n    """See :meth:`gone`."""\n'
    )
    loaded = griffe.load("rl8", search_paths=[tmp_path])  # without the extension: roles as written
    assert extension.link_roles(loaded) == ["rl8.algo.Algo: missing", "rl8.algo.Algo: rl8.algo.Nope"]
    assert loaded["algo.Algo"].docstring.value == "See `missing` and `rl8.algo.Nope`."


def test_literal_block_markers_go():
    extension = _docstrings_extension()
    text = "Run it::\n\n    rl8 train\n\n::\n\n    rl8 eval\n\nA ratio 1::2 stays."
    assert (
        extension.literal_markers(text)
        == "Run it:\n\n    rl8 train\n\n\n    rl8 eval\n\nA ratio 1::2 stays."
    )


def test_missing_docs_extra_skips_locally_and_fails_in_ci(monkeypatch):
    module = sys.modules[__name__]
    monkeypatch.setattr(module, "_missing_docs_packages", lambda: ["mkdocs"])
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match=r"pip install -e '.\[docs\]'"):
        require_docs_packages()
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI=true"):
        require_docs_packages()
