"""The README says what the code does: its tables and its first command are checked against the real thing."""

from __future__ import annotations

import dataclasses
import re
import shlex
import subprocess
import sys
from pathlib import Path

from cellbox.options import LIMIT_OPTIONS
from cellbox.sandbox.limits import Limits, format_size, format_time
from cellbox.sandbox.outcome import STATUS_EXIT_CODES, Status

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"


def table_rows(heading: str) -> list[list[str]]:
    """The cells of the first table under ``## heading``, without its header, backticks stripped."""
    section = README.read_text().split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("|")]
    return [[cell.strip().strip("`") for cell in row.strip("|").split("|")] for row in rows[2:]]


def readme_main_command() -> str:
    return re.findall(r"^```sh\n(.*?)\n```", README.read_text(), re.MULTILINE)[0]


def default_text(name: str) -> str:
    value = getattr(Limits(), name)
    if name in ("wall_time", "cpu_time"):
        return format_time(value)
    if name in ("memory", "output", "file_size"):
        return format_size(value)
    return str(value)


def test_limits_table_lists_every_limit_with_its_flag_and_default() -> None:
    rows = {row[0]: row for row in table_rows("Limits")}
    flags = {field: flag for flag, field, _metavar, _help in LIMIT_OPTIONS}
    assert set(rows) == {field.name for field in dataclasses.fields(Limits)}
    for name, row in rows.items():
        assert row[1] == flags[name], name
        assert row[2] == default_text(name), name


def test_status_table_lists_every_status_with_its_exit_status() -> None:
    rows = table_rows("How a run ends: the statuses")
    assert [int(row[0]) for row in rows] == list(range(1, len(Status) + 1))
    assert {row[1] for row in rows} == {status.value for status in Status}
    for row in rows:
        assert int(row[3]) == STATUS_EXIT_CODES[Status(row[1])], row[1]


def test_main_command_demo_meets_every_limit_and_ends_ok() -> None:
    # The README's first command runs `.venv/bin/cellbox run ...` (then opens the lessons): run that part here.
    argv = shlex.split(next(part for part in readme_main_command().split(" && ") if " run " in f" {part} "))
    assert Path(argv[0]).name == "cellbox" and argv[1] == "run"
    cellbox = Path(sys.executable).with_name("cellbox")
    result = subprocess.run(
        [str(cellbox), *argv[1:]], cwd=ROOT, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=60
    )
    assert result.returncode == STATUS_EXIT_CODES[Status.OK], result.stderr
    assert "MemoryError (RLIMIT_AS)" in result.stdout
    assert "EFBIG (RLIMIT_FSIZE)" in result.stdout
    assert "SIGXCPU after" in result.stdout
    assert result.stderr.startswith("cellbox: status=ok exit=0 ")
