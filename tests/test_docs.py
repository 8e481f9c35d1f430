"""The docs run as written: every ```python block of README.md and docs/**/*.md (except the
API reference, docs/api/), and the ``rl8`` command lines of their shell blocks.

The python blocks of one file run in order in one namespace (a reader follows a page from the
top, so a later block may use what an earlier one defined), in a temporary folder with a
temporary MLflow store (see ``conftest.py``). Training is cut short: every
:meth:`rl8.Trainer.run` gets one more stop condition, ``HitsUpperBound("env/steps", 1)``, so it
stops after its first training step.

An HTML comment on the line before a block changes how it is run:

* ``<!-- no-run -->``: not run (for fragments such as signatures, which are not code);
* ``<!-- raises: RuntimeError -->``: the block must raise that exception (it shows an error);
* ``<!-- test: replace "range(100)" with "range(2)" -->``: run with that text replaced (a
  shorter loop that trains by hand); the text must occur in the block;
* ``<!-- file: run.yaml -->`` (on a block of any language): written to that file before the
  python blocks after it run (a config file that the next block reads);
* ``<!-- requires: gymnax -->``: not run where that module is not installed (an optional
  simulator's extra); a module of ``HEAVY_SIM_MODULES`` needs ``RL8_HEAVY_SIM_TESTS=1`` too.

A failure names the file and the line of the block.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import shlex
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS_DIR = ROOT / "docs"
# README.md and every page of the docs site, subfolders included, except the API reference
# (docs/api/ holds only mkdocstrings' ``::: rl8.module`` directives)
DOCS = [
    ROOT / "README.md",
    *sorted(p for p in DOCS_DIR.rglob("*.md") if not p.is_relative_to(DOCS_DIR / "api")),
]
STEP_BUDGET = 1  # env steps: a run stops after its first training step

_FENCE = re.compile(r"^```(\w*)\s*$")
_MARK = re.compile(r"^<!--\s*(.*?)\s*-->$")
_REPLACE = re.compile(r'^test: replace "(.*)" with "(.*)"$')
_RAISES = re.compile(r"^raises: (\w+)$")
_FILE = re.compile(r"^file: (\S+)$")
_REQUIRES = re.compile(r"^requires: ([\w.]+)$")
#: Simulators whose blocks compile for minutes on a CPU: run only with RL8_HEAVY_SIM_TESTS=1.
HEAVY_SIM_MODULES = {"mujoco_playground"}


def _missing(module: str) -> bool:
    heavy = module in HEAVY_SIM_MODULES and os.environ.get("RL8_HEAVY_SIM_TESTS") != "1"
    return heavy or importlib.util.find_spec(module) is None


@dataclass
class Block:
    path: Path
    line: int  # of the block's first line of code
    lang: str
    source: str
    marks: list[str] = field(default_factory=list)

    @property
    def where(self) -> str:
        return f"{_name(self.path)}:{self.line}"


def _name(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def _blocks(path: Path) -> list[Block]:
    """The fenced code blocks of a markdown file, with the HTML comments right before each."""
    lines = path.read_text().splitlines()
    blocks, i = [], 0
    while i < len(lines):
        match = _FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        marks = []
        j = i - 1
        while j >= 0 and _MARK.match(lines[j].strip()):
            marks.append(_MARK.match(lines[j].strip()).group(1))
            j -= 1
        end = i + 1
        while end < len(lines) and not lines[end].startswith("```"):
            end += 1
        blocks.append(Block(path, i + 2, match.group(1), "\n".join(lines[i + 1 : end]) + "\n", marks))
        i = end + 1
    return blocks


def _prepared(block: Block) -> tuple[str, type[BaseException] | None]:
    """The block's source after its ``replace`` marks, and the exception it must raise."""
    source, raises = block.source, None
    for mark in block.marks:
        if replace := _REPLACE.match(mark):
            old, new = replace.groups()
            assert old in source, f"{block.where}: {mark!r}: {old!r} is not in the block"
            source = source.replace(old, new)
        elif expected := _RAISES.match(mark):
            import builtins

            raises = getattr(builtins, expected.group(1))
        elif mark != "no-run" and not _FILE.match(mark) and not _REQUIRES.match(mark):
            pytest.fail(f"{block.where}: unknown docs-test mark {mark!r}")
    return source, raises


@pytest.fixture
def step_budget(monkeypatch):
    """Every ``Trainer.run`` also stops after ``STEP_BUDGET`` env steps."""
    from rl8.training.conditions import Condition, HitsUpperBound
    from rl8.training.trainer import Trainer

    run = Trainer.run

    def short_run(self, *args, stop_conditions=None, **kwargs):
        if isinstance(stop_conditions, Condition):  # run() takes one condition or a list
            stop_conditions = [stop_conditions]
        conditions = [*(stop_conditions or []), HitsUpperBound("env/steps", STEP_BUDGET)]
        return run(self, *args, stop_conditions=conditions, **kwargs)

    monkeypatch.setattr(Trainer, "run", short_run)


def _run_page(path: Path) -> None:
    """Run the python blocks of a markdown file in order, in one namespace (see the module)."""
    from rl8.training.trainer import Trainer

    namespace: dict = {"__name__": "__docs__"}
    try:
        for block in _blocks(path):
            for name in (m.group(1) for m in map(_FILE.match, block.marks) if m):
                Path(name).write_text(block.source)
            if block.lang != "python" or "no-run" in block.marks:
                continue
            if any(_missing(m.group(1)) for m in map(_REQUIRES.match, block.marks) if m):
                continue
            source, raises = _prepared(block)
            try:
                # padded so that tracebacks give the line numbers of the markdown file
                exec(compile("\n" * (block.line - 1) + source, str(block.path), "exec"), namespace)
            except Exception as exc:
                if raises is not None and isinstance(exc, raises):
                    continue
                pytest.fail(
                    f"{block.where}: the python block raised {type(exc).__name__}: {exc}\n"
                    + "".join(traceback.format_exception(exc)[1:]),
                    pytrace=False,
                )
            if raises is not None:
                pytest.fail(
                    f"{block.where}: the python block did not raise {raises.__name__}", pytrace=False
                )
    finally:
        for value in namespace.values():
            if isinstance(value, Trainer):
                value.close()


# the pages whose blocks take longest (ONNX exports, many Trainers): left out of -m "not slow"
SLOW_PAGES = ("README.md", "collection.md", "export.md", "trainer.md")


@pytest.mark.parametrize(
    "path",
    [pytest.param(p, marks=pytest.mark.slow) if p.name in SLOW_PAGES else p for p in DOCS],
    ids=_name,
)
def test_python_blocks_run(path, step_budget, migrated_store):
    if not any(b.lang == "python" and "no-run" not in b.marks for b in _blocks(path)):
        pytest.skip(f"{path.name} has no python block to run")
    _run_page(path)


def _commands(block: Block) -> list[tuple[int, str]]:
    """The command lines of a shell block with their file lines: the ``$ `` lines if there are
    any (the others are output), else every line; continuations (``\\``) joined."""
    lines = block.source.splitlines()
    prompted = any(line.startswith("$ ") for line in lines)
    commands: list[tuple[int, str]] = []
    pending = ""
    for offset, line in enumerate(lines):
        if prompted and not pending:
            if not line.startswith("$ "):
                continue
            line = line[2:]
        if not pending:
            start = block.line + offset
        pending += line.rstrip("\\") + " "
        if not line.endswith("\\"):
            commands.append((start, pending.strip()))
            pending = ""
    return commands


def _rl8_argv(command: str) -> list[str] | None:
    """The arguments of an ``rl8`` command (also ``python -m rl8``, ``torchrun ... -m rl8``)."""
    for part in re.split(r"&&|\|\||;|\|", command):
        words = shlex.split(part, comments=True)
        if words and words[0] == "rl8":
            return words[1:]
        for i in range(len(words) - 1):
            if words[i] == "-m" and words[i + 1] == "rl8":
                return words[i + 2 :]
    return None


SHELL_BLOCKS = [
    b for path in DOCS for b in _blocks(path) if b.lang in ("bash", "sh", "console", "shell")
]


@pytest.mark.parametrize("block", SHELL_BLOCKS, ids=lambda b: b.where)
def test_rl8_commands_parse(block, capsys):
    from rl8.cli import build_parser

    for line, command in _commands(block):
        argv = _rl8_argv(command)
        if argv is None:
            continue
        where = f"{_name(block.path)}:{line}: `{command}`"
        redirections = [word for word in argv if "<" in word or ">" in word]
        assert not redirections, f"{where}: {redirections} would be a shell redirection; write RUN_ID"
        try:
            build_parser().parse_args(argv)
            error = None
        except SystemExit as exit:
            error = capsys.readouterr().err.strip() if exit.code else None
        assert error is None, f"{where} does not parse: {error}"


def test_marks_are_read(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        'text\n<!-- no-run -->\n```python\nsignature(...)\n```\n\n<!-- test: replace "a" with "b" -->\n'
        "<!-- raises: KeyError -->\n```python\nx = 'a'\n```\n```bash\n$ rl8 eval x \\\n  --episodes 2\nout\n```\n"
    )
    first, second, shell = _blocks(page)
    assert (first.line, first.marks, first.source) == (4, ["no-run"], "signature(...)\n")
    assert _prepared(second) == ("x = 'b'\n", KeyError)
    assert _commands(shell) == [(13, "rl8 eval x    --episodes 2")]
    assert _rl8_argv("torchrun --nproc_per_node=4 -m rl8 train a.yaml  # comment") == ["train", "a.yaml"]


def test_blocks_run_in_order_and_write_marked_files(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        '<!-- file: conf.txt -->\n```text\nhello\n```\n```python\nx = open("conf.txt").read()\n```\n'
        "```python\nassert x == 'hello\\n'\nraise KeyError(x)\n```\n"
    )
    with pytest.raises(pytest.fail.Exception, match=r"page.md:9: the python block raised KeyError"):
        _run_page(page)


#: ``pip install`` of rl8 by name (``"rl8[ui]"``, ``rl8==1.0.0``), wherever lines wrap: the
#: package index has rl8 1.0.0, not this checkout (``python -m pip install -e ".[ui]"``).
_INSTALL_BY_NAME = re.compile(r"""pip\s+install\s+(-\S+\s+)*["'`]?rl8(\[|[=<>~!"'`\s]|$)""")


def _texts_read_by_users() -> dict[str, list[str]]:
    """The docs' text, and the source of rl8's modules and the examples with their string
    literals (the messages and help texts; adjacent literals joined, as Python joins them)."""
    out = {_name(path): [path.read_text()] for path in DOCS}
    for path in sorted([*(ROOT / "rl8").rglob("*.py"), *(ROOT / "examples").glob("*.py")]):
        source = path.read_text()
        out[_name(path)] = [source, *_string_literals(source)]
    return out


def _string_literals(source: str) -> list[str]:
    """The string literals of python ``source``, adjacent ones joined as Python joins them."""
    return [
        node.value
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    ]


def test_no_doc_or_message_installs_rl8_by_name():
    wrong = sorted(
        {
            f"{where}: {' '.join(text[match.start() : match.end() + 20].split())}"
            for where, texts in _texts_read_by_users().items()
            for text in texts
            for match in _INSTALL_BY_NAME.finditer(text)
        }
    )
    assert not wrong, 'install rl8 from its clone (python -m pip install -e ".[extra]"):\n' + "\n".join(
        wrong
    )


def test_installs_by_name_are_found_across_lines_and_joined_literals():
    assert _INSTALL_BY_NAME.search('Optuna (`pip install\n"rl8[sweep]"`)')
    assert _INSTALL_BY_NAME.search("pip install -U rl8==1.0.0")
    joined = _string_literals("""message = ("needs psutil (pip install "\n    "'rl8[system]')")""")
    assert any(_INSTALL_BY_NAME.search(text) for text in joined)
    assert not _INSTALL_BY_NAME.search('python -m pip install -e ".[sweep]"  # rl8[sweep]')


_TRAIN_ARG = re.compile(r"rl8 train ([^\s`\"')\]]+)")


def _preset_names_in_docs() -> list[tuple[str, str]]:
    """``(page, NAME)`` of every ``rl8 train NAME`` of the docs whose NAME is neither a path nor
    a placeholder (``CONFIG``) nor an error the page shows (``no preset or config file 'NAME'``)."""
    out = []
    for path in DOCS:
        text = path.read_text()
        for arg in _TRAIN_ARG.findall(text):
            name = arg.removeprefix("preset:")
            if (
                arg.startswith("-")
                or "/" in arg
                or Path(arg).suffix in (".yaml", ".yml")
                or name.isupper()
                or f"no preset or config file '{arg}'" in text
            ):
                continue
            out.append((_name(path), arg))
    return out


def test_rl8_train_names_in_the_docs_are_presets():
    import rl8.presets

    names = _preset_names_in_docs()
    assert ("docs/tracking.md", "CartPole") in names  # rl8 train CartPole ... --register cartpole-ppo
    wrong = []
    for page, arg in names:
        try:
            rl8.presets.path(arg)
        except ValueError as exc:
            wrong.append(f"{page}: rl8 train {arg}: {exc}")
    assert not wrong, "\n".join(wrong)


# --------------------------------------------------------------------------------------------
# install lines: from the checkout, and the ones CI runs


def marked_block(text: str, marker: str) -> list[str]:
    """The lines of the first code block after ``<!-- marker -->`` (as .ci/run reads them)."""
    after = text.split(f"<!-- {marker} -->\n", 1)[1]
    assert after.startswith("```"), f"no code block right after <!-- {marker} -->"
    return after.split("\n```", 1)[0].splitlines()[1:]


def test_ci_runs_the_install_lines_that_readers_see():
    readme = (ROOT / "README.md").read_text()
    getting_started = (ROOT / "docs" / "getting-started.md").read_text()
    assert marked_block(readme, "ci:install-command") == [
        "python -m pip install -e . && python examples/cartpole.py"
    ]
    extras = [line.split("#")[0].strip() for line in marked_block(getting_started, "ci:install-extras")]
    assert extras == [
        f"python -m pip install -e {spec}"
        for spec in [
            ".",
            '".[video]"',
            '".[ui]"',
            '".[docs]"',
            '".[system]"',
            '".[onnx]"',
            '".[sweep]"',
            '".[dev]"',
        ]
    ]
    assert marked_block(readme, "ci:test-command")[0].startswith(
        'python -m pip install -q -e ".[dev]" && '
    )
    ci = (ROOT / ".ci" / "run").read_text()
    for marker, page in [
        ("ci:test-command", "README.md"),
        ("ci:install-command", "README.md"),
        ("ci:install-extras", "docs/getting-started.md"),
    ]:
        assert f"block {marker} {page}" in ci
