"""The lesson notebooks: built from their sources, well-formed, free of solutions, and runnable.

The fast tests read the committed notebooks; the slow ones run every lesson under the ``cellbox`` kernel with
nbclient (solutions: every check passes; student copies: every check prints its "not done yet" feedback).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import nbformat
import pytest

import forkruns
from conftest import require_all
from sandboxkit import alive

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
    for part in (
        "**Goal:**",
        "**The plan.**",
        "## Common mistakes",
        "## Try this next",
        "## Key points",
        "## The real thing",
    ):
        assert part in markdown, f"{lesson.filename} has no {part!r}"
    assert "cellbox." in markdown.split("## The real thing", 1)[1]
    assert lesson.exercises, f"{lesson.filename} has no exercise"
    checks = [cell.id for cell in lesson.cells if cell.id.startswith("check-")]
    assert sorted(checks) == sorted(f"check-{name}" for name in lesson.exercises)
    answers = [cell for cell in lesson.cells if cell.solutions_only]
    assert len(answers) == 1 and '## Answers to "Try this next"' in answers[0].solution
    if lesson.number <= 10:
        assert len(lesson.exercises) >= 2, f"{lesson.filename} needs a second exercise of another kind"


def test_answers_are_in_the_solutions_only() -> None:
    for lesson in LESSON_LIST:
        assert '## Answers to "Try this next"' not in STUDENT[lesson.filename].read_text()
        assert '## Answers to \\"Try this next\\"' in SOLUTION[lesson.filename].read_text()


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
        module = lesson.filename[: -len(".ipynb")].replace("-", "_")
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


def test_a_check_ends_on_its_own_deadline_with_its_own_words(capsys: pytest.CaptureFixture[str]) -> None:
    kit = _load_lessonkit()

    def forgets_the_timeout() -> None:
        with kit.deadline(0.5, "pass timeout=seconds to subprocess.run"):
            try:  # code under test that swallows every Exception still ends: the deadline is no Exception
                subprocess.run([sys.executable, "-c", "import time; time.sleep(60)"])
            except Exception:
                pass

    handler, (outer, every) = signal.getsignal(signal.SIGALRM), signal.getitimer(signal.ITIMER_REAL)
    kit.check("run_with_timeout", forgets_the_timeout)
    assert capsys.readouterr().out == f"{FAIL} run_with_timeout: pass timeout=seconds to subprocess.run\n"
    # Whatever timer ran before (pytest-timeout's, say) is back, with its handler and its interval.
    assert signal.getsignal(signal.SIGALRM) is handler
    left, interval = signal.getitimer(signal.ITIMER_REAL)
    assert (left > 0) == (outer > 0) and interval == every


def test_digests_name_the_answer_without_showing_it() -> None:
    kit = _load_lessonkit()
    digests = {"a": kit.digest("predict", "a", "ok"), "b": kit.digest("predict", "b", True)}
    assert kit.wrong_keys("predict", {"a": "ok", "b": True}, digests) == []
    assert kit.wrong_keys("predict", {"a": "error", "b": 1}, digests) == ["a", "b"]
    assert "ok" not in repr(digests) and "True" not in repr(digests)


def test_sealed_hints_open_only_with_the_answer_they_explain() -> None:
    kit = _load_lessonkit()
    index, box = kit.seal("what_works", "plots", "a", "leaving matplotlib to pick a backend")
    boxes = {index: box}
    assert kit.unseal("what_works", "plots", "a", boxes, "no hint") == "leaving matplotlib to pick a backend"
    assert kit.unseal("what_works", "plots", "b", boxes, "no hint") == "no hint"
    assert kit.unseal("what_works", "secrets", "a", boxes, "no hint") == "no hint"
    assert "matplotlib" not in repr(boxes) and "'a'" not in repr(boxes)
    source = build.load(LESSONS / "src" / "lesson12.py")
    check = _cell(source, "check-what_works").student
    assert "matplotlib to pick" not in check and '("plots", "a")' not in check


@pytest.mark.parametrize("lesson", LESSON_LIST, ids=lambda lesson: lesson.filename)
def test_no_check_cell_shows_a_set_answer_or_hints_by_answer(lesson) -> None:  # type: ignore[no-untyped-def]
    """A set answer is digests in its check cell, and hints keyed by (question, answer) are sealed: none of them,
    read in passing, gives an answer away (by elimination either)."""
    import itertools

    for name in lesson.exercises:
        source = _cell(lesson, f"check-{name}").student
        # A dict's key (question, answer) with a hint; not a loop over two names (`for x in ("a", "b"):`).
        plain_hint = re.search(r"(?<!\bin )\(\s*['\"]\w+['\"]\s*,\s*['\"]\w+['\"]\s*\)\s*:", source)
        assert not plain_hint, f"{lesson.filename} check-{name} holds plain hints by answer: {plain_hint}"
        solved: dict[str, Any] = {}
        exec(_cell(lesson, f"exercise-{name}").solution, solved)
        answer = solved[name]() if name in solved and not solved[name].__code__.co_argcount else None
        if not isinstance(answer, set) or len(answer) > 4:
            continue
        for order in itertools.permutations(sorted(answer)):
            for quote in ("'", '"'):
                shown = "{" + ", ".join(f"{quote}{key}{quote}" for key in order) + "}"
                assert shown not in source, f"{lesson.filename} check-{name} shows {shown}"


@pytest.mark.parametrize("lesson", LESSON_LIST, ids=lambda lesson: lesson.filename)
def test_no_check_cell_shows_the_answers_of_its_exercise(lesson) -> None:  # type: ignore[no-untyped-def]
    """A "predict" exercise's answers are digests in its check cell; no check prints what the student should say."""
    for name in lesson.exercises:
        solved: dict[str, Any] = {}
        exec(_cell(lesson, f"exercise-{name}").solution, solved)
        answers = solved[name]() if name in solved and not solved[name].__code__.co_argcount else None
        if not isinstance(answers, dict):
            continue
        source = _cell(lesson, f"check-{name}").student
        for line in source.splitlines():
            if line.startswith("ANSWERS = "):
                assert re.fullmatch(r"ANSWERS = \{('\w+': '[0-9a-f]{16}'(, )?)+\}", line), line
        for key, value in answers.items():
            for quote in ("'", '"'):
                shown = f"{quote}{key}{quote}: {value!r}".replace("'", quote) if isinstance(value, str) else None
                assert shown is None or shown not in source, f"{lesson.filename} check-{name} shows {shown}"
            if isinstance(value, bool):
                assert f'"{key}": {value}' not in source and f"'{key}': {value}" not in source
        assert "truth" not in source or "{truth" not in source, f"{lesson.filename} check-{name} prints the answer"


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


# One notebook's run, as ``python -c`` runs it: nbclient executes NOTEBOOK under KERNEL and writes it to OUT; a
# CellExecutionError (an error in a cell not tagged raises-exception) ends it with status 1 and the error on stderr.
_EXECUTE = """
import sys
import nbformat
from nbclient import NotebookClient
notebook, kernel, out, folder = sys.argv[1:]
nb = nbformat.read(notebook, as_version=4)
NotebookClient(nb, kernel_name=kernel, timeout=120, resources={"metadata": {"path": folder}}).execute()
nbformat.write(nb, out)
"""
NOTEBOOKS_AT_ONCE = 3  # most of a lesson's time is its cells waiting on children and clocks, not the CPU
NOTEBOOK_DEADLINE = 600  # seconds one notebook's run may take in all


class NotebookRuns:
    """Runs of lesson notebooks under the cellbox kernel, a few at once, each in a process of its own.

    Every notebook a session's tests ask for is started when the first of them asks, in the order of the tests,
    ``NOTEBOOKS_AT_ONCE`` at a time; each test then waits for its own.  Each run has a kernel of its own, as a
    student's notebook has.

    Args:
        paths: the notebooks, in the order they are wanted.
        folder: where the executed notebooks go.
    """

    def __init__(self, paths: list[Path], folder: Path) -> None:
        from concurrent.futures import ThreadPoolExecutor

        self.folder, self.kernel = folder, _kernel_name()
        self.pool = ThreadPoolExecutor(NOTEBOOKS_AT_ONCE)
        self.runs: dict[Path, Any] = {}
        for path in paths:
            self._start(path)

    def _start(self, path: Path) -> None:
        if path not in self.runs:
            self.runs[path] = self.pool.submit(self._run, path, self._out(path))

    def _out(self, path: Path) -> Path:
        return self.folder / f"{path.parent.name}-{path.name}"

    def _run(self, path: Path, out: Path) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-c", _EXECUTE, str(path), self.kernel, str(out), str(LESSONS)]
        return _run_and_reap(argv, cwd=LESSONS, timeout=NOTEBOOK_DEADLINE)

    def executed(self, path: Path) -> nbformat.NotebookNode:
        """The notebook at ``path`` as its run left it; the test fails on an error in a cell, with that error."""
        self._start(path)
        done = self.runs[path].result()
        assert done.returncode == 0, f"{path.name}: {done.stderr[-3000:]}"
        return _read(self._out(path))

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)


NOTEBOOK_TESTS = (
    "test_solution_notebook_runs_and_every_check_passes",
    "test_student_notebook_runs_and_checks_say_not_done",
)


@pytest.fixture(scope="session")
def notebook_runs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[NotebookRuns]:
    """The runs of every notebook this session's tests selected, started at once in the order of their tests."""
    wanted = []
    for item in request.session.items:
        if isinstance(item, pytest.Function) and item.originalname in NOTEBOOK_TESTS and hasattr(item, "callspec"):
            name = item.callspec.params["name"]
            wanted.append((SOLUTION if item.originalname == NOTEBOOK_TESTS[0] else STUDENT)[name])
    runs = NotebookRuns(wanted, tmp_path_factory.mktemp("notebooks"))
    try:
        yield runs
    finally:
        runs.close()


def _stdout(cell: nbformat.NotebookNode) -> str:
    return "".join(out.get("text", "") for out in cell.outputs if out.output_type == "stream")


def _check_cells(nb: nbformat.NotebookNode) -> list[nbformat.NotebookNode]:
    return [cell for cell in nb.cells if "check" in cell.metadata.get("tags", [])]


@pytest.mark.slow
@pytest.mark.parametrize("name", list(SOLUTION), ids=str)
def test_solution_notebook_runs_and_every_check_passes(name: str, notebook_runs: NotebookRuns) -> None:
    nb = notebook_runs.executed(SOLUTION[name])
    checks = _check_cells(nb)
    assert checks
    for cell in checks:
        line = _stdout(cell).strip()
        assert line.startswith(PASS), f"{name} {cell.id}: {line}"


@pytest.mark.slow
@pytest.mark.parametrize("name", list(STUDENT), ids=str)
def test_student_notebook_runs_and_checks_say_not_done(name: str, notebook_runs: NotebookRuns) -> None:
    nb = notebook_runs.executed(STUDENT[name])
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
    """The hidden tests' node ids as pytest collects them (a parametrized test is one id per case)."""
    collected = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "-m", "", "."],
        cwd=LESSONS / "grading", capture_output=True, text=True, timeout=120,
    )
    prefix = "lessons/grading/"  # node ids are relative to the project's root (its pyproject.toml)
    names = {line.removeprefix(prefix) for line in collected.stdout.splitlines() if line.startswith(prefix)}
    assert names, collected.stdout + collected.stderr
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


# ------------------------------------------------------------------ checks as strict as the instructor tests
#
# Each lesson's listed mistakes and typical wrong attempts go through its check cell (run as plain Python, with
# the lessonkit setup cell and the few names of worked cells the check uses) and through its hidden tests (pytest
# on a module made of the setup cell and the exercise cells, as ``cellbox grade`` makes it).  Both must say no: a
# ✘ line naming the mistake, and a pytest run that fails (the grader's ``failed``).  The solutions pass both.

LESSON = {lesson.number: lesson for lesson in LESSON_LIST}

# Names that check cells take from the lesson's worked cells.
CONTEXT = {
    2: "escape = \"[c for c in ().__class__.__base__.__subclasses__() if c.__name__ == '_wrap_close'][0]"
    ".__init__.__globals__['getpid']()\"\n",
    3: "import subprocess, sys\n",
    7: "import os, signal, subprocess, sys, time\n",
    8: "import subprocess, sys\nMB = 1024 * 1024\n",
    9: "import subprocess, sys, shutil\n",
    10: "import os, shutil, subprocess, sys, tempfile\n"
    'ask = "import sys, importlib.util; print(sys.prefix); '
    "print('nbformat importable:', importlib.util.find_spec('nbformat') is not None)\"\n",
    12: "import os\n",
}
WORKED = {7: ("alive",)}  # worked cells (found by the names they define) that check cells use


def _cell(lesson, cell_id: str):  # type: ignore[no-untyped-def]
    return next(cell for cell in lesson.cells if cell.id == cell_id)


def _worked_defs(lesson, *names: str) -> str:  # type: ignore[no-untyped-def]
    """The source of the worked cells that define any of ``names`` (def NAME or NAME =)."""
    wanted = []
    for cell in lesson.cells:
        if cell.kind == "code" and cell.id.startswith("code-"):
            if any(f"def {name}(" in cell.solution or f"\n{name} = " in "\n" + cell.solution for name in names):
                wanted.append(cell.solution)
    return "\n".join(wanted)


def _run_and_reap(argv: list[str], **options: Any) -> subprocess.CompletedProcess[str]:
    """``subprocess.run`` in a process group of its own, killed afterwards.

    A wrong attempt may leave a child running (a timeout without a kill is one
    of the lessons' own mistakes): it must not outlive the test.
    """
    timeout = options.pop("timeout")
    with subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True, **options
    ) as proc:
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    return subprocess.CompletedProcess(argv, proc.returncode, stdout, stderr)


def check_script(number: int, name: str, exercise: str | None = None, context: str = "") -> str:
    """The script ``python -c`` runs for the check cell of ``name``, with ``exercise`` as the student's cell."""
    lesson = LESSON[number]
    exercises = [_cell(lesson, f"exercise-{other}").solution for other in lesson.exercises]
    if exercise is not None:
        exercises[lesson.exercises.index(name)] = textwrap.dedent(exercise)
    return "\n\n".join(
        [
            (LESSONS / "lessonkit.py").read_text(),
            CONTEXT.get(number, ""),
            _worked_defs(lesson, *WORKED.get(number, ())),
            context,
            *exercises,
            _cell(lesson, f"check-{name}").solution,
        ]
    )


def check_line(done: subprocess.CompletedProcess[str]) -> str:
    """The one ✔/✘/… line a finished check cell printed (it must print exactly one, and end with status 0)."""
    lines = [line for line in done.stdout.splitlines() if line[:1] in (PASS, FAIL, TODO)]
    assert len(lines) == 1 and done.returncode == 0, (done.stdout, done.stderr)
    return lines[0]


def run_check(number: int, name: str, exercise: str | None = None, context: str = "") -> str:
    """The line the check cell of exercise ``name`` prints, with ``exercise`` as the student's cell.

    The tests run checks in the fork runner (:class:`MistakeRuns`); this runs one alone, to try an answer by hand:
    ``python -c "import sys; sys.path[:0] = ['tests']; import test_lessons as t; print(t.run_check(6, 'how_long'))"``.
    """
    script = check_script(number, name, exercise, context)
    return check_line(_run_and_reap([sys.executable, "-c", script], cwd=LESSONS, timeout=CHECK_DEADLINE))


CHECK_DEADLINE, HIDDEN_DEADLINE = 180, 300  # seconds a check cell, a run of the hidden tests, may take in all
# Seconds one hidden test may take on a wrong answer: the grader's default wall limit (30 s) for all of a
# submission's tests, so a hidden test that slow would fail under `cellbox grade` too; an answer that hangs
# (no timeout at all) costs that, not a minute per test.
MISTAKE_PER_TEST = 30


def hidden_tests(
    number: int, tmp: Path, name: str | None = None, exercise: str | None = None, per_test: float = 60
) -> list[str]:
    """pytest's arguments for the lesson's hidden tests on the module ``cellbox grade`` makes of its notebook.

    Writes that module (``exercise`` in place of the solution of ``name``) and an empty pytest.ini into ``tmp``;
    the run goes in ``tmp``, with ``tmp`` on the path, and leaves its JUnit XML report in ``tmp/report.xml``.
    A test still running after ``per_test`` seconds fails (pytest-timeout), unless it has a timeout mark of its own.
    """
    lesson = LESSON[number]
    cells = [_cell(lesson, "setup").solution]
    for other in lesson.exercises:
        src = _cell(lesson, f"exercise-{other}").solution
        cells.append(textwrap.dedent(exercise) if other == name and exercise is not None else src)
    module = "nb_" + lesson.filename[: -len(".ipynb")].replace("-", "_")
    (tmp / f"{module}.py").write_text("\n\n".join(cells) + "\n")
    (tmp / "pytest.ini").write_text("[pytest]\n")
    return [
        "-q",
        "-p",
        "no:cacheprovider",
        "-c",
        str(tmp / "pytest.ini"),
        "--rootdir",
        str(tmp),
        f"--junitxml={tmp / 'report.xml'}",
        # A hung test fails, as the grader's per-test deadline makes it fail.
        *([f"--timeout={per_test:g}"] if importlib.util.find_spec("pytest_timeout") else []),
        str(LESSONS / "grading" / f"test_lesson{number:02d}.py"),
    ]


def hidden_env(tmp: Path) -> dict[str, str]:
    """What the hidden tests' run adds to the environment: ``tmp`` importable, no bytecode written."""
    return {"PYTHONPATH": str(tmp), "PYTHONDONTWRITEBYTECODE": "1"}


def hidden_outcomes(done: subprocess.CompletedProcess[str], tmp: Path) -> dict[str, str]:
    """{test name: outcome} from the JUnit XML report of a finished run of the hidden tests in ``tmp``."""
    report = tmp / "report.xml"
    said = f"pytest exit {done.returncode}: {done.stdout[-2000:]} {done.stderr[-2000:]}"
    assert report.exists(), f"no report: {said}"
    assert done.returncode in (0, 1), said
    outcomes = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        tags = {child.tag for child in case}
        outcomes[case.get("name", "")] = (
            "failed" if tags & {"failure", "error"} else "skipped" if "skipped" in tags else "passed"
        )
    return outcomes


def run_hidden_tests(number: int, tmp: Path, name: str | None = None, exercise: str | None = None) -> dict[str, str]:
    """{test name: outcome} of the lesson's hidden tests on the module ``cellbox grade`` makes of its notebook.

    Like :func:`run_check`, one run alone, to try an answer by hand.
    """
    args = hidden_tests(number, tmp, name, exercise)
    env = {**os.environ, **hidden_env(tmp)}
    done = _run_and_reap([sys.executable, "-m", "pytest", *args], cwd=tmp, env=env, timeout=HIDDEN_DEADLINE)
    return hidden_outcomes(done, tmp)


@dataclass
class Mistake:
    """A wrong attempt at one exercise: the check must print ✘ with ``hint``; a hidden test must fail."""

    lesson: int
    exercise: str
    label: str
    source: str
    hint: str
    context: str = ""
    check_only: bool = False  # the hidden tests cannot see it (they cannot set the notebook's clock)

    def __str__(self) -> str:
        return f"lesson{self.lesson:02d}-{self.exercise}-{self.label}"


# The question cell of lesson 12's what_works, for wrong attempts that replace only the function.
QUESTIONS_12 = (
    'QUESTIONS = {"secrets": ("", dict.fromkeys("abcd", "")), "results": ("", dict.fromkeys("abc", "")), '
    '"plots": ("", dict.fromkeys("abc", ""))}\n'
)
# ... and lesson 13's what_next.
QUESTIONS_13 = 'QUESTIONS = dict.fromkeys(["second_line", "thread", "stopped"], ("", dict.fromkeys("abc", "")))\n'

MISTAKES = [
    Mistake(
        1,
        "run_isolated",
        "returncode-the-wrong-way-round",
        """
        import subprocess, sys
        def run_isolated(code):
            result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
            return bool(result.returncode), result.stdout, result.stderr
        """,
        "compare returncode with 0",
    ),
    Mistake(
        1,
        "run_isolated",
        "no-capture-output",
        """
        import subprocess, sys
        def run_isolated(code):
            result = subprocess.run([sys.executable, "-c", code], text=True)
            return result.returncode == 0, result.stdout, result.stderr
        """,
        "capture_output=True",
    ),
    Mistake(
        1,
        "run_isolated",
        "no-text",
        """
        import subprocess, sys
        def run_isolated(code):
            result = subprocess.run([sys.executable, "-c", code], capture_output=True)
            return result.returncode == 0, result.stdout, result.stderr
        """,
        "text=True",
    ),
    Mistake(
        1,
        "run_isolated",
        "shell-string",
        """
        import subprocess, sys
        def run_isolated(code):
            result = subprocess.run(f"{sys.executable} -c '{code}'", shell=True, capture_output=True, text=True)
            return result.returncode == 0, result.stdout, result.stderr
        """,
        "shell=True",
    ),
    Mistake(
        1,
        "run_isolated",
        "exec-in-this-process",
        """
        import contextlib, io, traceback
        def run_isolated(code):
            out, err = io.StringIO(), io.StringIO()
            try:
                with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                    exec(code, {})
            except Exception:
                return False, out.getvalue(), traceback.format_exc()
            return True, out.getvalue(), err.getvalue()
        """,
        "run it in a child process",
    ),
    Mistake(
        1,
        "predict",
        "output-lost-on-failure",
        """
        SNIPPETS = {"a": "print('one'); print('two')", "b": "print('start'); 1 / 0",
                    "c": "import sys; sys.stderr.write('careful\\\\n')", "d": "import sys; print('bye'); sys.exit(0)",
                    "e": "import sys; sys.exit('stopped')"}
        def predict():
            return {"a": (True, "one\\ntwo\\n"), "b": (False, ""), "c": (True, ""), "d": (True, "bye\\n"),
                    "e": (False, "")}
        """,
        "output printed before a failure stays in stdout",
    ),
]


MISTAKES += [
    Mistake(
        2,
        "reach_os",
        "copied-the-lesson",
        """
        def reach_os():
            return ("[c for c in ().__class__.__base__.__subclasses__() if c.__name__ == '_wrap_close'][0]"
                    ".__init__.__globals__['getpid']()")
        """,
        "that is the escape from above",
    ),
    Mistake(
        2,
        "reach_os",
        "uses-a-builtin",
        """
        def reach_os():
            return "__import__('os').getpid()"
        """,
        "start from ()",
    ),
    Mistake(
        2,
        "reach_os",
        "builtins-as-a-module",
        """
        def reach_os():
            return ("[c for c in ().__class__.__base__.__subclasses__() if c.__name__ == 'catch_warnings'][0]()"
                    "._module.__builtins__.__import__('os').getpid()")
        """,
        "used __builtins__ as if it were always a module",
    ),
    Mistake(
        2,
        "load_scores",
        "eval-without-builtins",
        """
        def load_scores(text):
            return eval(text, {"__builtins__": {}})
        """,
        "use ast.literal_eval",
    ),
    Mistake(
        2,
        "load_scores",
        "denylist-then-eval",
        """
        def load_scores(text):
            if "__" in text or "import" in text:
                raise ValueError("refused")
            return eval(text, {"__builtins__": {}})
        """,
        "believing a denylist is finished",
    ),
]

# Lesson 2, a student alone: a pid written out, the lesson's route in other quotes, a statement, a function not
# called; json.loads for a Python literal, SyntaxError escaping, no dict test, dict() of anything, a longer denylist.
_ROUTE = ("[c for c in ().__class__.__base__.__subclasses__() if c.__name__ == 'catch_warnings'][0]()"
          "._module.__builtins__['__import__']('os').getpid")
_SCORES = """
    import ast, json
    def load_scores(text):
        {body}
    """
MISTAKES += [
    Mistake(2, "reach_os", "pid-written-out", """
            import os
            def reach_os():
                return str(os.getpid())
            """, "written out, not computed"),
    Mistake(2, "reach_os", "the-lesson-in-double-quotes", """
            def reach_os():
                return ('[c for c in ().__class__.__base__.__subclasses__() if c.__name__ == "_wrap_close"][0]'
                        '.__init__.__globals__["getpid"]()')
            """, "that is the escape from above"),
    Mistake(2, "reach_os", "a-statement", """
            def reach_os():
                return "import os; os.getpid()"
            """, "not a statement"),
    Mistake(2, "reach_os", "getpid-not-called", f"""
            def reach_os():
                return {_ROUTE!r}
            """, "call it"),
    Mistake(2, "load_scores", "json-loads", _SCORES.format(body="""value = json.loads(text)
        if not isinstance(value, dict):
            raise ValueError("not a dict")
        return value"""), "json.loads, say, reads JSON only"),
    Mistake(2, "load_scores", "syntax-error-escapes", _SCORES.format(body="""value = ast.literal_eval(text)
        if not isinstance(value, dict):
            raise ValueError("not a dict")
        return value"""), "catch SyntaxError too"),
    Mistake(2, "load_scores", "no-dict-test", _SCORES.format(body="""try:
            return ast.literal_eval(text)
        except (ValueError, SyntaxError) as error:
            raise ValueError(str(error)) from None"""), "is not a dict literal"),
    Mistake(2, "load_scores", "dict-of-anything", _SCORES.format(body="""try:
            return dict(ast.literal_eval(text))
        except (ValueError, SyntaxError) as error:
            raise ValueError(str(error)) from None"""), "rather than converting with dict()"),
    Mistake(2, "load_scores", "a-longer-denylist", _SCORES.format(body="""for word in ("__", "(", "import", "lambda"):
            if word in text:
                raise ValueError("refused: " + word)
        value = eval(text, {"__builtins__": {}})
        if not isinstance(value, dict):
            raise ValueError("not a dict")
        return value"""), "believing a denylist is finished"),
]

MISTAKES += [
    Mistake(
        3,
        "run_with_timeout",
        "wait-without-kill",
        """
        import subprocess, sys
        def run_with_timeout(code, seconds):
            proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            try:
                return "ok" if proc.wait(timeout=seconds) == 0 else "error"
            except subprocess.TimeoutExpired:
                return "timed_out"
        """,
        "still running after run_with_timeout returned",
    ),
    Mistake(
        3,
        "run_with_timeout",
        "catch-exception",
        """
        import subprocess, sys
        def run_with_timeout(code, seconds):
            try:
                result = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=seconds)
            except Exception:
                return "timed_out"
            return "ok" if result.returncode == 0 else "error"
        """,
        "not Exception",
    ),
    Mistake(
        3,
        "run_with_timeout",
        "timeout-as-error",
        """
        import subprocess, sys
        def run_with_timeout(code, seconds):
            try:
                result = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=seconds)
            except subprocess.TimeoutExpired:
                return "error"
            return "ok" if result.returncode == 0 else "error"
        """,
        "not 'timed_out'",
    ),
    Mistake(
        3,
        "run_with_timeout",
        "no-catch",
        """
        import subprocess, sys
        def run_with_timeout(code, seconds):
            result = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=seconds)
            return "ok" if result.returncode == 0 else "error"
        """,
        "TimeoutExpired escape",
    ),
    Mistake(
        3,
        "wait_or_kill",
        "the-broken-version",
        """
        import subprocess
        def wait_or_kill(proc, seconds):
            try:
                return proc.wait(timeout=seconds)
            except subprocess.TimeoutExpired:
                return None
        """,
        "still running after wait_or_kill returned",
    ),
    Mistake(
        3,
        "wait_or_kill",
        "kill-without-collecting",
        """
        import subprocess
        def wait_or_kill(proc, seconds):
            try:
                return proc.wait(timeout=seconds)
            except subprocess.TimeoutExpired:
                proc.kill()
                return None
        """,
        "zombie (state Z",
    ),
]

MISTAKES += [
    Mistake(
        4,
        "allowlist_env",
        "copy-then-delete",
        """
        import os
        def allowlist_env(home, extra=None):
            env = os.environ.copy()
            for name in list(env):
                if "TOKEN" in name or "SECRET" in name:
                    del env[name]
            env.update(HOME=str(home), TMPDIR=str(home), **(extra or {}))
            return env
        """,
        "start from an empty dict",
    ),
    Mistake(
        4,
        "allowlist_env",
        "no-path",
        """
        import os
        def allowlist_env(home, extra=None):
            return {"HOME": str(home), "TMPDIR": str(home), **(extra or {})}
        """,
        "there is no PATH",
    ),
    Mistake(
        4,
        "allowlist_env",
        "real-home",
        """
        import os, sys
        def allowlist_env(home, extra=None):
            return {"PATH": os.pathsep.join([os.path.dirname(sys.executable), "/usr/bin", "/bin"]),
                    "HOME": os.path.expanduser("~"), "TMPDIR": str(home), **(extra or {})}
        """,
        "real home",
    ),
    Mistake(
        4,
        "allowlist_env",
        "non-strings",
        """
        import os, sys
        def allowlist_env(home, extra=None):
            return {"PATH": os.pathsep.join([os.path.dirname(sys.executable), "/usr/bin", "/bin"]),
                    "HOME": home, "TMPDIR": home, **(extra or {})}
        """,
        "must be str",
    ),
    Mistake(
        4,
        "denylist_passes",
        "thinks-the-url-is-caught",
        """
        SAMPLE = {"PATH": "", "HOME": "", "GITHUB_TOKEN": "", "DB_PASSWORD": "", "AWS_SECRET_ACCESS_KEY": "",
                  "DATABASE_URL": "", "NPM_AUTH": "", "KEYBOARD_LAYOUT": ""}
        def denylist_passes():
            return {"PATH", "HOME", "KEYBOARD_LAYOUT"}
        """,
        "a secret can hide under any other name",
    ),
]

# Lesson 4, a student alone: LANG always or never, PATH copied or found, extra first or changed or never None,
# the notebook's own environment scrubbed; denylist answers the wrong way round or not as written.
_ALLOW = """
    import os, shutil, sys
    def allowlist_env(home, extra=None):
        {body}
    """
_PATH = 'os.pathsep.join([os.path.dirname(sys.executable), "/usr/bin", "/bin"])'
_LANG = '''if "LANG" in os.environ:
            env["LANG"] = os.environ["LANG"]'''
MISTAKES += [
    Mistake(4, "allowlist_env", "lang-always", _ALLOW.format(body=f"""env = {{"PATH": {_PATH}, "HOME": str(home),
               "TMPDIR": str(home), "LANG": os.environ.get("LANG", "C.UTF-8")}}
        env.update(extra or {{}})
        return env"""), "copy LANG only when it is set"),
    Mistake(4, "allowlist_env", "lang-never", _ALLOW.format(body=f"""env = {{"PATH": {_PATH}, "HOME": str(home),
               "TMPDIR": str(home)}}
        env.update(extra or {{}})
        return env"""), "should get the same LANG"),
    Mistake(4, "allowlist_env", "path-copied", _ALLOW.format(body=f"""env = {{"PATH": os.environ["PATH"],
               "HOME": str(home), "TMPDIR": str(home)}}
        {_LANG}
        env.update(extra or {{}})
        return env"""), "PATH was copied from this notebook's environment"),
    Mistake(4, "allowlist_env", "path-found-with-which", _ALLOW.format(body=f"""env = {{"PATH": os.pathsep.join(
            [os.path.dirname(shutil.which("python3") or sys.executable), "/usr/bin", "/bin"]),
            "HOME": str(home), "TMPDIR": str(home)}}
        {_LANG}
        env.update(extra or {{}})
        return env"""), "PATH should start with the directory of sys.executable"),
    Mistake(4, "allowlist_env", "path-without-bin", _ALLOW.format(body=f"""env = {{
            "PATH": os.path.dirname(sys.executable), "HOME": str(home), "TMPDIR": str(home)}}
        {_LANG}
        env.update(extra or {{}})
        return env"""), "expected the directory of sys.executable, /usr/bin and /bin"),
    Mistake(4, "allowlist_env", "extra-first", _ALLOW.format(body=f"""env = dict(extra or {{}})
        env.update(PATH={_PATH}, HOME=str(home), TMPDIR=str(home))
        {_LANG}
        return env"""), "add the names of extra last"),
    Mistake(4, "allowlist_env", "changes-extra", _ALLOW.format(body=f"""env = extra if extra is not None else {{}}
        env.update(PATH={_PATH}, HOME=str(home), TMPDIR=str(home))
        {_LANG}
        return env"""), "changed the caller's extra dict"),
    Mistake(4, "allowlist_env", "extra-never-none", _ALLOW.format(body=f"""env = {{"PATH": {_PATH}, "HOME": str(home),
               "TMPDIR": str(home)}}
        {_LANG}
        env.update(extra)
        return env"""), "extra may be None"),
    Mistake(4, "allowlist_env", "scrubs-the-notebook", _ALLOW.format(body=f"""lang = os.environ.get("LANG")
        os.environ.clear()
        os.environ.update(PATH={_PATH}, HOME=str(home), TMPDIR=str(home))
        if lang is not None:
            os.environ["LANG"] = lang
        os.environ.update(extra or {{}})
        return dict(os.environ)"""), "changed this notebook's own environment"),
    Mistake(4, "allowlist_env", "tmpdir-is-the-system-one", _ALLOW.format(body=f"""import tempfile
        env = {{"PATH": {_PATH}, "HOME": str(home), "TMPDIR": tempfile.gettempdir()}}
        {_LANG}
        env.update(extra or {{}})
        return env"""), "HOME and TMPDIR should both be the home you were given"),
    Mistake(4, "denylist_passes", "the-names-it-drops", """
            SAMPLE = {"PATH": "", "HOME": "", "GITHUB_TOKEN": "", "DB_PASSWORD": "", "AWS_SECRET_ACCESS_KEY": "",
                      "DATABASE_URL": "", "NPM_AUTH": "", "KEYBOARD_LAYOUT": ""}
            def denylist_passes():
                return {"GITHUB_TOKEN", "DB_PASSWORD", "AWS_SECRET_ACCESS_KEY", "KEYBOARD_LAYOUT"}
            """, "the names the denylist drops"),
    Mistake(4, "denylist_passes", "keyboard-layout-passes", """
            SAMPLE = {"PATH": "", "HOME": "", "GITHUB_TOKEN": "", "DB_PASSWORD": "", "AWS_SECRET_ACCESS_KEY": "",
                      "DATABASE_URL": "", "NPM_AUTH": "", "KEYBOARD_LAYOUT": ""}
            def denylist_passes():
                return {"PATH", "HOME", "DATABASE_URL", "NPM_AUTH", "KEYBOARD_LAYOUT"}
            """, "matches anywhere in the name"),
    Mistake(4, "denylist_passes", "lower-case-names", """
            SAMPLE = {"PATH": "", "HOME": "", "GITHUB_TOKEN": "", "DB_PASSWORD": "", "AWS_SECRET_ACCESS_KEY": "",
                      "DATABASE_URL": "", "NPM_AUTH": "", "KEYBOARD_LAYOUT": ""}
            def denylist_passes():
                return {"path", "home", "database_url", "npm_auth"}
            """, "exactly as they are written there"),
    Mistake(4, "denylist_passes", "a-list", """
            SAMPLE = {"PATH": "", "HOME": "", "GITHUB_TOKEN": "", "DB_PASSWORD": "", "AWS_SECRET_ACCESS_KEY": "",
                      "DATABASE_URL": "", "NPM_AUTH": "", "KEYBOARD_LAYOUT": ""}
            def denylist_passes():
                return ["PATH", "HOME", "DATABASE_URL", "NPM_AUTH"]
            """, "should return a set of names"),
]

_RUN_LIMITED = """
    import resource, signal, subprocess, sys
    def run_limited(code, memory, cpu):
        {setup}
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, {launch})
        lines = result.stderr.strip().splitlines()
        if lines and lines[-1].startswith("MemoryError"):
            return "memory_limit"
        if result.returncode in {killed}:
            return "cpu_limit"
        return "ok" if result.returncode == 0 else "error"
    """
_IN_CHILD = (
    "def limit():\n            resource.setrlimit(resource.RLIMIT_AS, (memory, memory))\n"
    "            resource.setrlimit(resource.RLIMIT_CPU, ({soft}, {hard}))"
)
MISTAKES += [
    Mistake(
        5,
        "run_limited",
        "setrlimit-in-the-notebook",
        _RUN_LIMITED.format(
            setup="resource.setrlimit(resource.RLIMIT_AS, (memory, memory)); "
            "resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))",
            launch="timeout=60",
            killed="(-signal.SIGXCPU, -signal.SIGKILL)",
        ),
        "changed this notebook's own limits",
    ),
    Mistake(
        5,
        "run_limited",
        "soft-equals-hard",
        _RUN_LIMITED.format(
            setup=_IN_CHILD.format(soft="cpu", hard="cpu"),
            launch="preexec_fn=limit",
            killed="(-signal.SIGXCPU, -signal.SIGKILL)",
        ),
        "one second above the soft one",
    ),
    Mistake(
        5,
        "run_limited",
        "sigkill-only",
        _RUN_LIMITED.format(
            setup=_IN_CHILD.format(soft="cpu", hard="cpu + 1"), launch="preexec_fn=limit", killed="(-signal.SIGKILL,)"
        ),
        "-signal.SIGXCPU",
    ),
    Mistake(
        5,
        "predict_limits",
        "as-is-memory-used-and-cpu-stops-sleep",
        """
        PROGRAMS = dict.fromkeys("abcdef", "pass")
        def predict_limits():
            return {"a": "ok", "b": "ok", "c": "cpu_limit", "d": "cpu_limit", "e": "memory_limit", "f": "ok"}
        """,
        "counts the interpreter's own address space",
    ),
    Mistake(
        5,
        "predict_limits",
        "cpu-stops-sleep",
        """
        PROGRAMS = dict.fromkeys("abcdef", "pass")
        def predict_limits():
            return {"a": "ok", "b": "memory_limit", "c": "cpu_limit", "d": "cpu_limit", "e": "memory_limit", "f": "ok"}
        """,
        "does sleeping use CPU time",
    ),
]

MISTAKES += [
    Mistake(
        6,
        "run_both_clocks",
        "wall-clock-only",
        """
        import signal, subprocess, sys
        def run_both_clocks(code, cpu, wall):
            try:
                result = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=wall)
            except subprocess.TimeoutExpired:
                return "timed_out"
            return "ok" if result.returncode == 0 else "error"
        """,
        "set RLIMIT_CPU in the child",
    ),
    Mistake(
        6,
        "which_clock",
        "wall-below-cpu-limit",
        """
        CASES = dict.fromkeys("abcd")
        def which_clock():
            return {"a": "cpu_limit", "b": "cpu_limit", "c": "timed_out", "d": "ok"}
        """,
        "wall deadline shorter than the CPU limit",
    ),
    Mistake(
        6,
        "which_clock",
        "cpu-limit-per-family",
        """
        CASES = dict.fromkeys("abcd")
        def which_clock():
            return {"a": "cpu_limit", "b": "timed_out", "c": "timed_out", "d": "cpu_limit"}
        """,
        "per process, not per family",
    ),
    Mistake(
        6,
        "how_long",
        "cpu-time",
        """
        import resource, subprocess, sys
        def how_long(code):
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            subprocess.run([sys.executable, "-c", code], capture_output=True)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            return (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
        """,
        "measuring how long it ran with CPU time",
    ),
    Mistake(
        6,
        "how_long",
        "time-time",
        """
        import subprocess, sys, time
        def how_long(code):
            started = time.time()
            subprocess.run([sys.executable, "-c", code], capture_output=True)
            return time.time() - started
        """,
        "time.time() jumps when the clock is set",
        check_only=True,
    ),
]
# Lesson 6, a student alone: no wall deadline, the deadline at `cpu`, soft = hard, SIGXCPU only, any signal as
# cpu_limit, setrlimit in the notebook; how_long with datetime.now, before the child exits, rounded to an int.
_CLOCKS = """
    import resource, signal, subprocess, sys
    def run_both_clocks(code, cpu, wall):
        def limit():
            resource.setrlimit(resource.RLIMIT_CPU, ({soft}, {hard}))
        try:
            result = subprocess.run([sys.executable, "-c", code], capture_output=True, preexec_fn=limit, {timeout})
        except subprocess.TimeoutExpired:
            return "timed_out"
        if {cpu_test}:
            return "cpu_limit"
        return "ok" if result.returncode == 0 else "error"
    """
_BOTH = {"soft": "cpu", "hard": "cpu + 1", "timeout": "timeout=wall",
         "cpu_test": "result.returncode in (-signal.SIGXCPU, -signal.SIGKILL)"}
MISTAKES += [
    Mistake(6, "run_both_clocks", "no-wall-deadline", _CLOCKS.format(**{**_BOTH, "timeout": "text=True"}),
            "pass timeout=wall"),
    Mistake(6, "run_both_clocks", "deadline-at-cpu", _CLOCKS.format(**{**_BOTH, "timeout": "timeout=cpu"}),
            "the wall deadline is `wall`, not `cpu`"),
    Mistake(6, "run_both_clocks", "soft-equals-hard", _CLOCKS.format(**{**_BOTH, "hard": "cpu"}),
            "was (1, 1) for cpu=1, expected (1, 2)"),
    Mistake(6, "run_both_clocks", "sigxcpu-only",
            _CLOCKS.format(**{**_BOTH, "cpu_test": "result.returncode == -signal.SIGXCPU"}),
            "a child killed by SIGKILL"),
    Mistake(6, "run_both_clocks", "any-signal-is-cpu", _CLOCKS.format(**{**_BOTH, "cpu_test": "result.returncode < 0"}),
            "died of SIGSEGV"),
    Mistake(6, "run_both_clocks", "only-status-1-is-error",
            _CLOCKS.format(**_BOTH).replace('result.returncode == 0 else "error"',
                                            'result.returncode != 1 else "error"'),
            "exits with 2"),
    Mistake(6, "run_both_clocks", "setrlimit-in-the-notebook", """
            import resource, signal, subprocess, sys
            def run_both_clocks(code, cpu, wall):
                resource.setrlimit(resource.RLIMIT_CPU, (cpu + 60, cpu + 61))
                try:
                    result = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=wall)
                except subprocess.TimeoutExpired:
                    return "timed_out"
                return "ok" if result.returncode == 0 else "error"
            """, "changed this notebook's own limits"),
    Mistake(6, "which_clock", "sleep-meets-the-cpu-limit", """
            CASES = dict.fromkeys("abcd")
            def which_clock():
                return {"a": "cpu_limit", "b": "timed_out", "c": "cpu_limit", "d": "ok"}
            """, "does sleeping use CPU"),
    Mistake(6, "how_long", "datetime-now", """
            import subprocess, sys
            from datetime import datetime
            def how_long(code):
                started = datetime.now()
                subprocess.run([sys.executable, "-c", code], capture_output=True)
                return (datetime.now() - started).total_seconds()
            """, "so does datetime.now()"),
    Mistake(6, "how_long", "does-not-wait", """
            import subprocess, sys, time
            def how_long(code):
                started = time.monotonic()
                subprocess.Popen([sys.executable, "-c", code])
                return time.monotonic() - started
            """, "returned before the child exited"),
    Mistake(6, "how_long", "whole-seconds", """
            import subprocess, sys, time
            def how_long(code):
                started = time.monotonic()
                subprocess.run([sys.executable, "-c", code], capture_output=True)
                return round(time.monotonic() - started)
            """, "as a float"),
]

_RUN_TREE = """
    import os, signal, subprocess, sys
    def run_tree(code, wall):
        proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True)
        try:
            proc.communicate(timeout=wall)
            status = "ok" if proc.returncode == 0 else "error"
        except subprocess.TimeoutExpired:
            {on_timeout}
            status = "timed_out"
        finally:
            {always}
        return status
    """
MISTAKES += [
    Mistake(
        7,
        "run_tree",
        "proc-kill",
        _RUN_TREE.format(on_timeout="pass", always="proc.kill(); proc.communicate()"),
        "proc.kill() signals only the direct child",
    ),
    Mistake(
        7,
        "run_tree",
        "killpg-only-on-timeout",
        _RUN_TREE.format(on_timeout="os.killpg(proc.pid, signal.SIGKILL); proc.communicate()", always="pass"),
        "kill the group even when the child exited",
    ),
    Mistake(
        7,
        "run_tree",
        "no-process-lookup-error",
        _RUN_TREE.format(on_timeout="pass", always="os.killpg(proc.pid, signal.SIGKILL); proc.communicate()"),
        "ProcessLookupError",
    ),
    Mistake(
        7,
        "run_tree",
        "getpgid-after-reaping",
        _RUN_TREE.format(
            on_timeout="pass", always="os.killpg(os.getpgid(proc.pid), signal.SIGKILL); proc.communicate()"
        ),
        "ProcessLookupError",
    ),
    Mistake(
        7,
        "survivors",
        "setsid-is-still-in-the-group",
        """
        def survivors():
            return {"kill": True, "killpg": False, "killpg_after_setsid": False, "subreaper_sweep": False,
                    "timeout_run": True}
        """,
        "in a group of its own",
    ),
    Mistake(
        7,
        "run_tree",
        "forgets-the-pipe",
        """
        import os, signal, subprocess, sys
        def run_tree(code, wall):
            proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    start_new_session=True)
            try:
                proc.wait(timeout=wall)
                proc.communicate()
                status = "ok" if proc.returncode == 0 else "error"
            except subprocess.TimeoutExpired:
                status = "timed_out"
            finally:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.communicate()
            return status
        """,
        "the pipe filled",
    ),
]

MISTAKES += [
    Mistake(
        11,
        "verdict",
        "exit-code-only",
        """
        def verdict(exit_code, expected, results, timed_out=False):
            if timed_out:
                return "timed_out"
            return {0: "verified", 1: "failed"}.get(exit_code, "unverified")
        """,
        "os._exit(0) faker",
    ),
    Mistake(
        11,
        "verdict",
        "the-old-rule",
        """
        def verdict(exit_code, expected, results, timed_out=False):
            if timed_out:
                return "timed_out"
            if results is None or set(results) != set(expected) or not expected:
                return "unverified"
            outcomes = set(results.values())
            if exit_code == 0 and outcomes == {"passed"}:
                return "verified"
            if exit_code == 1 and "failed" in outcomes:
                return "failed"
            return "unverified"
        """,
        "a test in error",
    ),
    Mistake(
        11,
        "verdict",
        "exit-2-or-5-as-failed",
        """
        def verdict(exit_code, expected, results, timed_out=False):
            if timed_out:
                return "timed_out"
            if exit_code in (2, 5):
                return "failed"
            if exit_code not in (0, 1) or results is None or not expected or set(results) != set(expected):
                return "unverified"
            outcomes = set(results.values())
            if outcomes == {"passed"}:
                return "verified" if exit_code == 0 else "unverified"
            if exit_code == 0 and outcomes & {"failed", "error"}:
                return "unverified"
            return "failed"
        """,
        "the tests never ran",
    ),
    Mistake(
        11,
        "verdict",
        "skip-is-a-pass",
        """
        def verdict(exit_code, expected, results, timed_out=False):
            if timed_out:
                return "timed_out"
            if exit_code not in (0, 1) or results is None or set(results) != set(expected):
                return "unverified"
            outcomes = set(results.values()) - {"skipped"}
            if outcomes == {"passed"}:
                return "verified" if exit_code == 0 else "unverified"
            if exit_code == 0 and outcomes & {"failed", "error"}:
                return "unverified"
            return "failed"
        """,
        "a skip is not a pass",
    ),
    Mistake(
        11,
        "badge_colour",
        "substring",
        """
        def badge_colour(label):
            return "green" if "VERIFIED" in label else "red" if "FAILED" in label else "grey"
        """,
        "testing with `in`",
    ),
    Mistake(
        11,
        "what_counts",
        "trusts-the-report-file",
        """
        def what_counts():
            return {"source": "a", "forged": "a"}
        """,
        "trusting a report file the submission can write",
        'QUESTIONS = dict.fromkeys(["source", "forged"], ("", dict.fromkeys("abc", "")))\n',
    ),
]

MISTAKES += [
    Mistake(
        13,
        "limits_line",
        "float-formatting",
        """
        def limits_line(outcome):
            limits, status = outcome["limits"], outcome["status"]
            if status == "timed_out":
                return f"%%limits wall={limits['wall_time'] * 2}"
            if status == "cpu_limit":
                return f"%%limits cpu={limits['cpu_time'] * 2}"
            if status == "memory_limit":
                return f"%%limits memory={limits['memory'] * 2 // (1024 * 1024)}M"
            if status == "output_limit":
                return f"%%limits output={limits['output'] * 2 // 1024}K"
            return None
        """,
        "format them with :g",
    ),
    Mistake(
        13,
        "limit_hit",
        "forgets-output",
        """
        def limit_hit(outcome):
            return {"timed_out": "wall_time", "cpu_limit": "cpu_time", "memory_limit": "memory"}.get(outcome["status"])
        """,
        "expected 'output'",
    ),
    Mistake(
        13,
        "limit_hit",
        "status-compared-with-in",
        """
        def limit_hit(outcome):
            status = outcome["status"]
            if status == "timed_out":
                return "wall_time"
            return "cpu_time" if "limit" in status else None
        """,
        "comparing statuses with `in`",
    ),
    Mistake(
        13,
        "what_next",
        "limits-on-the-second-line",
        """
        def what_next():
            return {"second_line": "a", "thread": "b", "stopped": "b"}
        """,
        "putting %%limits anywhere but the first line",
        QUESTIONS_13,
    ),
    Mistake(
        13,
        "what_next",
        "thread-for-the-next-cell",
        """
        def what_next():
            return {"second_line": "b", "thread": "a", "stopped": "b"}
        """,
        "keeping a thread for the next cell",
        QUESTIONS_13,
    ),
    Mistake(
        13,
        "what_next",
        "raises-the-limit",
        """
        def what_next():
            return {"second_line": "b", "thread": "b", "stopped": "a"}
        """,
        "raising limits instead of fixing the loop",
        QUESTIONS_13,
    ),
]

_LAUNCHER = """
    import sys
    def launcher_command(argv, memory, cpu):
        source = (
            "import os, resource, subprocess, sys\\n"
            "memory, cpu = int(sys.argv[1]), int(sys.argv[2])\\n"
            {body}
        )
        return [sys.executable, "-c", source, str(memory), str(cpu), *argv]
    """
_LIMITS = (
    '"resource.setrlimit(resource.RLIMIT_AS, (memory, memory))\\n"\n'
    '            "resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))\\n"'
)
MISTAKES += [
    Mistake(
        8,
        "launcher_command",
        "limits-after-exec",
        _LAUNCHER.format(body='"os.execvp(sys.argv[3], sys.argv[3:])\\n"\n            ' + _LIMITS),
        "set the limits before exec",
    ),
    Mistake(
        8,
        "launcher_command",
        "subprocess-instead-of-exec",
        _LAUNCHER.format(body=_LIMITS + '\n            "sys.exit(subprocess.call(sys.argv[3:]))\\n"'),
        "exec it with os.execvp",
    ),
    Mistake(
        8,
        "launcher_command",
        "execv-with-a-bare-name",
        _LAUNCHER.format(body=_LIMITS + '\n            "os.execv(sys.argv[3], sys.argv[3:])\\n"'),
        "os.execv needs a path",
    ),
    Mistake(
        8,
        "unsafe_with_threads",
        "preexec-setsid-is-safe",
        """
        WAYS = dict.fromkeys("abcdef", "")
        def unsafe_with_threads():
            return {"a"}
        """,
        "use start_new_session=True",
    ),
]

MISTAKES += [
    Mistake(
        9,
        "courteous",
        "nice-without-n",
        """
        def courteous(argv):
            return ["nice", "19", *argv]
        """,
        "without -n",
    ),
    Mistake(
        9,
        "courteous",
        "no-nice-at-all",
        """
        import shutil
        def courteous(argv):
            return (["ionice", "-c", "3"] if shutil.which("ionice") else []) + list(argv)
        """,
        "expected 19",
    ),
    Mistake(
        9,
        "predict_niceness",
        "no-cap-at-19",
        """
        CASES = dict.fromkeys("abcd")
        def predict_niceness():
            return {"a": 10, "b": 24, "c": 13, "d": 10}
        """,
        "stops at 19",
    ),
    Mistake(
        9,
        "courteous",
        "os-nice-in-the-notebook",
        """
        import os
        def courteous(argv):
            os.nice(19)
            return ["nice", "-n", "19", *argv]
        """,
        "changed this notebook's own niceness",
    ),
    Mistake(
        9,
        "courteous",
        "counts-on-ionice-everywhere",
        """
        def courteous(argv):
            return ["nice", "-n", "19", "ionice", "-c", "3", *argv]
        """,
        "counting on ionice everywhere",
    ),
]

MISTAKES += [
    Mistake(
        10,
        "fresh_venv",
        "system-site-packages",
        """
        import os, venv
        def fresh_venv(path):
            venv.create(path, with_pip=False, symlinks=True, system_site_packages=True)
            return os.path.join(str(path), "bin", "python")
        """,
        "system_site_packages",
    ),
    Mistake(
        10,
        "fresh_venv",
        "the-notebooks-own-python",
        """
        import sys
        def fresh_venv(path):
            return sys.executable
        """,
        "not the new venv",
    ),
    Mistake(
        10,
        "runs_project_code",
        "pip-is-trusted",
        """
        STEPS = dict.fromkeys("abcdef", "")
        def runs_project_code():
            return {"e", "f"}
        """,
        "it belongs in the sandbox",
    ),
    Mistake(
        10,
        "run_in_fresh_venv",
        "reuses-one-venv",
        """
        import atexit, os, shutil, subprocess, tempfile
        _task = tempfile.mkdtemp()
        atexit.register(shutil.rmtree, _task, True)
        def run_in_fresh_venv(code):
            python = os.path.join(_task, "venv", "bin", "python")
            if not os.path.exists(python):
                fresh_venv(os.path.join(_task, "venv"))
            return subprocess.run([python, "-c", code], capture_output=True, text=True).stdout
        """,
        "reusing one venv",
    ),
    Mistake(
        10,
        "run_in_fresh_venv",
        "forgets-to-delete-it",
        """
        import atexit, os, shutil, subprocess, tempfile
        def run_in_fresh_venv(code):
            task = tempfile.mkdtemp()
            atexit.register(shutil.rmtree, task, True)
            python = fresh_venv(os.path.join(task, "venv"))
            return subprocess.run([python, "-c", code], capture_output=True, text=True).stdout
        """,
        "forgetting to delete the venv",
    ),
    Mistake(
        12,
        "signal_name",
        "137-read-as-an-error",
        """
        import signal
        def signal_name(returncode):
            return signal.Signals(-returncode).name if returncode < 0 else None
        """,
        'reading 137 as "error 137"',
    ),
    Mistake(
        12,
        "what_works",
        "rlimits-protect-files",
        """
        def what_works():
            return {"secrets": "a", "results": "b", "plots": "b"}
        """,
        "believing rlimits protect your files",
        QUESTIONS_12,
    ),
    Mistake(
        12,
        "what_works",
        "unpickling-results",
        """
        def what_works():
            return {"secrets": "c", "results": "a", "plots": "b"}
        """,
        "unpickling what a child sends runs code",
        QUESTIONS_12,
    ),
    Mistake(
        12,
        "what_works",
        "matplotlib-picks-the-backend",
        """
        def what_works():
            return {"secrets": "c", "results": "b", "plots": "a"}
        """,
        "leaving matplotlib to pick a backend",
        QUESTIONS_12,
    ),
]


# Lessons 8, 9, 10 and 12 tried as a student working alone would: limits hard-coded, soft and hard apart, the wrong
# limit or unit, argv mangled on its way to exec, limits set in the notebook; nice's sign and size, ionice's class;
# venvs with pip or left half deleted, stdout mixed or stripped, no finally; signal names by table or by prefix,
# statuses past the signals; a file read in the parent, a path pasted into code, eval and pickle of a child's output.
_LAUNCH_8 = """
    import sys
    def launcher_command(argv, memory, cpu):
        source = (
            "import os, resource, sys\\n"
            "memory, cpu = int(sys.argv[1]), int(sys.argv[2])\\n"
            "resource.setrlimit(resource.RLIMIT_{memory_limit}, ({memory_soft}, {memory_hard}))\\n"
            "resource.setrlimit(resource.RLIMIT_CPU, ({cpu_soft}, {cpu_hard}))\\n"
            "os.execvp({exec_args})\\n"
        )
        return [sys.executable, "-c", source, {given}]
    """
_LAUNCH_8_RIGHT = {"memory_limit": "AS", "memory_soft": "memory", "memory_hard": "memory", "cpu_soft": "cpu",
                   "cpu_hard": "cpu + 1", "exec_args": "sys.argv[3], sys.argv[3:]",
                   "given": "str(memory), str(cpu), *argv"}


_WAYS_8 = 'WAYS = dict.fromkeys("abcdef", "")\n'


def _launch_8(**wrong: str) -> str:
    return _LAUNCH_8.format(**{**_LAUNCH_8_RIGHT, **wrong})


MISTAKES += [
    Mistake(8, "launcher_command", "hard-coded-limits", _launch_8(memory_soft="256 << 20", memory_hard="256 << 20",
            cpu_soft="3", cpu_hard="4"), "with memory=300 MB and cpu=7 s"),
    Mistake(8, "launcher_command", "cpu-soft-equals-hard", _launch_8(cpu_hard="cpu"), "one second above the soft one"),
    Mistake(8, "launcher_command", "cpu-hard-unlimited", _launch_8(cpu_hard="resource.RLIM_INFINITY"),
            "one second above the soft one"),
    Mistake(8, "launcher_command", "memory-soft-only", _launch_8(memory_hard="resource.RLIM_INFINITY"),
            "may raise its own limit again"),
    Mistake(8, "launcher_command", "rlimit-data", _launch_8(memory_limit="DATA"), "not RLIMIT_DATA or RLIMIT_RSS"),
    Mistake(8, "launcher_command", "memory-in-megabytes", _launch_8(given="str(memory // (1 << 20)), str(cpu), *argv"),
            "RLIMIT_AS is in bytes"),
    Mistake(8, "launcher_command", "memory-and-cpu-swapped", _launch_8(given="str(cpu), str(memory), *argv"),
            "RLIMIT_AS is in bytes"),
    Mistake(8, "launcher_command", "drops-argv0", _launch_8(exec_args="sys.argv[3], sys.argv[4:]"),
            "lost its first word"),
    Mistake(8, "launcher_command", "joined-then-split",
            _launch_8(exec_args="sys.argv[3].split()[0], sys.argv[3].split()",
                      given="str(memory), str(cpu), ' '.join(argv)"),
            "never joined into one string"),
    Mistake(8, "launcher_command", "through-a-shell", _launch_8(exec_args="'sh', ['sh', '-c', ' '.join(sys.argv[3:])]"),
            "through a shell"),
    Mistake(
        8,
        "launcher_command",
        "argv-pasted-into-the-source",
        """
        import sys
        def launcher_command(argv, memory, cpu):
            words = ", ".join(f"'{word}'" for word in argv)
            source = (
                "import os, resource\\n"
                f"resource.setrlimit(resource.RLIMIT_AS, ({memory}, {memory}))\\n"
                f"resource.setrlimit(resource.RLIMIT_CPU, ({cpu}, {cpu + 1}))\\n"
                f"os.execvp('{argv[0]}', [{words}])\\n"
            )
            return [sys.executable, "-c", source]
        """,
        "never pasted into the source",
    ),
    Mistake(
        8,
        "launcher_command",
        "limits-set-in-the-notebook",
        """
        import resource
        def launcher_command(argv, memory, cpu):
            resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
            return list(argv)
        """,
        "changed this notebook's own limits",
    ),
    Mistake(8, "unsafe_with_threads", "the-launcher-is-unsafe",
            "def unsafe_with_threads():\n    return {'a', 'e', 'f'}\n", "the launcher's Python runs after exec",
            _WAYS_8),
    Mistake(8, "unsafe_with_threads", "sessions-are-python", "def unsafe_with_threads():\n    return set('abcf')\n",
            "start_new_session is done by subprocess's C code", _WAYS_8),
    Mistake(8, "unsafe_with_threads", "a-list", "def unsafe_with_threads():\n    return ['a', 'f']\n", "not list",
            _WAYS_8),
    Mistake(8, "unsafe_with_threads", "capitals", "def unsafe_with_threads():\n    return {'A', 'F'}\n",
            "are not keys of WAYS", _WAYS_8),
]

_COURTEOUS = """
    import shutil
    def courteous(argv):
        return {command} + list(argv)
    """
MISTAKES += [
    Mistake(9, "courteous", "negative-niceness", _COURTEOUS.format(command='["nice", "-n", "-19"]'),
            "a negative niceness is greedier"),
    Mistake(9, "courteous", "nice-10", _COURTEOUS.format(command='["nice", "-n", "10"]'), "does not reach niceness 19"),
    Mistake(9, "courteous", "plain-nice", _COURTEOUS.format(command='["nice"]'), "does not reach niceness 19"),
    Mistake(9, "courteous", "ionice-best-effort", _COURTEOUS.format(
            command='["nice", "-n", "19"] + (["ionice", "-c", "2", "-n", "7"] if shutil.which("ionice") else [])'),
            "is not the idle class"),
    Mistake(9, "courteous", "ionice-level-only", _COURTEOUS.format(
            command='["nice", "-n", "19"] + (["ionice", "-n", "7"] if shutil.which("ionice") else [])'),
            "-n only sets a level"),
    Mistake(
        9,
        "courteous",
        "ionice-looked-up-once",
        """
        import shutil
        IONICE = shutil.which("ionice")
        def courteous(argv):
            return ["nice", "-n", "19"] + (["ionice", "-c", "3"] if IONICE else []) + list(argv)
        """,
        "counting on ionice everywhere",
    ),
    Mistake(9, "predict_niceness", "strings", 'def predict_niceness():\n    return {"a": "10", "b": "19", "c": "13", '
            '"d": "10"}\n', "an int", 'CASES = dict.fromkeys("abcd")\n'),
    Mistake(9, "predict_niceness", "the-shell-starts-afresh", 'def predict_niceness():\n    return {"a": 10, "b": 19, '
            '"c": 3, "d": 10}\n', "the shell inherits", 'CASES = dict.fromkeys("abcd")\n'),
    Mistake(9, "predict_niceness", "nice-alone-is-19",
            'def predict_niceness():\n    return {"a": 10, "b": 19, "c": 13, "d": 19}\n', "without -n",
            'CASES = dict.fromkeys("abcd")\n'),
]

_FRESH_RUN = """
    import os, shutil, subprocess, tempfile
    def run_in_fresh_venv(code):
        task = tempfile.mkdtemp()
        {body}
    """
MISTAKES += [
    Mistake(
        10,
        "fresh_venv",
        "python-m-venv-with-pip",
        """
        import os, subprocess, sys
        def fresh_venv(path):
            subprocess.run([sys.executable, "-m", "venv", str(path)], check=True)
            return os.path.join(str(path), "bin", "python")
        """,
        "without pip",  # "has pip in it", or on a busy machine "took more than 12 s ... without pip"
        # Its hidden tests do fail (test_fresh_venv_has_no_pip), but each of them makes venvs with pip: minutes of
        # ensurepip on a busy machine, past the run's deadline, for what one check run shows.
        check_only=True,
    ),
    Mistake(10, "fresh_venv", "path-only",
            "import os\ndef fresh_venv(path):\n    return os.path.join(str(path), 'bin', 'python')\n",
            "which does not exist"),
    Mistake(10, "runs_project_code", "build-forgotten", "def runs_project_code():\n    return {'d', 'f'}\n",
            "building calls the project's build backend too", 'STEPS = dict.fromkeys("abcdef")\n'),
    Mistake(10, "runs_project_code", "tests-forgotten", "def runs_project_code():\n    return {'d', 'e'}\n",
            "the tests import the project", 'STEPS = dict.fromkeys("abcdef")\n'),
    Mistake(10, "runs_project_code", "toml-runs", "def runs_project_code():\n    return set('cdef')\n",
            "parsing TOML reads data", 'STEPS = dict.fromkeys("abcdef")\n'),
    Mistake(10, "run_in_fresh_venv", "deletes-only-the-venv", _FRESH_RUN.format(body="""
        python = fresh_venv(os.path.join(task, "venv"))
        try:
            return subprocess.run([python, "-c", code], capture_output=True, text=True).stdout
        finally:
            shutil.rmtree(os.path.join(task, "venv"))"""), "not only the venv"),
    Mistake(10, "run_in_fresh_venv", "no-finally", _FRESH_RUN.format(body="""
        python = fresh_venv(os.path.join(task, "venv"))
        out = subprocess.run([python, "-c", code], capture_output=True, text=True).stdout
        shutil.rmtree(task)
        return out"""), "itself raised"),
    Mistake(10, "run_in_fresh_venv", "returns-the-completed-process", _FRESH_RUN.format(body="""
        try:
            return subprocess.run([fresh_venv(os.path.join(task, "venv")), "-c", code], capture_output=True, text=True)
        finally:
            shutil.rmtree(task)"""), "return what the code printed"),
    Mistake(10, "run_in_fresh_venv", "stdout-and-stderr", _FRESH_RUN.format(body="""
        try:
            done = subprocess.run([fresh_venv(os.path.join(task, "venv")), "-c", code], capture_output=True, text=True)
            return done.stdout + done.stderr
        finally:
            shutil.rmtree(task)"""), "return stdout alone"),
    Mistake(10, "run_in_fresh_venv", "strips", _FRESH_RUN.format(body="""
        try:
            done = subprocess.run([fresh_venv(os.path.join(task, "venv")), "-c", code], capture_output=True, text=True)
            return done.stdout.strip()
        finally:
            shutil.rmtree(task)"""), "as it was printed"),
]

_SIGNAL_NAME = """
    import signal
    def signal_name(returncode):
        {body}
    """
MISTAKES += [
    Mistake(12, "signal_name", "a-table-of-two", _SIGNAL_NAME.format(
            body='return {9: "SIGKILL", 11: "SIGSEGV"}.get(-returncode if returncode < 0 else returncode - 128)'),
            "means killed by signal 15"),
    Mistake(12, "signal_name", "no-such-signal-raises", _SIGNAL_NAME.format(
            body="return signal.Signals(-returncode if returncode < 0 else returncode - 128).name "
                 "if returncode < 0 or returncode > 128 else None"), "127 is no signal"),
    Mistake(12, "signal_name", "128-is-a-signal", _SIGNAL_NAME.format(
            body="return signal.Signals(-returncode if returncode < 0 else returncode - 128).name "
                 "if returncode < 0 or 128 <= returncode < 255 else None"), "0 is no signal"),
    Mistake(12, "signal_name", "the-number", _SIGNAL_NAME.format(
            body="return (-returncode if returncode < 0 else returncode - 128) if returncode < 0 or 128 < returncode < "
                 "160 else None"), "gave the number"),
    Mistake(12, "signal_name", "str-of-the-enum", _SIGNAL_NAME.format(
            body="return str(signal.Signals(-returncode if returncode < 0 else returncode - 128)) "
                 "if returncode < 0 or 128 < returncode < 160 else None"), "the exact name"),
    Mistake(12, "signal_name", "strsignal", _SIGNAL_NAME.format(
            body="return signal.strsignal(-returncode if returncode < 0 else returncode - 128) "
                 "if returncode < 0 or 128 < returncode < 160 else None"), "the exact name"),
    Mistake(12, "signal_name", "modulo-128", _SIGNAL_NAME.format(
            body="try:\n            return signal.Signals(abs(returncode) % 128).name\n"
                 "        except ValueError:\n            return None"), "is a normal exit status"),
]
_READ = """
    import base64, pickle, subprocess, sys
    def read_small_file(path):
        {body}
    """
MISTAKES += [
    Mistake(12, "read_small_file", "the-parent-reads-it", _READ.format(body="return open(path, 'rb').read()"),
            "read by this notebook's own process"),
    Mistake(12, "read_small_file", "path-pasted-into-the-code", _READ.format(body="""
        code = f"import base64, sys; sys.stdout.write(base64.b64encode(open('{path}', 'rb').read()).decode())"
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        return base64.b64decode(done.stdout)"""),
            "pass the path to the child as an argument"),
    Mistake(12, "read_small_file", "eval-of-a-repr", _READ.format(body="""
        code = "import sys; print(repr(open(sys.argv[1], 'rb').read()))"
        return eval(subprocess.run([sys.executable, "-c", code, path], capture_output=True, text=True).stdout)"""),
            "eval or pickle.loads"),
    Mistake(12, "read_small_file", "pickle", _READ.format(body="""
        code = "import pickle, sys; sys.stdout.buffer.write(pickle.dumps(open(sys.argv[1], 'rb').read()))"
        return pickle.loads(subprocess.run([sys.executable, "-c", code, path], capture_output=True).stdout)"""),
            "eval or pickle.loads"),
    Mistake(12, "read_small_file", "base64-text-returned", _READ.format(body="""
        code = "import base64, sys; print(base64.b64encode(open(sys.argv[1], 'rb').read()).decode())"
        return subprocess.run([sys.executable, "-c", code, path], capture_output=True, text=True).stdout"""),
            "decode the base64"),
    Mistake(12, "read_small_file", "latin-1-text", _READ.format(body="""
        code = "import sys; sys.stdout.write(open(sys.argv[1], 'rb').read().decode('latin-1'))"
        done = subprocess.run([sys.executable, "-c", code, path], capture_output=True, text=True)
        return done.stdout.encode('latin-1')"""),
            "text mode turns"),
    Mistake(12, "what_works", "a-deadline-stops-reading", 'def what_works():\n    return {"secrets": "d", '
            '"results": "b", "plots": "b"}\n', "a deadline limits time", QUESTIONS_12),
    Mistake(12, "what_works", "eval-of-results", 'def what_works():\n    return {"secrets": "c", '
            '"results": "c", "plots": "b"}\n', "eval of what a child sends", QUESTIONS_12),
]

# The wrong answers of issue 26, and variants of each kind: statuses and signals, stderr, .strip(), zombies,
# SIGTERM, full pipes, subsets and counts, prefix and case tricks, sub-second limits, rule order.
_ISOLATED = """
    import subprocess, sys
    def run_isolated(code):
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        return {ok}, {out}, {err}
    """
MISTAKES += [
    Mistake(1, "run_isolated", "success-is-empty-stderr",
            _ISOLATED.format(ok='r.stderr == ""', out="r.stdout", err="r.stderr"), "not an empty stderr"),
    Mistake(1, "run_isolated", "only-status-1-fails",
            _ISOLATED.format(ok="r.returncode != 1", out="r.stdout", err="r.stderr"), "exits with status 2"),
    Mistake(1, "run_isolated", "a-signal-is-success",
            _ISOLATED.format(ok="r.returncode <= 0", out="r.stdout", err="r.stderr"), "killed by a signal"),
    Mistake(1, "run_isolated", "strips-stdout",
            _ISOLATED.format(ok="r.returncode == 0", out="r.stdout.strip()", err="r.stderr"), "without .strip()"),
    Mistake(1, "run_isolated", "strips-stderr",
            _ISOLATED.format(ok="r.returncode == 0", out="r.stdout", err="r.stderr.strip()"), "without .strip()"),
    Mistake(1, "run_isolated", "streams-swapped",
            _ISOLATED.format(ok="r.returncode == 0", out="r.stderr", err="r.stdout"), "the wrong way round"),
    Mistake(
        1,
        "predict",
        "stderr-in-stdout",
        """
        SNIPPETS = {"a": "print('one'); print('two')", "b": "print('start'); 1 / 0",
                    "c": "import sys; sys.stderr.write('careful\\\\n')", "d": "import sys; print('bye'); sys.exit(0)",
                    "e": "import sys; sys.exit('stopped')"}
        def predict():
            return {"a": (True, "one\\ntwo\\n"), "b": (False, "start\\n"), "c": (True, "careful\\n"),
                    "d": (True, "bye\\n"), "e": (False, "")}
        """,
        "stderr is separate",
    ),
    Mistake(
        1,
        "predict",
        "stderr-is-failure",
        """
        SNIPPETS = {"a": "print('one'); print('two')", "b": "print('start'); 1 / 0",
                    "c": "import sys; sys.stderr.write('careful\\\\n')", "d": "import sys; print('bye'); sys.exit(0)",
                    "e": "import sys; sys.exit('stopped')"}
        def predict():
            return {"a": (True, "one\\ntwo\\n"), "b": (False, "start\\n"), "c": (False, ""),
                    "d": (True, "bye\\n"), "e": (False, "")}
        """,
        "writing to stderr changes nothing",
    ),
]
_TIMEOUT = """
    import subprocess, sys
    def run_with_timeout(code, seconds):
        try:
            result = subprocess.run([sys.executable, "-c", code], capture_output=True, {timeout})
        except subprocess.TimeoutExpired:
            return "timed_out"
        return {status}
    """
_WAIT = """
    import subprocess
    def wait_or_kill(proc, seconds):
        try:
            return proc.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            {stop}
            return None
    """
MISTAKES += [
    Mistake(3, "run_with_timeout", "no-timeout-at-all",
            _TIMEOUT.format(timeout="", status='"ok" if result.returncode == 0 else "error"'),
            "pass timeout=seconds"),
    Mistake(3, "run_with_timeout", "only-status-1-is-error",
            _TIMEOUT.format(timeout="timeout=seconds", status='"error" if result.returncode == 1 else "ok"'),
            "exits with 2"),
    Mistake(3, "run_with_timeout", "a-signal-is-ok",
            _TIMEOUT.format(timeout="timeout=seconds", status='"error" if result.returncode > 0 else "ok"'),
            "killed by a signal"),
    Mistake(3, "wait_or_kill", "terminate-not-kill", _WAIT.format(stop="proc.terminate(); proc.wait()"),
            "proc.terminate() sends SIGTERM"),
    Mistake(3, "wait_or_kill", "returns-true-for-success",
            """
            import subprocess
            def wait_or_kill(proc, seconds):
                try:
                    return proc.wait(timeout=seconds) == 0
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
                    return None
            """, "return proc.wait()'s value"),
]
_LIMITED = """
    import resource, signal, subprocess, sys
    def run_limited(code, memory, cpu):
        def limit():
            resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
            {cpu}
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, preexec_fn=limit)
        {memory_test}
            return "memory_limit"
        if {cpu_test}:
            return "cpu_limit"
        return "ok" if result.returncode == 0 else "error"
    """
_CPU = "resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))"
_LAST = "if result.stderr.rstrip().rsplit(chr(10), 1)[-1].startswith('MemoryError'):"
_KILLED = "result.returncode in (-signal.SIGXCPU, -signal.SIGKILL)"
MISTAKES += [
    Mistake(5, "run_limited", "sigxcpu-only", _LIMITED.format(cpu=_CPU, memory_test=_LAST,
            cpu_test="result.returncode == -signal.SIGXCPU"), "ignores SIGXCPU"),
    Mistake(5, "run_limited", "any-signal-is-cpu", _LIMITED.format(cpu=_CPU, memory_test=_LAST,
            cpu_test="result.returncode < 0"), "died of SIGSEGV"),
    Mistake(5, "run_limited", "no-cpu-limit", _LIMITED.format(cpu="pass", memory_test=_LAST, cpu_test=_KILLED),
            "no CPU limit at all"),
    Mistake(5, "run_limited", "memory-error-anywhere", _LIMITED.format(cpu=_CPU,
            memory_test="if 'MemoryError' in result.stderr:", cpu_test=_KILLED), "merely mentions MemoryError"),
    Mistake(
        5,
        "run_limited",
        "setrlimit-here-then-run",
        """
        import resource, signal, subprocess, sys
        def run_limited(code, memory, cpu):
            resource.setrlimit(resource.RLIMIT_CPU, (cpu + 60, cpu + 61))
            result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
            return "ok" if result.returncode == 0 else "error"
        """,
        "changed this notebook's own limits",
    ),
]
# Lessons 3 and 5 again, a student alone: a zombie left by run_with_timeout, a timeout word spelled another way,
# the kill's status returned; RLIMIT_DATA for memory, an unlimited hard CPU limit, "MemoryError" anywhere in the
# last line, only status 1 as an error.
MISTAKES += [
    Mistake(3, "run_with_timeout", "kill-without-collecting", """
            import subprocess, sys
            def run_with_timeout(code, seconds):
                proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL)
                try:
                    return "ok" if proc.wait(timeout=seconds) == 0 else "error"
                except subprocess.TimeoutExpired:
                    proc.kill()
                    return "timed_out"
            """, "zombie (state Z"),
    Mistake(3, "run_with_timeout", "timed-out-with-a-space",
            _TIMEOUT.format(timeout="timeout=seconds", status='"ok" if result.returncode == 0 else "error"')
            .replace('return "timed_out"', 'return "timed out"'), "not 'timed_out'"),
    Mistake(3, "wait_or_kill", "returns-the-kill-status",
            _WAIT.format(stop="proc.kill()\n            return proc.wait()"), "expected None"),
    Mistake(5, "run_limited", "rlimit-data", _LIMITED.format(cpu=_CPU, memory_test=_LAST, cpu_test=_KILLED)
            .replace("RLIMIT_AS, (memory, memory)", "RLIMIT_DATA, (memory, memory)"), "the child's RLIMIT_AS was"),
    Mistake(5, "run_limited", "unlimited-hard-cpu",
            _LIMITED.format(cpu="resource.setrlimit(resource.RLIMIT_CPU, (cpu, resource.RLIM_INFINITY))",
                            memory_test=_LAST, cpu_test=_KILLED), "expected (2, 3)"),
    Mistake(5, "run_limited", "memory-error-in-the-last-line", _LIMITED.format(
            cpu=_CPU, memory_test="if 'MemoryError' in (result.stderr.strip().splitlines() or [''])[-1]:",
            cpu_test=_KILLED), "merely mentions MemoryError"),
    Mistake(5, "run_limited", "only-status-1-is-error", _LIMITED.format(cpu=_CPU, memory_test=_LAST, cpu_test=_KILLED)
            .replace('"ok" if result.returncode == 0 else "error"', '"error" if result.returncode == 1 else "ok"'),
            "any other end is 'error'"),
]
MISTAKES += [
    Mistake(7, "run_tree", "wait-instead-of-communicate",
            """
            import os, signal, subprocess, sys
            def run_tree(code, wall):
                proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                        start_new_session=True)
                try:
                    proc.wait(timeout=wall)
                    status = "ok" if proc.returncode == 0 else "error"
                except subprocess.TimeoutExpired:
                    status = "timed_out"
                finally:
                    try:
                        os.killpg(proc.pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                    proc.communicate()
                return status
            """, "the pipe filled"),
]
_VERDICT = """
    def verdict(exit_code, expected, results, timed_out=False):
        if timed_out:
            return "timed_out"
        if {never_ran} or results is None or {names}:
            return "unverified"
        outcomes = set(results.values())
        if outcomes == {{"passed"}}:
            return "verified" if exit_code == 0 else "unverified"
        if exit_code == 0 and {contradicts}:
            return "unverified"
        return "failed"
    """
_RIGHT = {"never_ran": "exit_code not in (0, 1)", "names": "set(results) != set(expected)",
          "contradicts": 'outcomes & {"failed", "error"}'}
MISTAKES += [
    Mistake(11, "verdict", "subset-of-the-evidence",
            _VERDICT.format(**{**_RIGHT, "names": "not set(expected) <= set(results)"}), "not a subset test"),
    Mistake(11, "verdict", "counts-the-evidence",
            _VERDICT.format(**{**_RIGHT, "names": "len(results) != len(expected)"}), "compare the names"),
    Mistake(11, "verdict", "error-with-exit-0-overlooked",
            _VERDICT.format(**{**_RIGHT, "contradicts": '"failed" in outcomes'}), "look for both"),
    Mistake(11, "verdict", "only-2-and-5-never-ran",
            _VERDICT.format(**{**_RIGHT, "never_ran": "exit_code in (2, 5)"}), "exit 3 (an internal error)"),
    Mistake(11, "verdict", "a-signal-is-failed",
            _VERDICT.format(**{**_RIGHT, "never_ran": "exit_code in (2, 3, 4, 5)"}), "killed by a signal"),
    Mistake(
        11,
        "verdict",
        "timed-out-after-exit-code",
        """
        def verdict(exit_code, expected, results, timed_out=False):
            if exit_code not in (0, 1) or results is None or set(results) != set(expected):
                return "unverified"
            if timed_out:
                return "timed_out"
            outcomes = set(results.values())
            if outcomes == {"passed"}:
                return "verified" if exit_code == 0 else "unverified"
            if exit_code == 0 and outcomes & {"failed", "error"}:
                return "unverified"
            return "failed"
        """,
        "rule comes first",
    ),
    Mistake(
        11,
        "verdict",
        "failed-before-incomplete",
        """
        def verdict(exit_code, expected, results, timed_out=False):
            if timed_out:
                return "timed_out"
            if exit_code == 1 and results and "failed" in results.values():
                return "failed"
            if exit_code not in (0, 1) or results is None or set(results) != set(expected):
                return "unverified"
            outcomes = set(results.values())
            if outcomes == {"passed"}:
                return "verified" if exit_code == 0 else "unverified"
            if exit_code == 0 and outcomes & {"failed", "error"}:
                return "unverified"
            return "failed"
        """,
        "rule order",
    ),
]
_BADGE = """
    def badge_colour(label):
        {body}
    """
MISTAKES += [
    Mistake(11, "badge_colour", "startswith", _BADGE.format(
        body='return next((c for l, c in [("TESTS VERIFIED", "green"), ("TESTS FAILED", "red"), '
             '("TESTS TIMED OUT", "orange")] if label.startswith(l)), "grey")'), "how the label starts"),
    Mistake(11, "badge_colour", "endswith", _BADGE.format(
        body='return next((c for l, c in [("TESTS VERIFIED", "green"), ("TESTS FAILED", "red"), '
             '("TESTS TIMED OUT", "orange")] if label.endswith(l)), "grey")'), "how the label ends"),
    Mistake(11, "badge_colour", "strip-upper-lookup", _BADGE.format(
        body='return {"TESTS VERIFIED": "green", "TESTS FAILED": "red", "TESTS TIMED OUT": "orange"}'
             '.get(label.strip().upper(), "grey")'), "changing the case"),
    Mistake(11, "badge_colour", "strip-lookup", _BADGE.format(
        body='return {"TESTS VERIFIED": "green", "TESTS FAILED": "red", "TESTS TIMED OUT": "orange"}'
             '.get(label.strip(), "grey")'), "stripping spaces"),
    Mistake(11, "badge_colour", "words-lookup", _BADGE.format(
        body='return {"TESTS VERIFIED": "green", "TESTS FAILED": "red", "TESTS TIMED OUT": "orange"}'
             '.get(" ".join(label.split()), "grey")'), "splitting the label into words"),
]
_LINE = """
    def limits_line(outcome):
        limits, status = outcome["limits"], outcome["status"]
        if status == "timed_out":
            return f"%%limits wall={{{wall}}}"
        if status == "cpu_limit":
            return f"%%limits cpu={{{cpu}}}"
        if status == "memory_limit":
            return f"%%limits memory={{limits['memory'] * 2 // (1024 * 1024)}}M"
        if status == "output_limit":
            return f"%%limits output={{limits['output'] * 2 // 1024}}K"
        return None
    """
MISTAKES += [
    Mistake(13, "limits_line", "int", _LINE.format(wall="int(limits['wall_time'] * 2)",
            cpu="int(limits['cpu_time'] * 2)"), "drop the fraction"),
    Mistake(13, "limits_line", "round", _LINE.format(wall="round(limits['wall_time'] * 2)",
            cpu="round(limits['cpu_time'] * 2)"), "drop the fraction"),
    Mistake(13, "limits_line", "int-before-doubling", _LINE.format(wall="int(limits['wall_time']) * 2",
            cpu="int(limits['cpu_time']) * 2"), "drop the fraction"),
]

# Lessons 7 and 13 again, with wrong answers not tried before: SIGTERM to the group (a program may ignore it), no
# group of its own, a status looked up with [] (KeyError for a run that hit no limit), sizes in decimal units.
_TREE_7 = """
    import os, signal, subprocess, sys
    def run_tree(code, wall):
        proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE{session})
        try:
            proc.communicate(timeout=wall)
            status = "ok" if proc.returncode == 0 else "error"
        except subprocess.TimeoutExpired:
            status = "timed_out"
        finally:
            try:
                os.killpg(proc.pid, signal.{signal})
            except ProcessLookupError:
                pass
            proc.communicate()
        return status
    """
MISTAKES += [
    Mistake(7, "run_tree", "sigterm-to-the-group", _TREE_7.format(session=", start_new_session=True", signal="SIGTERM"),
            "which a program may catch or ignore"),
    Mistake(7, "run_tree", "no-group-of-its-own", _TREE_7.format(session="", signal="SIGKILL"),
            "not in a process group of its own"),
    Mistake(11, "verdict", "only-pytests-own-codes-never-ran",
            _VERDICT.format(**{**_RIGHT, "never_ran": "exit_code in (2, 3, 4, 5) or exit_code < 0"}),
            "exit 6 (a status pytest never gives)"),
    Mistake(13, "limit_hit", "lookup-with-brackets", """
        def limit_hit(outcome):
            return {"timed_out": "wall_time", "cpu_limit": "cpu_time", "memory_limit": "memory",
                    "output_limit": "output"}[outcome["status"]]
        """, "look the status up with .get()"),
    Mistake(13, "limits_line", "decimal-megabytes", _LINE.format(wall="limits['wall_time'] * 2:g",
            cpu="limits['cpu_time'] * 2:g").replace("(1024 * 1024)", "1000000"), "expected '%%limits memory=512M'"),
]

# Every wrong answer's check cell and hidden tests run once per session, each in a fork of one warm worker
# (tests/forkruns.py), in the order of the tests, a few at a time (most of them wait on children and clocks, not on
# the CPU); each test then reads its own results.  A fork keeps what a wrong answer does to its process (setrlimit,
# os.nice, builtins, os._exit, a hang past its deadline) away from the others.
PARALLEL = 3


def _skip_reason(mistake: Mistake) -> str | None:
    if "os.nice(19)" in mistake.source and os.nice(0) >= 19:
        return "this process already runs at niceness 19, so os.nice(19) changes nothing to see"
    return None


class MistakeRuns:
    """The runs of the check cell and of the hidden tests for each wrong answer, in forks of one worker.

    Args:
        runner: the worker.
        tmp: where each run gets its folder (the hidden tests' module and report, the runs' output).
    """

    def __init__(self, runner: forkruns.Runner, tmp: pytest.TempPathFactory) -> None:
        self.runner, self.tmp = runner, tmp
        self.made: dict[str, tuple[forkruns.Job, forkruns.Job | None]] = {}
        self.solutions: dict[str, tuple[list[forkruns.Job], forkruns.Job]] = {}

    def jobs(self, mistake: Mistake) -> tuple[forkruns.Job, forkruns.Job | None]:
        """The check cell's job and the hidden tests' job (None for a check-only mistake), made once."""
        key = str(mistake)
        if key not in self.made:
            check_tmp = self.tmp.mktemp(f"{key}-check")
            check = forkruns.Job(
                f"{key} check", "python", [check_script(mistake.lesson, mistake.exercise, mistake.source,
                                                        mistake.context)],
                cwd=str(LESSONS), folder=str(check_tmp), deadline=CHECK_DEADLINE,
            )
            hidden = None
            if not mistake.check_only:
                tmp = self.tmp.mktemp(f"{key}-hidden")
                args = hidden_tests(mistake.lesson, tmp, mistake.exercise, mistake.source, per_test=MISTAKE_PER_TEST)
                hidden = forkruns.Job(f"{key} hidden tests", "pytest", args, cwd=str(tmp), folder=str(tmp),
                                      deadline=HIDDEN_DEADLINE, env=hidden_env(tmp), path=[str(tmp)])
            self.made[key] = (check, hidden)
        return self.made[key]

    def solution_jobs(self, number: int) -> tuple[list[forkruns.Job], forkruns.Job]:
        """The jobs of lesson ``number``'s solutions: one check cell per exercise, and the hidden tests; made once."""
        key = f"lesson{number:02d}-solutions"
        if key not in self.solutions:
            checks = [
                forkruns.Job(f"{key} check {name}", "python", [check_script(number, name)], cwd=str(LESSONS),
                             folder=str(self.tmp.mktemp(f"{key}-{name}")), deadline=CHECK_DEADLINE)
                for name in LESSON[number].exercises
            ]
            tmp = self.tmp.mktemp(f"{key}-hidden")
            hidden = forkruns.Job(f"{key} hidden tests", "pytest", hidden_tests(number, tmp), cwd=str(tmp),
                                  folder=str(tmp), deadline=HIDDEN_DEADLINE, env=hidden_env(tmp), path=[str(tmp)])
            self.solutions[key] = (checks, hidden)
        return self.solutions[key]

    def submit(self, mistakes: list[Mistake], solutions: tuple[int, ...] = ()) -> None:
        """Queue the runs of ``mistakes``, in order, the check cell of each before its hidden tests, then those of
        the lessons ``solutions``."""
        jobs = [job for mistake in mistakes for job in self.jobs(mistake) if job is not None]
        for number in solutions:
            checks, hidden = self.solution_jobs(number)
            jobs += [*checks, hidden]
        self.runner.submit(jobs)

    def solution_lines(self, number: int) -> list[str]:
        """The line each check cell of lesson ``number`` printed with the solutions in place."""
        return [check_line(self._done(job)) for job in self.solution_jobs(number)[0]]

    def solution_outcomes(self, number: int) -> dict[str, str]:
        """{test name: outcome} of lesson ``number``'s hidden tests on its solutions."""
        job = self.solution_jobs(number)[1]
        return hidden_outcomes(self._done(job), Path(job.folder))

    def _done(self, job: forkruns.Job) -> subprocess.CompletedProcess[str]:
        result = self.runner.result(job)
        if result.late:
            pytest.fail(f"{job.key}: still running after {job.deadline} s, killed: {result.stdout[-2000:]}")
        return result.completed()

    def check_line(self, mistake: Mistake) -> str:
        """The line the check cell printed for ``mistake``."""
        return check_line(self._done(self.jobs(mistake)[0]))

    def hidden_outcomes(self, mistake: Mistake) -> dict[str, str]:
        """{test name: outcome} of the hidden tests on ``mistake``."""
        job = self.jobs(mistake)[1]
        assert job is not None, f"{mistake} is checked by its check cell only"
        return hidden_outcomes(self._done(job), Path(job.folder))


@pytest.fixture(scope="session")
def mistake_runs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[MistakeRuns]:
    """The runs of every wrong answer this session selected, queued at once in the order of their tests."""
    def selected(test: str, param: str) -> list[Any]:
        return [
            item.callspec.params[param]
            for item in request.session.items
            if isinstance(item, pytest.Function) and item.originalname == test and hasattr(item, "callspec")
        ]

    mistakes = [mistake for mistake in selected(REJECT_TEST, "mistake") if _skip_reason(mistake) is None]
    with forkruns.Runner(PARALLEL, tmp_path_factory.mktemp("forkruns")) as runner:
        runs = MistakeRuns(runner, tmp_path_factory)
        runs.submit(mistakes, tuple(selected(SOLUTIONS_TEST, "number")))
        yield runs


REJECT_TEST = "test_check_and_hidden_tests_both_reject_a_listed_mistake"
SOLUTIONS_TEST = "test_solutions_pass_their_checks_and_hidden_tests"


def test_fork_runs_keep_what_each_job_does_to_itself(tmp_path: Path) -> None:
    """A job that lowers its limits, renames a builtin, ends with os._exit or hangs spoils no other job."""
    spoilers = {
        "limits": "import resource; resource.setrlimit(resource.RLIMIT_NOFILE, (20, 20)); print('limited')",
        "builtins": "import builtins; builtins.print = None",
        "exit": "import os; print('bye', flush=True); os._exit(3)",
        "hang": "import subprocess, sys, time; child = subprocess.Popen([sys.executable, '-c', 'import time; "
        "time.sleep(60)']); print(child.pid, flush=True); time.sleep(60)",
        "raises": "raise SystemExit('stopped')",
    }
    probe = (
        "import builtins, resource, sys; print(__name__, sys.path[0] == '', builtins.print is not None, "
        "resource.getrlimit(resource.RLIMIT_NOFILE)[0] != 20)"
    )
    test_file = "import submission\n\ndef test_it():\n    assert submission.VALUE == 1\n"

    def job(key: str, kind: str, argv: list[str], deadline: float = 60) -> forkruns.Job:
        (tmp_path / key).mkdir()
        return forkruns.Job(key, kind, argv, cwd=str(tmp_path / key), folder=str(tmp_path / key), deadline=deadline,
                            path=[str(tmp_path / key)])

    jobs = [job(key, "python", [code], deadline=2 if key == "hang" else 60) for key, code in spoilers.items()]
    jobs.append(job("probe", "python", [probe]))
    for key, value in (("right", 1), ("wrong", 2)):  # two submissions of one name, each seen only by its own run
        jobs.append(job(key, "pytest", ["-q", "-p", "no:cacheprovider", "test_it.py"]))
        (tmp_path / key / "submission.py").write_text(f"VALUE = {value}\n")
        (tmp_path / key / "test_it.py").write_text(test_file)
    with forkruns.Runner(len(jobs), tmp_path) as runner:
        runner.submit(jobs)
        results = {job.key: runner.result(job) for job in jobs}
    assert [(key, r.returncode, r.late) for key, r in results.items()] == [
        ("limits", 0, False), ("builtins", 0, False), ("exit", 3, False), ("hang", -signal.SIGKILL, True),
        ("raises", 1, False), ("probe", 0, False), ("right", 0, False), ("wrong", 1, False),
    ]
    assert results["limits"].stdout == "limited\n" and results["exit"].stdout == "bye\n"
    left = int(results["hang"].stdout)  # the late job's own child ended with its session
    gone = time.monotonic() + 10  # SIGKILL is delivered at once, but the scheduler may take a moment
    while alive(left) and time.monotonic() < gone:
        time.sleep(0.1)
    assert not alive(left)
    assert results["raises"].stderr == "stopped\n"
    assert results["probe"].stdout == "__main__ True True True\n"
    assert "1 passed" in results["right"].stdout and "1 failed" in results["wrong"].stdout


@pytest.mark.slow
@pytest.mark.parametrize("mistake", MISTAKES, ids=str)
def test_check_and_hidden_tests_both_reject_a_listed_mistake(mistake: Mistake, mistake_runs: MistakeRuns) -> None:
    reason = _skip_reason(mistake)
    if reason:
        pytest.skip(reason)
    line = mistake_runs.check_line(mistake)
    assert line.startswith(f"{FAIL} {mistake.exercise}") and mistake.hint in line, line
    if mistake.check_only:
        return
    outcomes = mistake_runs.hidden_outcomes(mistake)
    assert outcomes and "failed" in outcomes.values(), outcomes


@pytest.mark.slow
@pytest.mark.parametrize("number", sorted(LESSON), ids=lambda n: f"lesson{n:02d}")
def test_solutions_pass_their_checks_and_hidden_tests(number: int, mistake_runs: MistakeRuns) -> None:
    for name, line in zip(LESSON[number].exercises, mistake_runs.solution_lines(number), strict=True):
        assert line.startswith(f"{PASS} {name}"), line
    outcomes = mistake_runs.solution_outcomes(number)
    assert outcomes and set(outcomes.values()) == {"passed"}, outcomes
