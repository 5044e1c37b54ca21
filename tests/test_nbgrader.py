"""nbgrader autogrades on the cellbox kernel, set up by its configuration file alone (docs/nbgrader.md).

One small course is made in a temporary directory: one assignment whose two answer cells each have a test cell
with hidden tests.  Four students submit: a correct answer, an endless loop that ignores Ctrl-C, a memory bomb
and a cell that ends its own process (on ipykernel that kills the kernel and nbgrader drops the whole submission).
The real ``nbgrader generate_assignment`` and ``nbgrader autograde`` run; the gradebook and the autograded
notebooks are then read back with nbgrader's own API.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from cellbox.sandbox.limits import format_size, format_time
from conftest import missing
from kernelkit import without_notes

pytestmark = pytest.mark.slow

WALL = 3.0  # cellbox's wall-clock limit per cell in the course's nbgrader_config.py, seconds
MEMORY = 256 * 2**20  # its address-space limit per process, bytes
NBGRADER_TIMEOUT = 60  # nbgrader's own per-cell timeout: longer than WALL, so cellbox stops a cell first

SQUARES = "def squares(n):\n    ### BEGIN SOLUTION\n    return [i * i for i in range(1, n + 1)]\n    ### END SOLUTION\n"
TEST_SQUARES = (
    "assert squares(3) == [1, 4, 9]\n### BEGIN HIDDEN TESTS\nassert squares(10)[-1] == 100\n### END HIDDEN TESTS\n"
)
DOUBLE = "def double(x):\n    ### BEGIN SOLUTION\n    return 2 * x\n    ### END SOLUTION\n"
TEST_DOUBLE = "assert double(4) == 8\n### BEGIN HIDDEN TESTS\nassert double(-1) == -2\n### END HIDDEN TESTS\n"
POINTS = {"test_squares": 2.0, "test_double": 1.0}

GOOD_SQUARES = "def squares(n):\n    return [i * i for i in range(1, n + 1)]\n"
GOOD_DOUBLE = "def double(x):\n    return x + x\n"
THREADED_SQUARES = (
    "import threading, time\nfrom concurrent.futures import ThreadPoolExecutor\nworkers = ThreadPoolExecutor(2)\n"
    "def squares(n):\n    threading.Thread(target=time.sleep, args=(30,)).start()\n"
    "    return list(workers.map(lambda i: i * i, range(1, n + 1)))\n"
)
SUBMISSIONS = {
    "ada": {"squares": GOOD_SQUARES, "double": GOOD_DOUBLE},
    # Defines the function, then spins with Ctrl-C ignored, so an interrupt alone cannot stop it.
    "bob": {
        "squares": GOOD_SQUARES
        + "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True:\n    pass\n",
        "double": GOOD_DOUBLE,
    },
    # The bomb goes off in the test cell, when the hidden test calls the function.
    "cy": {
        "squares": "def squares(n):\n    hoard = []\n    while True:\n        hoard.append(bytearray(10**7))\n",
        "double": GOOD_DOUBLE,
    },
    "dee": {"squares": GOOD_SQUARES + "import os\nos._exit(0)\n", "double": GOOD_DOUBLE},
    # Correct, with a thread pool whose threads outlive the test cell and a reporter thread left running:
    # cellbox's note about them must not cost points (nbgrader scores any stderr zero).
    "eve": {"squares": THREADED_SQUARES, "double": GOOD_DOUBLE},
}
# The submissions graded on ipykernel too: a correct answer scores the same on both kernels.
ON_BOTH = ("ada", "eve")
IPYKERNEL_CONFIG = f"""\
c = get_config()
c.CourseDirectory.course_id = "demo"
c.Execute.kernel_name = "python3"
c.Execute.timeout = {NBGRADER_TIMEOUT}
"""
CONFIG = f"""\
c = get_config()
c.CourseDirectory.course_id = "demo"
# Every notebook runs on the cellbox kernel, whatever kernel its metadata names.
c.Execute.kernel_name = "cellbox"
# cellbox's limits for every cell, as --CellboxKernel.NAME=VALUE arguments of the kernel.
c.Execute.extra_arguments = ["--CellboxKernel.wall_time={WALL:g}", "--CellboxKernel.memory={format_size(MEMORY)}"]
c.Execute.timeout = {NBGRADER_TIMEOUT}
"""


def _nbgrader_meta(grade_id: str, **fields: Any) -> dict[str, Any]:
    meta = {"schema_version": 3, "grade_id": grade_id, "solution": False, "grade": False, "locked": False}
    return {"nbgrader": {**meta, **fields}}


def _source_notebook() -> nbformat.NotebookNode:
    nb = new_notebook()
    # The instructor's notebook names ipykernel's spec: the configuration alone moves grading onto cellbox.
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [
        new_markdown_cell("Write `squares(n)` and `double(x)`.", metadata=_nbgrader_meta("intro", locked=True)),
        new_code_cell(SQUARES, metadata=_nbgrader_meta("squares", solution=True)),
        new_code_cell(TEST_SQUARES, metadata=_nbgrader_meta("test_squares", grade=True, locked=True, points=2)),
        new_code_cell(DOUBLE, metadata=_nbgrader_meta("double", solution=True)),
        new_code_cell(TEST_DOUBLE, metadata=_nbgrader_meta("test_double", grade=True, locked=True, points=1)),
    ]
    return nb


def _nbgrader(course: Path, *args: str) -> subprocess.CompletedProcess[str]:
    # nbgrader runs `alembic` from PATH, and its kernels come from this environment's share/jupyter.
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    env["HOME"] = str(course.parent / "home")  # no ~/.jupyter of the person running the tests
    return subprocess.run(
        [sys.executable, "-m", "nbgrader", *args],
        cwd=course,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


@dataclass
class Course:
    root: Path
    autograde: subprocess.CompletedProcess[str]
    seconds: float

    def scores(self, student: str) -> dict[str, float | None]:
        """The auto score of each test cell of ``student``, from nbgrader's gradebook."""
        from nbgrader.api import Gradebook

        with Gradebook(f"sqlite:///{self.root / 'gradebook.db'}") as gradebook:
            graded = gradebook.find_submission_notebook("ps1", "ps1", student)
            return {grade.name: grade.auto_score for grade in graded.grades}

    def cell(self, student: str, grade_id: str) -> nbformat.NotebookNode:
        nb = nbformat.read(self.root / "autograded" / student / "ps1" / "ps1.ipynb", as_version=4)
        [cell] = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id]
        return cell


@pytest.fixture(scope="module")
def course(tmp_path_factory: pytest.TempPathFactory) -> Course:
    return _graded_course(tmp_path_factory.mktemp("nbgrader") / "course", CONFIG, SUBMISSIONS)


@pytest.fixture(scope="module")
def ipykernel_course(tmp_path_factory: pytest.TempPathFactory) -> Course:
    """The same course graded on ipykernel, with the submissions that must score the same on both kernels."""
    on_both = {student: SUBMISSIONS[student] for student in ON_BOTH}
    return _graded_course(tmp_path_factory.mktemp("nbgrader-ipykernel") / "course", IPYKERNEL_CONFIG, on_both)


def _graded_course(root: Path, config: str, submissions: dict[str, dict[str, str]]) -> Course:
    """Generate the assignment in ``root``, submit ``submissions`` and autograde them with ``config``."""
    if importlib.util.find_spec("nbgrader") is None:
        missing("nbgrader is not installed", "pip install -e '.[test]'")
    (root / "source" / "ps1").mkdir(parents=True)
    (root.parent / "home").mkdir()
    nbformat.write(_source_notebook(), root / "source" / "ps1" / "ps1.ipynb")
    (root / "nbgrader_config.py").write_text(config)
    generated = _nbgrader(root, "generate_assignment", "ps1")
    assert generated.returncode == 0, generated.stderr
    released = nbformat.read(root / "release" / "ps1" / "ps1.ipynb", as_version=4)
    assert "100" not in "".join(c.source for c in released.cells), "hidden tests were released"
    for student, answers in submissions.items():
        nb = nbformat.from_dict(released)
        for cell in nb.cells:
            grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
            cell.source = answers.get(grade_id, cell.source)
        (root / "submitted" / student / "ps1").mkdir(parents=True)
        nbformat.write(nb, root / "submitted" / student / "ps1" / "ps1.ipynb")
    started = time.monotonic()
    autograde = _nbgrader(root, "autograde", "ps1")
    return Course(root, autograde, time.monotonic() - started)


def test_autograde_grades_every_submission(course: Course) -> None:
    assert course.autograde.returncode == 0, course.autograde.stderr[-3000:]
    assert "ERROR" not in course.autograde.stderr
    for student in SUBMISSIONS:
        assert (course.root / "autograded" / student / "ps1" / "ps1.ipynb").is_file()
    # Each runaway cell cost its wall limit at most, never nbgrader's own timeout.
    assert course.seconds < NBGRADER_TIMEOUT


def test_correct_submission_gets_full_marks(course: Course) -> None:
    assert course.scores("ada") == POINTS


def test_correct_submission_has_no_stderr_for_nbgrader_to_read_as_a_failure(course: Course) -> None:
    # nbgrader scores a test cell zero for any stderr output, so the kernel must write none of its own.
    for grade_id in ("squares", "test_squares", "double", "test_double"):
        outputs = course.cell("ada", grade_id).outputs
        assert [o for o in outputs if o.output_type == "error" or o.get("name") == "stderr"] == []


def test_correct_answer_leaving_threads_scores_as_on_ipykernel_and_its_note_is_not_stderr(
    course: Course, ipykernel_course: Course
) -> None:
    from cellbox.kernel.kernel import NOTE_MIMETYPE

    assert ipykernel_course.autograde.returncode == 0, ipykernel_course.autograde.stderr[-3000:]
    for student in ON_BOTH:
        assert course.scores(student) == ipykernel_course.scores(student) == POINTS, student
    outputs = course.cell("eve", "test_squares").outputs
    assert [o for o in outputs if o.output_type == "error" or o.get("name") == "stderr"] == []
    # The thread note; a normal user's first cell also has one saying the session's memory is unbounded.
    [note] = [o for o in outputs if o.output_type == "display_data" and "threads" in o.data["text/plain"]]
    assert note.data[NOTE_MIMETYPE]["text"] == note.data["text/plain"]
    # Two calls, two reporter threads; the pool's idle threads are not named (the next cell starts new ones).
    assert note.data["text/plain"] == "cellbox: 2 threads were still running when the cell ended, and stopped with it"


def test_endless_loop_ignoring_ctrl_c_is_stopped_at_the_wall_limit_and_the_rest_is_graded(course: Course) -> None:
    [error] = without_notes(course.cell("bob", "squares").outputs)
    assert (error.output_type, error.ename) == ("error", "CellTimeoutError")
    assert error.evalue.startswith(f"the cell ran past its {format_time(WALL)} wall-clock limit; ")
    # The stopped cell's state was discarded, so its test fails; the next answer is graded as usual.
    [missing_name] = without_notes(course.cell("bob", "test_squares").outputs)
    assert (missing_name.ename, missing_name.evalue) == ("NameError", "name 'squares' is not defined")
    assert course.scores("bob") == {"test_squares": 0.0, "test_double": 1.0}


def test_memory_bomb_is_stopped_at_the_memory_limit_and_the_rest_is_graded(course: Course) -> None:
    [error] = without_notes(course.cell("cy", "test_squares").outputs)
    assert (error.output_type, error.ename) == ("error", "CellMemoryLimitError")
    assert error.evalue.startswith(f"the cell asked for more memory than its {format_size(MEMORY)} limit allows")
    assert course.scores("cy") == {"test_squares": 0.0, "test_double": 1.0}


def test_cell_that_ends_its_process_is_graded_zero_not_dropped(course: Course) -> None:
    [error] = without_notes(course.cell("dee", "squares").outputs)
    assert (error.ename, error.evalue) == (
        "CellExitedError",
        "the cell's process ended with exit status 0 before the cell finished",
    )
    assert course.scores("dee") == {"test_squares": 0.0, "test_double": 1.0}
