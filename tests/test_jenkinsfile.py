"""The Jenkinsfile parses as Groovy and runs the README's commands; so does .ci/run.

The Jenkinsfile is read with Groovy's own compiler (``tests/groovy/pipeline_calls.groovy``,
Debian's ``groovy`` package), so a syntax error fails here, not on the Jenkins
server.  Its ``sh`` steps are compared with the README's test command: editing
one without the other fails a test.
"""

from __future__ import annotations

import fnmatch
import json
import re
import shlex
import subprocess
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from cellbox.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
JENKINSFILE = ROOT / "Jenkinsfile"
README = ROOT / "README.md"
CI_RUN = ROOT / ".ci" / "run"
PYPROJECT = ROOT / "pyproject.toml"
CALLS_SCRIPT = Path(__file__).with_name("groovy") / "pipeline_calls.groovy"
JUNIT_OPTION = "--junitxml=test-results/junit.xml"
JUNIT_FILE = "test-results/junit.xml"
LESSONS_STAGE = "Lessons"
HEAVY_STAGE = "Heavy tests"
HEAVY_JUNIT_OPTION = "--junitxml=test-results/junit-heavy.xml"
LESSONS_COMMAND = ".venv/bin/cellbox lessons --execute"
CI_TIME_LIMIT_MINUTES = 90
_FENCE = re.compile(r"^```sh\n(.*?)^```", re.MULTILINE | re.DOTALL)


def readme_commands() -> tuple[str, str]:
    """The README's two set-up commands: the first two ``sh`` blocks before its first ``##`` heading."""
    top = README.read_text().split("\n## ", 1)[0]
    blocks = [block.strip() for block in _FENCE.findall(top)]
    assert len(blocks) == 2, f"README.md should open with exactly two ```sh blocks, found {len(blocks)}"
    for block in blocks:
        assert "\n" not in block, f"each README set-up command is one line: {block!r}"
    return blocks[0], blocks[1]


def parse_pipeline(groovy: str, path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([groovy, str(CALLS_SCRIPT), str(path)], capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def calls(require_tool: Callable[..., str]) -> list[dict[str, Any]]:
    """Every method call of the Jenkinsfile, as Groovy's parser saw it."""
    result = parse_pipeline(require_tool("groovy"), JENKINSFILE)
    assert result.returncode == 0, f"the Jenkinsfile does not parse as Groovy:\n{result.stderr}"
    return [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]


def sh_steps(calls: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """``(stage, command)`` for every ``sh`` step, in file order."""
    steps = []
    for call in calls:
        if call["name"] == "sh":
            assert call["within"][:2] == ["pipeline", "stages"], f"sh step outside a stage: {call}"
            assert len(call["args"]) == 1, f"sh step should take one command string: {call}"
            steps.append((call["stage"], call["args"][0]))
    return steps


def test_jenkinsfile_is_a_declarative_pipeline(calls: list[dict[str, Any]]) -> None:
    top = [call["name"] for call in calls if call["within"] == ["pipeline"]]
    assert calls[0]["name"] == "pipeline" and calls[0]["within"] == []
    assert {"agent", "options", "stages", "post"} <= set(top)
    stages = [call["args"][0] for call in calls if call["name"] == "stage"]
    assert stages == ["Set up", "Test", HEAVY_STAGE, LESSONS_STAGE]


def test_parser_rejects_a_jenkinsfile_with_a_syntax_error(require_tool: Callable[..., str], tmp_path: Path) -> None:
    # Positive control: the parse really is strict, so a passing parse means something.
    broken = tmp_path / "Jenkinsfile"
    broken.write_text(JENKINSFILE.read_text().rstrip().removesuffix("}"))
    result = parse_pipeline(require_tool("groovy"), broken)
    assert result.returncode != 0
    assert "startup failed" in result.stderr


def test_setup_and_test_steps_are_the_readme_test_command(calls: list[dict[str, Any]]) -> None:
    _main, test_command = readme_commands()
    steps = [command for stage, command in sh_steps(calls) if stage not in (HEAVY_STAGE, LESSONS_STAGE)]
    assert " && ".join(steps) == f"{test_command} {JUNIT_OPTION}"


def left_out_by_default() -> str:
    """The marker expression of the tests the README's test command leaves out: ``X`` of addopts' ``-m 'not (X)'``."""
    config = tomllib.loads(PYPROJECT.read_text())["tool"]["pytest"]["ini_options"]
    options = shlex.split(config["addopts"])
    expression = options[options.index("-m") + 1]
    assert expression.startswith("not (") and expression.endswith(")"), expression
    return expression.removeprefix("not (").removesuffix(")")


def test_every_marker_is_left_out_by_default_and_run_by_ci(calls: list[dict[str, Any]]) -> None:
    heavy = left_out_by_default()
    declared = [
        marker.split(":")[0]
        for marker in tomllib.loads(PYPROJECT.read_text())["tool"]["pytest"]["ini_options"]["markers"]
    ]
    assert heavy.split(" or ") == declared
    # The Jenkinsfile's stage after the README's command, and .ci/run's pass after it, run exactly those tests.
    heavy_steps = [command for stage, command in sh_steps(calls) if stage == HEAVY_STAGE]
    assert heavy_steps == [f'.venv/bin/python -m pytest -m "{heavy}" {HEAVY_JUNIT_OPTION}']
    lines = [line.strip() for line in CI_RUN.read_text().splitlines()]
    assert f'HEAVY="{heavy}"' in lines
    assert any(line.startswith(f'.venv/bin/python -m pytest -m "$HEAVY" {HEAVY_JUNIT_OPTION} ') for line in lines)


def test_test_stage_writes_junit_xml(calls: list[dict[str, Any]]) -> None:
    test_steps = [command for stage, command in sh_steps(calls) if stage == "Test"]
    assert len(test_steps) == 1 and test_steps[0].endswith(f"-m pytest {JUNIT_OPTION}")


def test_junit_results_are_published_always(calls: list[dict[str, Any]]) -> None:
    junit = [call for call in calls if call["name"] == "junit"]
    assert len(junit) == 1
    assert junit[0]["within"] == ["pipeline", "post", "always"]
    pattern = junit[0]["named"].get("testResults") or junit[0]["args"][0]
    assert fnmatch.fnmatch(JUNIT_FILE, pattern)


def test_pipeline_times_out_within_the_ci_limit(calls: list[dict[str, Any]]) -> None:
    timeouts = [call for call in calls if call["name"] == "timeout" and call["within"] == ["pipeline", "options"]]
    assert len(timeouts) == 1
    named = timeouts[0]["named"]
    assert named["unit"] == "MINUTES"
    assert 0 < int(named["time"]) <= CI_TIME_LIMIT_MINUTES


def test_lessons_stage_runs_the_readme_lessons_command_headless(calls: list[dict[str, Any]]) -> None:
    # The README's first command ends by opening the lessons; CI runs the same command with --execute.
    main_command, _test = readme_commands()
    opens_lessons = [part for part in main_command.split(" && ") if part.split()[1:2] == ["lessons"]]
    lessons = [command for stage, command in sh_steps(calls) if stage == LESSONS_STAGE]
    assert lessons == [LESSONS_COMMAND] == [f"{part} --execute" for part in opens_lessons]
    parser = build_parser()
    args = parser.parse_args(LESSONS_COMMAND.split()[1:])
    assert args.command == "lessons" and args.execute is True


def test_ci_run_runs_the_readme_test_command() -> None:
    _main, test_command = readme_commands()
    lines = [line.strip() for line in CI_RUN.read_text().splitlines()]
    assert any(line.startswith(f"{test_command} {JUNIT_OPTION}") for line in lines)


def test_ci_run_is_executable_bash() -> None:
    assert CI_RUN.stat().st_mode & 0o111
    assert CI_RUN.read_text().startswith("#!/usr/bin/env bash\n")
    result = subprocess.run(["bash", "-n", str(CI_RUN)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
