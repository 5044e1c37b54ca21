"""What ``--help`` and a mistyped option show a newcomer: sizes and times as people write them, the exit statuses."""

from __future__ import annotations

import re

import pytest

from cellbox.cli import main
from cellbox.options import LIMIT_OPTIONS
from cellbox.sandbox.limits import Limits, format_size, format_time
from cellbox.sandbox.outcome import STATUS_EXIT_CODES


def help_text(capsys: pytest.CaptureFixture[str], *command: str) -> str:
    with pytest.raises(SystemExit) as ended:
        main([*command, "--help"])
    assert ended.value.code == 0
    return capsys.readouterr().out


def option_help(text: str, flag: str) -> str:
    """The help of one option, its lines joined."""
    match = re.search(rf"^  {re.escape(flag)} \S+(.*?)(?=^  -|^\S|\Z)", text, re.MULTILINE | re.DOTALL)
    assert match, f"{flag} is not in the help"
    return " ".join(match.group(1).split())


@pytest.mark.parametrize("command", [["run"], ["grade"], ["install"]])
def test_limit_defaults_are_written_as_people_write_them_once_each(
    capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    text = help_text(capsys, *command)
    defaults = Limits()
    expected = {
        "--wall": format_time(defaults.wall_time),
        "--cpu": format_time(defaults.cpu_time),
        "--memory": format_size(defaults.memory or 0),
        "--output": format_size(defaults.output),
        "--file-size": format_size(defaults.file_size),
        "--nice": str(defaults.nice),
    }
    assert expected["--memory"] == "2G" and expected["--wall"] == "30 s"
    for flag, _field, _metavar, _help in LIMIT_OPTIONS:
        words = option_help(text, flag)
        assert words.count("default") == 1, words
        if flag in expected:
            assert words.endswith(f"(default: {expected[flag]})"), words
    assert not re.search(r"\d{7,}", text), "a size in bytes"


def test_run_help_lists_every_exit_status(capsys: pytest.CaptureFixture[str]) -> None:
    text = " ".join(help_text(capsys, "run").split())
    for status, code in STATUS_EXIT_CODES.items():
        assert f"{code} {status.value}" in text
    assert "2 bad input" in text


@pytest.mark.parametrize("command", [[], ["grade"], ["lessons"], ["install"], ["doctor"]])
def test_every_help_gives_the_exit_statuses(capsys: pytest.CaptureFixture[str], command: list[str]) -> None:
    text = " ".join(help_text(capsys, *command).split())
    assert "exit status: 0 " in text and "2 bad input" in text


def test_unknown_option_shows_the_usage_of_its_subcommand(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as ended:
        main(["run", "--frobnicate"])
    assert ended.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: cellbox run [-h] [--wall SECONDS]")
    assert err.splitlines()[-1] == "cellbox run: error: unrecognized arguments: --frobnicate"


def test_unknown_option_before_a_subcommand_shows_cellboxs_usage(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as ended:
        main(["--frobnicate"])
    assert ended.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == "cellbox: error: unrecognized arguments: --frobnicate"
