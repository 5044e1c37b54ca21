"""The lesson notebooks: built from their sources, well-formed, free of solutions, and runnable.

The fast tests read the committed notebooks; the slow ones run every lesson under the ``cellbox`` kernel with
nbclient (solutions: every check passes; student copies: every check prints its "not done yet" feedback).
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import nbformat
import pytest

from conftest import require_all

ROOT = Path(__file__).resolve().parent.parent
LESSONS = ROOT / "lessons"
KERNEL_NAME = "cellbox"
PASS, FAIL, TODO = "\u2714", "\u2718", "\u2026"


def _load_build() -> ModuleType:
    spec = importlib.util.spec_from_file_location("lessons_build", LESSONS / "build.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["lessons_build"] = module
    spec.loader.exec_module(module)
    return module


build = _load_build()
LESSON_LIST = build.lessons()
STUDENT = {lesson.filename: LESSONS / lesson.filename for lesson in LESSON_LIST}
SOLUTION = {lesson.filename: LESSONS / "solutions" / lesson.filename for lesson in LESSON_LIST}


def _read(path: Path) -> nbformat.NotebookNode:
    return nbformat.read(path, as_version=4)


# ------------------------------------------------------------------ what is committed


def test_there_are_a_dozen_lessons_in_order() -> None:
    numbers = [lesson.number for lesson in LESSON_LIST]
    assert numbers == list(range(1, len(numbers) + 1))
    assert len(numbers) >= 12


def test_committed_notebooks_are_exactly_what_the_build_makes() -> None:
    built = build.build()
    for path, text in built.items():
        assert path.exists(), f"{path} is missing: run python lessons/build.py"
        assert path.read_text() == text, f"{path} differs from its source: run python lessons/build.py"
    committed = set(LESSONS.glob("*.ipynb")) | set((LESSONS / "solutions").glob("*.ipynb"))
    assert committed == set(built), "a notebook in lessons/ has no source in lessons/src/"


@pytest.mark.parametrize("path", [*STUDENT.values(), *SOLUTION.values()], ids=lambda p: p.parent.name + "/" + p.name)
def test_notebook_is_nbformat4_with_cellbox_kernelspec_and_no_outputs(path: Path) -> None:
    nb = _read(path)
    nbformat.validate(nb)
    assert nb.nbformat == 4
    assert nb.metadata.kernelspec == {"name": "cellbox", "display_name": "Python 3 (cellbox)", "language": "python"}
    code_cells = [cell for cell in nb.cells if cell.cell_type == "code"]
    assert all(cell.outputs == [] and cell.execution_count is None for cell in code_cells)
    ids = [cell.id for cell in nb.cells]
    assert len(ids) == len(set(ids))


@pytest.mark.parametrize("lesson", LESSON_LIST, ids=lambda lesson: lesson.filename)
def test_student_notebook_holds_no_solution_code(lesson) -> None:  # type: ignore[no-untyped-def]
    student = _read(STUDENT[lesson.filename])
    sources = {cell.id: cell.source for cell in student.cells}
    text = json.dumps([cell.source for cell in student.cells])
    for cell in lesson.cells:
        if not cell.id.startswith("exercise-"):
            continue
        solution_lines = _solution_lines(cell.solution, cell.student)
        assert solution_lines, f"{lesson.filename}: {cell.id} has no solution lines"
        assert "# YOUR CODE HERE" in sources[cell.id] and "raise NotImplementedError" in sources[cell.id]
        for line in solution_lines:
            assert line.strip() not in sources[cell.id], f"{lesson.filename}: solution line in {cell.id}: {line}"
        assert build.BEGIN not in text and build.END not in text


def _solution_lines(solution: str, student: str) -> list[str]:
    """Lines of the solution that are not in the student's copy (the hidden part), ignoring trivial ones."""
    kept = set(student.splitlines())
    return [line for line in solution.splitlines() if line not in kept and len(line.strip()) > 6]


@pytest.mark.parametrize("lesson", LESSON_LIST, ids=lambda lesson: lesson.filename)
def test_lesson_has_goal_plan_exercise_mistakes_next_steps_and_pointer(lesson) -> None:  # type: ignore[no-untyped-def]
    markdown = "\n".join(cell.student for cell in lesson.cells if cell.kind == "markdown")
    for part in ("**Goal:**", "**The plan.**", "## Common mistakes", "## Try this next", "## The real thing"):
        assert part in markdown, f"{lesson.filename} has no {part!r}"
    assert "cellbox." in markdown.split("## The real thing", 1)[1]
    assert lesson.exercises, f"{lesson.filename} has no exercise"
    checks = [cell.id for cell in lesson.cells if cell.id.startswith("check-")]
    assert sorted(checks) == sorted(f"check-{name}" for name in lesson.exercises)


def test_split_solution_replaces_the_marked_block() -> None:
    student, solution, hidden = build.split_solution(
        "def f(x):\n    ### BEGIN SOLUTION\n    return x + 1\n    ### END SOLUTION\n"
    )
    assert student == "def f(x):\n    # YOUR CODE HERE\n    raise NotImplementedError"
    assert solution == "def f(x):\n    return x + 1"
    assert hidden == ["    return x + 1"]
    with pytest.raises(ValueError):
        build.split_solution("def f(x):\n    return x\n")


def test_grading_tests_exist_for_every_lesson_with_exercises() -> None:
    for lesson in LESSON_LIST:
        path = LESSONS / "grading" / f"test_lesson{lesson.number:02d}.py"
        assert path.exists(), f"no hidden tests for {lesson.filename}"
        module = lesson.filename[:-len(".ipynb")].replace("-", "_")
        assert f'"nb_{module}"' in path.read_text()


def _load_lessonkit() -> ModuleType:
    spec = importlib.util.spec_from_file_location("lessonkit", LESSONS / "lessonkit.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_check_helper_turns_every_failure_into_one_friendly_line(capsys: pytest.CaptureFixture[str]) -> None:
    kit = _load_lessonkit()

    def scaffold() -> None:
        raise NotImplementedError

    def wrong() -> None:
        kit.expect(1 + 1 == 3, "run_isolated returned 1 for code that succeeds: did you compare returncode with 0?")

    def crashing() -> None:
        {}["key"]

    def forgotten() -> None:
        raise NameError("name 'alive' is not defined")

    for test in (scaffold, wrong, crashing, forgotten, lambda: "it works"):
        assert kit.check("run_isolated", test) is None
    assert capsys.readouterr().out.splitlines() == [
        f"{TODO} run_isolated: not done yet: replace the NotImplementedError in run_isolated",
        f"{FAIL} run_isolated: run_isolated returned 1 for code that succeeds: did you compare returncode with 0?",
        f"{FAIL} run_isolated raised KeyError: 'key'",
        f"{FAIL} run_isolated raised NameError: name 'alive' is not defined; "
        "if it comes from an earlier cell, run the cells above first",
        f"{PASS} run_isolated: it works",
    ]


def test_every_notebook_starts_with_the_lessonkit_setup_cell() -> None:
    kit = (LESSONS / "lessonkit.py").read_text()
    for path in [*STUDENT.values(), *SOLUTION.values()]:
        first = _read(path).cells[0]
        assert first.metadata.tags == ["setup"] and first.metadata.jupyter == {"source_hidden": True}
        assert first.source.endswith(kit.strip("\n"))


# ------------------------------------------------------------------ running them


def _kernel_name() -> str:
    from jupyter_client.kernelspec import KernelSpecManager

    if KERNEL_NAME in KernelSpecManager().find_kernel_specs():
        return KERNEL_NAME
    message = f"the {KERNEL_NAME!r} kernelspec is not installed (pip install -e . installs it)"
    if require_all():
        pytest.fail(message)
    pytest.skip(message)


def _execute(path: Path) -> nbformat.NotebookNode:
    from nbclient import NotebookClient

    nb = _read(path)
    client = NotebookClient(
        nb, kernel_name=_kernel_name(), timeout=120, resources={"metadata": {"path": str(LESSONS)}}
    )
    client.execute()  # raises CellExecutionError on an error in a cell not tagged raises-exception
    return nb


def _stdout(cell: nbformat.NotebookNode) -> str:
    return "".join(out.get("text", "") for out in cell.outputs if out.output_type == "stream")


def _check_cells(nb: nbformat.NotebookNode) -> list[nbformat.NotebookNode]:
    return [cell for cell in nb.cells if "check" in cell.metadata.get("tags", [])]


@pytest.mark.slow
@pytest.mark.parametrize("name", list(SOLUTION), ids=str)
def test_solution_notebook_runs_and_every_check_passes(name: str) -> None:
    nb = _execute(SOLUTION[name])
    checks = _check_cells(nb)
    assert checks
    for cell in checks:
        line = _stdout(cell).strip()
        assert line.startswith(PASS), f"{name} {cell.id}: {line}"


@pytest.mark.slow
@pytest.mark.parametrize("name", list(STUDENT), ids=str)
def test_student_notebook_runs_and_checks_say_not_done(name: str) -> None:
    nb = _execute(STUDENT[name])
    checks = _check_cells(nb)
    for cell in checks:
        line = _stdout(cell).strip()
        exercise = cell.id.removeprefix("check-")
        assert line == f"{TODO} {exercise}: not done yet: replace the NotImplementedError in {exercise}", (
            f"{name} {cell.id}: {line}"
        )
        assert not any(out.output_type == "error" for out in cell.outputs)


# ------------------------------------------------------------------ grading the lessons


def _grading_test_names() -> set[str]:
    names = set()
    for path in sorted((LESSONS / "grading").glob("test_lesson*.py")):
        for line in path.read_text().splitlines():
            if line.startswith("def test_"):
                names.add(f"{path.name}::{line[4:].split('(')[0]}")
    return names


@pytest.mark.slow
def test_grading_a_complete_and_a_blank_course_gives_verified_and_failed(tmp_path: Path) -> None:
    from cellbox.cli import main

    submissions = tmp_path / "submissions"
    for student, source in (("complete", LESSONS / "solutions"), ("blank", LESSONS)):
        (submissions / student).mkdir(parents=True)
        for notebook in source.glob("[0-9][0-9]-*.ipynb"):
            (submissions / student / notebook.name).write_bytes(notebook.read_bytes())
    out = tmp_path / "out"
    status = main(["grade", str(submissions), "--tests", str(LESSONS / "grading"), "--out", str(out), "--jobs", "2"])
    assert status in (0, 1)  # grading ran; the verdicts are in the reports
    results = {row["id"]: row for row in json.loads((out / "results.json").read_text())["submissions"]}
    expected = _grading_test_names()
    assert len(expected) >= 2 * len(LESSON_LIST)
    complete, blank = results["complete"], results["blank"]
    assert complete["verdict"] == "verified"
    assert {test["nodeid"] for test in complete["tests"]} == expected
    assert {test["outcome"] for test in complete["tests"]} == {"passed"}
    assert blank["verdict"] in ("failed", "unverified")
    assert {test["nodeid"] for test in blank["tests"]} == expected
    assert all(test["outcome"] == "failed" and "NotImplementedError" in test["message"] for test in blank["tests"])


@pytest.mark.slow
def test_grading_single_lesson_notebooks_gives_verified_and_failed(tmp_path: Path) -> None:
    from cellbox.cli import main

    submissions = tmp_path / "submissions"
    submissions.mkdir()
    name = "07-kill-the-whole-group.ipynb"
    (submissions / "alice.ipynb").write_bytes((LESSONS / "solutions" / name).read_bytes())
    (submissions / "bob.ipynb").write_bytes((LESSONS / name).read_bytes())
    out = tmp_path / "out"
    main(["grade", str(submissions), "--tests", str(LESSONS / "grading" / "test_lesson07.py"), "--out", str(out)])
    rows = (out / "grades.csv").read_text().splitlines()
    assert rows[0].startswith("id,verdict,passed,failed")
    verdicts = {row.split(",")[0]: row.split(",")[1] for row in rows[1:]}
    assert verdicts == {"alice": "verified", "bob": "failed"}
