"""``cellbox lessons``: finding the lessons, running them headless and reporting each, opening JupyterLab."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import nbformat
import pytest

from cellbox.cli import main
from cellbox.lessons import find_lessons_dir, jupyterlab_command, select_notebooks
from conftest import require_all

ROOT = Path(__file__).resolve().parent.parent
LESSONS = ROOT / "lessons"


@pytest.fixture(scope="module", autouse=True)
def cellbox_kernel() -> None:
    from jupyter_client.kernelspec import KernelSpecManager

    if "cellbox" not in KernelSpecManager().find_kernel_specs():
        message = "the 'cellbox' kernelspec is not installed (pip install -e . installs it)"
        if require_all():
            pytest.fail(message)
        pytest.skip(message)


def test_lessons_dir_is_the_source_trees_lessons_folder() -> None:
    assert find_lessons_dir() == LESSONS


def test_select_notebooks_picks_one_lesson_or_its_solution() -> None:
    assert [p.name for p in select_notebooks(LESSONS, lesson=3)] == ["03-timeouts.ipynb"]
    assert select_notebooks(LESSONS, lesson=3, solutions=True) == [LESSONS / "solutions" / "03-timeouts.ipynb"]
    assert len(select_notebooks(LESSONS)) >= 12


def test_execute_solution_lesson_reports_ok_and_passed_checks(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["lessons", "--execute", "--lesson", "4", "--solutions"]) == 0
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if line.startswith("04-scrub-the-environment.ipynb"))
    assert " ok " in line and "checks: 2 passed" in line  # lessons 1-10 have two graded exercises
    assert "1 of 1 lessons ran cleanly" in out


def test_execute_student_lesson_is_ok_with_checks_not_done(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["lessons", "--execute", "--lesson", "3"]) == 0
    line = capsys.readouterr().out.splitlines()[0]
    assert line.startswith("03-timeouts.ipynb") and " ok " in line and "checks: 2 todo" in line


def test_execute_failing_lesson_names_the_error_and_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "cellbox", "display_name": "Python 3 (cellbox)", "language": "python"}
    nb.cells = [
        nbformat.v4.new_code_cell("print('fine')"),
        nbformat.v4.new_code_cell("1 / 0", metadata={"tags": ["raises-exception"]}),
        nbformat.v4.new_code_cell("{}['missing']"),
    ]
    nbformat.write(nb, tmp_path / "01-broken.ipynb")
    shutil.copy(LESSONS / "02-in-process-sandboxes-fail.ipynb", tmp_path)
    assert main(["lessons", "--execute", "--dir", str(tmp_path)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("01-broken.ipynb") and "FAILED" in out[0]
    assert out[1].strip() == "KeyError: 'missing'"
    assert out[2].startswith("02-in-process-sandboxes-fail.ipynb") and " ok " in out[2]
    assert out[-1] == "cellbox lessons: 1 of 2 lessons ran cleanly"


def test_unknown_lesson_is_a_one_line_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["lessons", "--execute", "--lesson", "99"]) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [f"cellbox lessons: error: --lesson 99: no notebook 99-*.ipynb in {LESSONS}"]


def test_missing_lessons_folder_is_a_one_line_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["lessons", "--dir", str(tmp_path / "nowhere")]) == 2
    assert capsys.readouterr().err.strip() == f"cellbox lessons: error: --dir {tmp_path / 'nowhere'}: no such folder"


def test_jupyterlab_command_serves_the_lessons_folder_and_opens_a_lesson() -> None:
    notebook = LESSONS / "01-separate-process.ipynb"
    command = jupyterlab_command(LESSONS, notebook)
    assert command[:3] == [sys.executable, "-m", "jupyterlab"]
    assert f"--ServerApp.root_dir={LESSONS}" in command
    # The server's default URL is the lesson's page: the browser opens it and the printed URLs lead there.
    assert command[-1] == "--LabApp.default_url=/lab/tree/01-separate-process.ipynb"
    solutions = jupyterlab_command(LESSONS, LESSONS / "solutions" / notebook.name)
    assert solutions[-1] == f"--LabApp.default_url=/lab/tree/solutions/{notebook.name}"
    # docs/kernel.md: as root, `cellbox lessons` gives JupyterLab the --allow-root it would refuse to start without.
    assert ("--allow-root" in command) == (os.geteuid() == 0)


def test_readme_first_command_installs_the_lessons_extra_and_opens_the_lessons() -> None:
    import re
    import shlex

    first = re.findall(r"^```sh\n(.*?)\n```", (ROOT / "README.md").read_text(), re.MULTILINE)[0]
    parts = first.split(" && ")
    assert "'.[lessons]'" in parts[1] and parts[1].startswith(".venv/bin/pip install -e ")
    assert shlex.split(parts[-1]) == [".venv/bin/cellbox", "lessons"]
    from cellbox.cli import build_parser

    args = build_parser().parse_args(shlex.split(parts[-1])[1:])
    assert args.command == "lessons" and not args.execute
