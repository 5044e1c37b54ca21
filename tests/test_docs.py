"""The documentation builds with warnings as errors, its command examples run, and its tables match the code.

Every code block whose language is ``console`` in ``docs/`` (and in the README) is an example: each ``$ `` line
is a command, run with ``bash`` as a reader of the page runs it, in a temporary directory that stands for the
clone after its setup: a copy of ``examples/`` and ``lessons/``, and ``.venv/bin`` (this environment's ``bin``,
so the installed ``cellbox``). That ``bin`` is on ``PATH`` only when the page says to activate the virtualenv
(``. .venv/bin/activate``), as it is in the reader's shell; ``$ cd DIR`` moves the commands after it to ``DIR``.
The lines below a command are its output, stdout and stderr together. In that output a number stands for any
number, ``...`` for any text on its line, and a line of ``...`` alone for any number of lines. A block with the
HTML comment ``<!-- slow -->`` on the line before it (which GitHub and Sphinx do not show) is marked slow.

Each getting-started page (``docs/getting-started/*.md``) is also run top to bottom, as a reader follows it in one
terminal: its ``sh`` and ``console`` commands in order, in one ``bash``, in a fresh copy of the repository whose
``.venv/bin`` is this environment's, on ``PATH`` once the page activates it, with a home directory of its own.
The commands that would change this machine or run for long have stand-ins (:data:`STAND_INS`): making the venv
and ``pip install -e`` check that the venv and the extras are there, ``python -m pytest`` collects, JupyterLab is
opened and stopped as Ctrl-C stops it, ``cellbox install --sys-prefix`` writes into the folder. Its slow
``console`` blocks run there only. Every stated ``(default: ...)`` of a ``cellbox`` help text is checked against
what the command does without the option.
"""

from __future__ import annotations

import argparse
import dataclasses
import html
import importlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import pytest

from cellbox.kernel.kernel import CellboxKernel
from cellbox.options import LIMIT_OPTIONS
from cellbox.sandbox.limits import Limits, format_size, format_time, limits_text
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


# `cellbox grade` says so when submissions get fewer layers than on a machine with every one; the pages show
# such a machine's output.
GRADE_ISOLATION_NOTE = "cellbox grade: note: submissions run with "


def as_on_a_full_machine(output: str) -> str:
    """The output as on a machine with every isolation layer: without grade's note of the layers this one lacks."""
    from cellbox.sandbox.isolation import probe

    if not probe().missing:
        return output
    return "".join(line for line in output.splitlines(keepends=True) if not line.startswith(GRADE_ISOLATION_NOTE))


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


def run_alone(example: Example) -> bool:
    """Whether a block runs by itself: a slow one of a getting-started page runs in its page's run instead."""
    return not (example.slow and example.where.startswith("docs/getting-started/"))


@pytest.mark.parametrize(
    "example",
    [pytest.param(e, id=e.where, marks=[pytest.mark.slow] if e.slow else []) for e in EXAMPLES if run_alone(e)],
)
def test_console_example_prints_what_the_docs_show(example: Example, tmp_path: Path) -> None:
    like_the_clone(tmp_path)
    cwd = tmp_path
    for command, expected in example.commands:
        if cd := _CD.fullmatch(command):
            cwd = cwd / cd.group(1)
            assert cwd.is_dir() and not expected, f"{example.where}: `{command}`"
            continue
        output = as_on_a_full_machine(as_a_normal_user(run_command(command, cwd, example.activated)))
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


# ---------------------------------------------------------------------------------- the defaults the help texts state

_STATED_DEFAULT = re.compile(r"\(default: ((?:[^()]|\([^()]*\))*)\)")


def subcommands() -> dict[str, argparse.ArgumentParser]:
    """``cellbox``'s subcommands and their parsers."""
    from cellbox.cli import build_parser

    return next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices


def stated_defaults() -> dict[tuple[str, str], str]:
    """``(subcommand, flag) -> X`` for every option whose help says ``(default: X)``, as ``--help`` prints it."""
    stated = {}
    for name, parser in subcommands().items():
        for action in parser._actions:
            words = " ".join((action.help or "").split())
            match = _STATED_DEFAULT.search(words)
            # A default said any other way ("forkserver (default, ...)") is one this test cannot check.
            assert match or "default" not in words, f"cellbox {name} {action.option_strings[0]}: {words}"
            if match:
                stated[(name, action.option_strings[0])] = match.group(1)
    return stated


def limit_words(limits: Limits) -> dict[str, str]:
    """Each limit flag's value as a help text writes it (``30 s``, ``2G``, ``none``)."""
    words = {}
    for flag, field, _metavar, _help in LIMIT_OPTIONS:
        value = getattr(limits, field)
        if value is None:
            words[flag] = "none"
        elif field in ("wall_time", "cpu_time"):
            words[flag] = format_time(value)
        elif field in ("memory", "output", "file_size", "shared_memory", "disk", "resident"):
            words[flag] = format_size(value)
        else:
            words[flag] = str(value)
    return words


def real_defaults(tmp_path: Path) -> dict[tuple[str, str], str]:
    """What each subcommand does without the option, found by the code that does it, in the help's words."""
    from types import SimpleNamespace

    from cellbox.cli import RUN_ISOLATION, build_parser
    from cellbox.grading.task import GRADE_ISOLATION
    from cellbox.lessons import DEFAULT_COPY, find_lessons_dir
    from cellbox.options import limits_from_args
    from cellbox.sandbox.isolation import isolation_from_args

    parser = build_parser()
    real: dict[tuple[str, str], str] = {}
    sandboxed = ((["run", "x.py"], RUN_ISOLATION), (["grade", "s", "--tests", "t"], GRADE_ISOLATION))
    for argv, isolation_default in sandboxed:
        args = parser.parse_args(argv)
        real.update({(argv[0], flag): words for flag, words in limit_words(limits_from_args(args)).items()})
        isolation = isolation_from_args(args, isolation_default)
        real[(argv[0], "--isolation")] = isolation.mode
        real[(argv[0], "--network")] = "the network" if isolation.network else "no network when isolated"
        real[(argv[0], "--layers")] = ",".join(isolation.layers)
        for action in subcommands()[argv[0]]._actions:
            if action.default not in (None, [], False, argparse.SUPPRESS):
                real[(argv[0], action.option_strings[0])] = str(action.default)
    # `cellbox install` without an option leaves it out of kernel.json: the kernel's own setting holds.
    traits = CellboxKernel.class_traits(config=True)
    kernel = SimpleNamespace(**{name: trait.default_value for name, trait in traits.items()})
    kernel_limits = CellboxKernel.session_limits.fget(kernel)  # type: ignore[attr-defined]
    real.update({("install", flag): words for flag, words in limit_words(kernel_limits).items()})
    kernel.session_limits = kernel_limits
    real[("install", "--ceiling")] = limits_text(CellboxKernel.ceiling_limits.fget(kernel))  # type: ignore[attr-defined]
    real[("install", "--session-memory")] = traits["session_memory"].default_value
    real[("install", "--isolation")] = traits["isolation"].default_value
    real[("install", "--start-method")] = traits["start_method"].default_value
    installed = run_command(f"{VENV_BIN / 'cellbox'} install --prefix {tmp_path} --name quiz", tmp_path, False)
    spec = json.loads((tmp_path / "share" / "jupyter" / "kernels" / "quiz" / "kernel.json").read_text())
    assert spec["display_name"] == "Python 3 (quiz)", installed
    real[("install", "--name")] = parser.parse_args(["install"]).name
    real[("install", "--display-name")] = "'Python 3 (NAME)'"
    pwd = run_command(f"{VENV_BIN / 'cellbox'} run --isolation none -- pwd", tmp_path, False)
    assert pwd.splitlines()[0] == str(tmp_path), pwd
    real[("run", "--cwd")] = "the current directory"
    grade = parser.parse_args(["grade", "s", "--tests", "t"])
    assert grade.jobs == (os.cpu_count() or 1) and grade.test_timeout is None and grade.assignment is None
    real[("grade", "--jobs")] = "the number of cores"
    real[("grade", "--test-timeout")] = "only --wall, for all the tests together"
    real[("grade", "--assignment")] = "the name of TESTS"
    real[("grade", "--out")] = f"./{grade.out}"
    assert find_lessons_dir(None) == ROOT / "lessons"
    real[("lessons", "--dir")] = "lessons/ of this source tree, or ./lessons"
    real[("lessons", "--into")] = f"~/{DEFAULT_COPY}"
    real[("lessons", "--kernel")] = parser.parse_args(["lessons"]).kernel
    return real


def test_every_default_a_help_text_states_is_the_one_the_command_uses(tmp_path: Path) -> None:
    # `cellbox install --help` once said `--isolation ... none (default)` while its kernels ran with every layer.
    stated = stated_defaults()
    real = real_defaults(tmp_path)
    assert ("install", "--isolation") in stated and ("run", "--wall") in stated
    wrong = [
        f"cellbox {command} {flag}: the help says (default: {words}), the command uses {real.get((command, flag))}"
        for (command, flag), words in stated.items()
        if real.get((command, flag)) != words
    ]
    assert not wrong, "\n".join(wrong)


_CELLBOX_COMMAND = re.compile(r"(?:^|[`\s(]|bin/)cellbox ([a-z]+)((?: [^`\n&|;]*)?)", re.MULTILINE)


def test_every_option_the_docs_give_a_subcommand_is_one_it_has() -> None:
    # `cellbox lessons --allow-root` once stood in docs/kernel.md: a flag only JupyterLab has.
    parsers = subcommands()
    unknown = []
    for page in [README, *PAGES]:
        for name, rest in _CELLBOX_COMMAND.findall(page.read_text()):
            if name not in parsers:
                continue
            options = parsers[name]._option_string_actions
            for token in rest.split(" -- ")[0].split():
                flag = token.split("=")[0].strip("'\"`.,)")
                if flag.startswith("--") and len(flag) > 2 and flag not in options:
                    unknown.append(f"{page.relative_to(ROOT)}: cellbox {name} {flag}")
    assert not unknown, "\n".join(unknown)


# ------------------------------------------------------------------- each getting-started page, top to bottom

GETTING_STARTED = sorted((DOCS / "getting-started").glob("*.md"))
PAGE_TIMEOUT = 900  # seconds for one whole page; the instructors' (two gradings) takes about a minute
_SHELL_BLOCK = re.compile(r"^```(sh|console)\n(.*?)^```", re.MULTILINE | re.DOTALL)
_STEP = re.compile(r"\n@@step (\d+)@@\n")

# The commands a page gives that this test cannot run as they stand, and what runs instead: bash functions,
# which the shell finds before any program on PATH. Each checks what it can of the command it stands for.
STAND_INS = r"""
python3() {  # `python3 -m venv .venv`: the folder's .venv/bin is this test's virtualenv, made already
    if [ "$*" = "-m venv .venv" ]; then test -x .venv/bin/python; else command python3 "$@"; fi
}
pip() {  # `pip install -e '.[EXTRA]'`: this virtualenv holds the repository's editable install; EXTRA must exist
    if [ "$1 $2" != "install -e" ] || [ $# != 3 ]; then command pip "$@"; return; fi
    command python -c '
import re, sys, tomllib
path, extras = re.fullmatch(r"(\.)(?:\[([\w,-]+)\])?", sys.argv[1]).groups()
known = tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]
missing = [extra for extra in (extras or "").split(",") if extra and extra not in known]
sys.exit(f"pip install -e: no extra {missing} in pyproject.toml" if missing else 0)' "$3"
}
python() {  # `python -m pytest ...`: the suite is not run inside itself; collecting checks the options and paths
    if [ "$1 $2" = "-m pytest" ]; then shift 2; command python -m pytest --collect-only -q "$@" >/dev/null
    else command python "$@"; fi
}
sphinx-build() {  # tests/test_docs.py's build test runs the same build; here only that the program is there
    command sphinx-build --version >/dev/null && test -f docs/conf.py
}
cellbox() {
    case "$1" in
    install)  # --sys-prefix would write into this virtualenv, which other tests share: the folder's own prefix
        local args=() arg
        for arg; do if [ "$arg" = --sys-prefix ]; then args+=(--prefix "$PWD/sys-prefix"); else args+=("$arg"); fi
        done
        command cellbox "${args[@]}";;
    lessons)
        case " $* " in *" --execute "*) command cellbox "$@"; return;; esac
        # JupyterLab opens, and the reader stops it with Ctrl-C, which cellbox takes as it takes SIGTERM.
        command cellbox "$@" >jupyterlab.log 2>&1 &
        local pid=$! i
        for i in $(seq 1200); do
            grep -q "/lab?token=" jupyterlab.log && break
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        kill -TERM "$pid"; wait "$pid"; local status=$?
        cat jupyterlab.log; rm jupyterlab.log
        return "$status";;
    *) command cellbox "$@";;
    esac
}
_check() {  # a line of an `sh` block failed: say which, and stop as a reader would
    if [ "$1" != 0 ]; then printf '\n@@failed %s (exit status %s)@@\n' "$2" "$1"; exit 1; fi
}
"""


class Step(NamedTuple):
    where: str
    console: bool
    command: str
    expected: list[str]


def page_steps(page: Path) -> list[Step]:
    """Every command of a page in the order a reader meets them: ``sh`` lines, and ``console`` ``$ `` lines."""
    text = page.read_text()
    steps: list[Step] = []
    for match in _SHELL_BLOCK.finditer(text):
        line = text.count("\n", 0, match.start(2))
        if match.group(1) == "sh":
            commands = match.group(2).replace("\\\n", " ").splitlines()
            steps += [Step(f"{page.name}:{line}", False, command, []) for command in commands if command.strip()]
            continue
        for row in match.group(2).splitlines():
            if row.startswith("$ "):
                steps.append(Step(f"{page.name}:{line}", True, row[2:], []))
            else:
                steps[-1].expected.append(row)
    return steps


def page_script(steps: list[Step]) -> str:
    """One bash script: the stand-ins, then each step after a marker; an ``sh`` line that fails stops it."""
    lines = [STAND_INS]
    for index, step in enumerate(steps):
        lines.append(f"printf '\\n@@step {index}@@\\n'")
        lines.append(step.command)
        if not step.console:
            lines.append(f"_check $? {shlex.quote(step.where + ': ' + step.command)}")
    lines.append(f"printf '\\n@@step {len(steps)}@@\\n'")
    return "\n".join(lines) + "\n"


# What a checkout holds that a fresh clone does not (CI's second run copies the files without .git).
NOT_IN_A_CLONE = (
    ".git",
    ".venv",
    "_build",
    "__pycache__",
    "*_cache",
    "test-results",
    "*.egg-info",
    ".ipynb_checkpoints",
)


def as_a_clone(directory: Path) -> None:
    """Make ``directory`` stand for a fresh clone: the repository's files, and ``.venv/bin`` (this virtualenv's)."""
    shutil.copytree(ROOT, directory, ignore=shutil.ignore_patterns(*NOT_IN_A_CLONE), dirs_exist_ok=True)
    (directory / ".venv").mkdir()
    (directory / ".venv" / "bin").symlink_to(VENV_BIN, target_is_directory=True)


def test_page_steps_follow_the_page() -> None:
    steps = page_steps(DOCS / "getting-started" / "instructors.md")
    assert not steps[0].console and steps[0].command.startswith("python3 -m venv .venv && . .venv/bin/activate")
    commands = [step.command for step in steps]
    assert (
        commands.index("cd grading-demo")
        < commands.index("cd ..")
        < commands.index("cp lessons/solutions/*.ipynb submissions/alice/")
    )
    assert steps[-1].command.startswith("cellbox install --sys-prefix")
    assert page_script(steps).count("printf '\\n@@step ") == len(steps) + 1


@pytest.mark.slow
@pytest.mark.skipif(not IN_A_VENV, reason="the pages activate a virtualenv: run the tests from one")
@pytest.mark.parametrize("page", GETTING_STARTED, ids=[page.name for page in GETTING_STARTED])
def test_getting_started_page_works_top_to_bottom_in_one_shell(page: Path, tmp_path: Path) -> None:
    # A reader follows the page in one terminal: each command where the one before it left them. The
    # instructors' page once failed at "Grade the lessons", still in the first demo's folder.
    clone, home = tmp_path / "clone", tmp_path / "home"
    clone.mkdir()
    home.mkdir()
    as_a_clone(clone)
    steps = page_steps(page)
    (tmp_path / "page.sh").write_text(page_script(steps))
    env = {key: value for key, value in os.environ.items() if not key.startswith(("JPY_", "JUPYTER_", "VIRTUAL_ENV"))}
    env.update(
        PATH=reader_path(False),  # the page activates the virtualenv itself
        HOME=str(home),  # ~/cellbox-lessons and JupyterLab's files land here
        PIP_CACHE_DIR=os.environ.get("PIP_CACHE_DIR", str(Path.home() / ".cache" / "pip")),
        BROWSER="true",  # JupyterLab's "open a browser" does nothing
    )
    result = subprocess.run(
        ["bash", str(tmp_path / "page.sh")],
        cwd=clone,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=PAGE_TIMEOUT,
    )
    assert "@@failed" not in result.stdout and result.returncode == 0, result.stdout[-3000:]
    outputs = _STEP.split(result.stdout)[1:]
    said = {int(index): output for index, output in zip(outputs[::2], outputs[1::2], strict=True)}
    assert sorted(said) == list(range(len(steps) + 1)), result.stdout[-3000:]
    for index, step in enumerate(steps):
        output = as_on_a_full_machine(as_a_normal_user(said[index]))
        if output and not output.endswith("\n"):
            output += "\n"
        if step.console:
            assert output_pattern(step.expected).fullmatch(output), (
                f"{step.where}: `{step.command}` printed\n{output}\nwhile the page shows\n" + "\n".join(step.expected)
            )
    if page.name == "students.md":  # the first command copies the lessons into ~/cellbox-lessons and opens them
        from cellbox.lessons import DEFAULT_COPY

        copied = sorted(path.name for path in (home / DEFAULT_COPY).glob("[0-9][0-9]-*.ipynb"))
        assert copied == sorted(path.name for path in (ROOT / "lessons").glob("[0-9][0-9]-*.ipynb"))
        assert "cellbox lessons: JupyterLab stopped" in result.stdout
    if page.name == "instructors.md":
        assert (clone / "sys-prefix" / "share" / "jupyter" / "kernels" / "cellbox-short" / "kernel.json").is_file()


def test_the_grade_note_left_out_on_a_machine_without_some_layer_is_grades(capsys: pytest.CaptureFixture[str]) -> None:
    from cellbox.grading.cli import _note_weak_isolation
    from cellbox.sandbox.isolation import Isolation

    _note_weak_isolation(Isolation(mode="none"))
    note = capsys.readouterr().err
    assert note.startswith(GRADE_ISOLATION_NOTE) and note.count("\n") == 1
