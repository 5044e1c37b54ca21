"""The documentation builds with warnings as errors, its command examples run, and its tables match the code.

Every code block whose language is ``console`` in ``docs/`` (and in the README) is an example: each ``$ `` line
is a command, run with ``bash`` as a reader of the page runs it, in a temporary directory that stands for the
clone after its setup: a copy of ``examples/`` and ``lessons/``, and ``.venv/bin`` (this environment's ``bin``,
so the installed ``cellbox``). That ``bin`` is on ``PATH`` only when the page says to activate the virtualenv
(``. .venv/bin/activate``), as it is in the reader's shell; ``$ cd DIR`` moves the commands after it to ``DIR``.
The lines below a command are its output, stdout and stderr together. In that output a number stands for any
number, ``...`` for any text on its line, and a line of ``...`` alone for any number of lines. A block with the
HTML comment ``<!-- slow -->`` on the line before it (which GitHub and Sphinx do not show) is marked slow.
"""

from __future__ import annotations

import dataclasses
import html
import importlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import pytest

from cellbox.kernel.kernel import CellboxKernel
from cellbox.options import LIMIT_OPTIONS
from cellbox.sandbox.limits import Limits, format_size, format_time
from cellbox.sandbox.outcome import STATUS_EXIT_CODES, Status

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
README = ROOT / "README.md"
PAGES = sorted(path for path in DOCS.rglob("*.md") if "_build" not in path.parts)
EXAMPLE_TIMEOUT = 120  # seconds for one command of an example; the slowest (a small grading run) takes about 5
# The examples show a normal user's output; run as root, cellbox adds these (see docs/run.md, "Running as root").
ROOT_SUFFIX = " (ran as root: not contained)"
ROOT_WARNING = "cellbox: warning: the child ran as root, so the limits did not contain it"
SLOW_MARKER = "<!-- slow -->"
ACTIVATE = ". .venv/bin/activate"
_BLOCK = re.compile(rf"^({re.escape(SLOW_MARKER)}\n)?```console\n(.*?)^```", re.MULTILINE | re.DOTALL)
_CD = re.compile(r"cd (\S+)")
_WILDCARD = re.compile(r"(\.\.\.|\d+(?:\.\d+)?)")


class Command(NamedTuple):
    command: str
    expected: list[str]


class Example(NamedTuple):
    where: str
    slow: bool
    commands: list[Command]
    activated: bool  # the page says to activate the virtualenv, so its bin is on the reader's PATH


def examples_in(path: Path) -> list[Example]:
    """The ``console`` blocks of one Markdown file, each as its commands and their expected output."""
    text = path.read_text()
    activated = ACTIVATE in text
    examples = []
    for match in _BLOCK.finditer(text):
        line = text.count("\n", 0, match.start(2))
        commands: list[Command] = []
        for row in match.group(2).splitlines():
            if row.startswith("$ "):
                commands.append(Command(row[2:], []))
            else:
                assert commands, f"{path.name}:{line}: a console block starts with output, not a '$ ' command"
                commands[-1].expected.append(row)
        examples.append(Example(f"{path.relative_to(ROOT)}:{line}", match.group(1) is not None, commands, activated))
    return examples


def output_pattern(expected: list[str]) -> re.Pattern[str]:
    """A regular expression for documented output: numbers and ``...`` are wildcards (see the module's docstring)."""
    parts = []
    for line in expected:
        if line.strip() == "...":
            parts.append(r"(?:[^\n]*\n)*?")
            continue
        pieces = _WILDCARD.split(line)
        pattern = "".join(
            (r"[^\n]*?" if piece == "..." else r"\d+(?:\.\d+)?") if index % 2 else re.escape(piece)
            for index, piece in enumerate(pieces)
        )
        parts.append(pattern + r"\n")
    return re.compile("".join(parts))


def as_a_normal_user(output: str) -> str:
    """The output as a normal user sees it: without what cellbox adds when the child runs as root."""
    if os.geteuid() != 0:
        return output
    lines = [line for line in output.splitlines(keepends=True) if not line.startswith(ROOT_WARNING)]
    return "".join(lines).replace(ROOT_SUFFIX, "").replace('"as_root": true', '"as_root": false')


VENV_BIN = Path(sys.executable).parent
IN_A_VENV = sys.prefix != sys.base_prefix


def reader_path(activated: bool) -> str:
    """The reader's ``PATH``: this virtualenv's ``bin`` first if the page activated it, else not on it at all."""
    entries = os.environ.get("PATH", "").split(os.pathsep)
    if IN_A_VENV:  # a shell that never activated it does not have it (outside a venv, bin is /usr/bin: keep it)
        entries = [entry for entry in entries if entry and Path(entry).resolve() != VENV_BIN.resolve()]
    return os.pathsep.join([str(VENV_BIN), *entries] if activated else entries)


def like_the_clone(directory: Path) -> None:
    """Make ``directory`` stand for a clone after its setup: ``examples/``, ``lessons/`` and ``.venv/bin``."""
    shutil.copytree(ROOT / "examples", directory / "examples")
    shutil.copytree(ROOT / "lessons", directory / "lessons", ignore=shutil.ignore_patterns("__pycache__"))
    (directory / ".venv").mkdir()
    (directory / ".venv" / "bin").symlink_to(VENV_BIN, target_is_directory=True)


def run_command(command: str, cwd: Path, activated: bool) -> str:
    result = subprocess.run(
        ["bash", "-c", command],
        cwd=cwd,
        env={**os.environ, "PATH": reader_path(activated)},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=EXAMPLE_TIMEOUT,
    )
    return result.stdout


EXAMPLES = [example for path in [README, *PAGES] for example in examples_in(path)]


@pytest.mark.parametrize(
    "example",
    [pytest.param(e, id=e.where, marks=[pytest.mark.slow] if e.slow else []) for e in EXAMPLES],
)
def test_console_example_prints_what_the_docs_show(example: Example, tmp_path: Path) -> None:
    like_the_clone(tmp_path)
    cwd = tmp_path
    for command, expected in example.commands:
        if cd := _CD.fullmatch(command):
            cwd = cwd / cd.group(1)
            assert cwd.is_dir() and not expected, f"{example.where}: `{command}`"
            continue
        output = as_a_normal_user(run_command(command, cwd, example.activated))
        if output and not output.endswith("\n"):
            output += "\n"
        assert output_pattern(expected).fullmatch(output), (
            f"{example.where}: `{command}` printed\n{output}\nwhile the docs show\n" + "\n".join(expected)
        )


def test_examples_are_found_in_the_pages_that_have_them() -> None:
    where = {example.where.split(":")[0] for example in EXAMPLES}
    assert {"docs/run.md", "docs/getting-started/students.md", "docs/getting-started/instructors.md"} <= where
    assert any(example.slow for example in EXAMPLES) and not all(example.slow for example in EXAMPLES)


def test_output_pattern_takes_numbers_and_ellipses_as_wildcards() -> None:
    pattern = output_pattern(["cellbox: status=ok wall=1.02s peak=9M", "...", "}"])
    assert pattern.fullmatch("cellbox: status=ok wall=12.5s peak=10M\n}\n")
    assert pattern.fullmatch("cellbox: status=ok wall=1s peak=9M\na\nb\n}\n")
    assert not pattern.fullmatch("cellbox: status=error wall=1.02s peak=9M\n}\n")
    assert not pattern.fullmatch("cellbox: status=ok wall=1.02s peak=9M\n}\nmore\n")


def test_the_reader_finds_cellbox_on_path_only_after_activating(tmp_path: Path) -> None:
    # A page that gives bare `cellbox` commands without saying to activate fails here, as it does for a reader.
    like_the_clone(tmp_path)
    found = run_command("command -v cellbox || echo not found", tmp_path, activated=True)
    assert Path(found.strip()) == VENV_BIN / "cellbox"
    assert run_command(".venv/bin/cellbox --version", tmp_path, activated=False).startswith("cellbox ")
    if IN_A_VENV:
        assert run_command("command -v cellbox || echo not found", tmp_path, activated=False) == "not found\n"


def test_every_page_that_gives_commands_says_how_to_reach_them() -> None:
    # Bare `cellbox`, `pip`, `python` in a page's command blocks work only in an activated virtualenv.
    for page in PAGES:
        text = page.read_text()
        blocks = re.findall(r"^```(?:sh|console)\n(.*?)^```", text, re.MULTILINE | re.DOTALL)
        bare = [
            line for block in blocks for line in block.splitlines() if re.match(r"(\$ )?(cellbox|pip|python) ", line)
        ]
        if bare and page.name != "nbgrader.md":  # nbgrader's page installs cellbox into nbgrader's own environment
            assert ACTIVATE in text, f"{page.relative_to(ROOT)}: {bare[0]}"
        assert "{.slow}" not in text, f"{page.relative_to(ROOT)}: GitHub shows {{.slow}}; mark it {SLOW_MARKER}"


def test_the_default_cell_timeout_the_students_page_quotes_is_the_kernels() -> None:
    from cellbox.kernel.cellerrors import error_for_outcome
    from cellbox.sandbox.outcome import Outcome

    outcome = Outcome(Status.TIMED_OUT, None, "SIGKILL", 30.1, 0.0, 0, "", "", False)
    ename, evalue = error_for_outcome(outcome, Limits()) or ("", "")
    quoted = " ".join((DOCS / "getting-started" / "students.md").read_text().split())
    assert f"`{ename}: {evalue.split('; ')[0]}; ...`" in quoted


def page_text(path: Path) -> str:
    """The text of a built HTML page, without its tags."""
    return html.unescape(re.sub(r"<[^>]+>", "", path.read_text()))


def test_docs_build_with_warnings_as_errors(tmp_path: Path) -> None:
    out = tmp_path / "html"
    result = build(DOCS, out)
    assert result.returncode == 0, result.stderr
    # Pages that may come later (docs/conf.py's INTEGRATIONS) are left out of the index without a warning.
    assert "papermill.html" not in (out / "index.html").read_text() or (DOCS / "papermill.md").exists()
    # The reference pages are written from the code: every subcommand's usage, every status and limit.
    from cellbox.cli import build_parser

    cli = page_text(out / "reference" / "cli.html")
    subcommands = next(a for a in build_parser()._actions if a.dest == "command").choices
    assert subcommands
    for name in subcommands:
        assert f"cellbox {name} [-h]" in cli, name
    api = page_text(out / "reference" / "api.html")
    for status in Status:
        assert status.name in api, status
    for field in dataclasses.fields(Limits):
        assert field.name in api, field.name
    for page in PAGES:
        html = out / page.relative_to(DOCS).with_suffix(".html")
        assert html.exists(), page


def build(docs: Path, out: Path) -> subprocess.CompletedProcess[str]:
    """Run ``sphinx-build -W -b html`` on ``docs`` into ``out``, as the documentation's own build does."""
    return subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html", str(docs), str(out)],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=300,
    )


def test_an_integration_page_joins_the_index_when_it_is_written(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    shutil.copytree(DOCS, docs, ignore=shutil.ignore_patterns("_build"))
    (docs / "papermill.md").unlink(missing_ok=True)  # as before the page was written
    (docs / "papermill.md").write_text("# papermill\n\n`papermill -k cellbox in.ipynb out.ipynb` runs it.\n")
    result = build(docs, tmp_path / "html")
    assert result.returncode == 0, result.stderr
    assert 'href="papermill.html"' in (tmp_path / "html" / "index.html").read_text()


def table_rows(page: Path, heading: str | None = None) -> list[list[str]]:
    """The cells of the first table of ``page`` (under ``## heading`` if given), header dropped, backticks stripped."""
    text = page.read_text()
    if heading is not None:
        text = text.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    lines = text.splitlines()
    start = next(index for index, line in enumerate(lines) if line.startswith("|"))
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip().strip("`") for cell in line.strip("|").split("|")])
    return rows[2:]


def default_text(name: str) -> str:
    value = getattr(Limits(), name)
    if value is None:
        return "none"
    if name in ("wall_time", "cpu_time"):
        return format_time(value)
    if name in ("memory", "output", "file_size", "shared_memory"):
        return format_size(value)
    return str(value)


def test_limits_table_lists_every_limit_with_its_flag_and_default() -> None:
    rows = {row[0]: row for row in table_rows(DOCS / "reference" / "limits.md")}
    flags = {field: flag for flag, field, _metavar, _help in LIMIT_OPTIONS}
    assert set(rows) == {field.name for field in dataclasses.fields(Limits)}
    for name, row in rows.items():
        assert row[1] == flags[name], name
        assert row[2] == default_text(name), name


def test_status_table_lists_every_status_with_its_exit_status() -> None:
    rows = table_rows(DOCS / "reference" / "statuses.md")
    assert [int(row[0]) for row in rows] == list(range(1, len(Status) + 1))
    assert {row[1] for row in rows} == {status.value for status in Status}
    for row in rows:
        assert int(row[3]) == STATUS_EXIT_CODES[Status(row[1])], row[1]


def test_settings_table_lists_every_kernel_setting_with_its_default() -> None:
    rows = {row[0]: row[1] for row in table_rows(DOCS / "reference" / "settings.md")}
    own = {
        name: trait for name, trait in CellboxKernel.class_traits(config=True).items() if name in vars(CellboxKernel)
    }
    assert set(rows) == set(own)
    for name, trait in own.items():
        default = trait.default_value
        if isinstance(default, float):
            assert float(rows[name]) == default, name
        elif default == "":
            # Computed at start (notebook_dir: the kernel's working directory); the table says which.
            assert not rows[name][0].isdigit(), name
        else:
            assert rows[name] == str(default), name


_REPO_PATH = re.compile(r"`((?:kernel|tests|benchmarks|lessons|examples|share|docs|\.ci)/[\w./-]*)`")


def test_every_file_the_docs_name_exists() -> None:
    # Modules move (kernel/cellbox/...); a page that names a file keeps up, or this test says which.
    missing = []
    for page in [README, *PAGES]:
        for path in _REPO_PATH.findall(page.read_text()):
            if "NN" not in path and not (ROOT / path).exists():  # lessonNN.py: a pattern, not a file
                missing.append(f"{page.relative_to(ROOT)}: {path}")
    assert not missing, "\n".join(missing)


_DOTTED_NAME = re.compile(r"`(cellbox(?:\.\w+)+)")


def resolves(name: str) -> bool:
    """Whether a dotted name (``cellbox.grading.bridge.RemoteObject``) is a module or a name in one."""
    parts = name.split(".")
    for split in range(len(parts), 0, -1):
        try:
            value: object = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        for attribute in parts[split:]:
            if not hasattr(value, attribute):
                return False
            value = getattr(value, attribute)
        return True
    return False


def test_every_python_name_the_docs_give_exists() -> None:
    # `cellbox._launch`, `cellbox.verdict.judge`: a reader imports what the page names.
    missing = [
        f"{page.relative_to(ROOT)}: {name}"
        for page in [README, *PAGES]
        for name in _DOTTED_NAME.findall(page.read_text())
        if not resolves(name)
    ]
    assert not missing, "\n".join(missing)
