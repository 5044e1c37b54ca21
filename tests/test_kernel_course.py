"""A notebook reads the files of its course: the tree above its folder is readable, its own folder writable.

A course cloned into the home, as a student does (``~/.../course/.git``, ``course/data.csv``,
``course/assets/x.txt``, the notebook in ``course/lesson/``), run by a real kernel through jupyter_client
whose connection file lies in the course folder itself: cells read ``../data.csv`` and
``../../course/assets/x.txt``, cannot write to ``..``, and still cannot read the home outside the course
nor the connection file.  The finding and refusing of course roots is tested without a kernel.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cellbox.sandbox.course import CourseRootError, check_course_root, find_course_root
from cellbox.sandbox.isolation import Isolation, landlock_rules, make_plan, probe
from conftest import missing
from kernelkit import TIMEOUT, execute, kernel_manager

DATA = "name,score\nAda,90\n"
ASSET = "an asset of the course\n"
SECRET = "hunter2\n"


def _read(path: str) -> str:
    return (
        f"try:\n    print(repr(open({path!r}).read()))\nexcept OSError as exc:\n"
        "    print('unreadable', type(exc).__name__)"
    )


@pytest.fixture(scope="module")
def course() -> Iterator[Path]:
    """``~/.cellbox-test-course-HEX/course`` with .git, data.csv, assets/x.txt and lesson/; a secret beside it."""
    top = Path.home() / f".cellbox-test-course-{uuid.uuid4().hex}"
    root = top / "course"
    (root / ".git").mkdir(parents=True)
    (root / "assets").mkdir()
    (root / "lesson").mkdir()
    (root / "data.csv").write_text(DATA)
    (root / "assets" / "x.txt").write_text(ASSET)
    (top / "secret.txt").write_text(SECRET)
    try:
        yield root
    finally:
        shutil.rmtree(top)


@pytest.fixture(scope="module")
def kernel(course: Path) -> Iterator[tuple[Any, Any]]:
    """A cellbox kernel in ``course/lesson`` whose connection file is ``course/kernel-HEX.json``."""
    support = probe()
    if not (support.available("fs") or support.available("landlock")):
        missing("neither the fs layer nor Landlock works here", "apt-get install bubblewrap; see `cellbox doctor`")
    km = kernel_manager(connection_file=str(course / f"kernel-{uuid.uuid4().hex}.json"))
    km.start_kernel(cwd=str(course / "lesson"))
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=TIMEOUT)
        yield km, kc
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=False)


def test_a_cell_reads_the_course_files_beside_its_folder(kernel: tuple[Any, Any]) -> None:
    _km, kc = kernel
    assert execute(kc, _read("../data.csv")).stream() == f"{DATA!r}\n"
    assert execute(kc, _read("../../course/assets/x.txt")).stream() == f"{ASSET!r}\n"
    assert execute(kc, "import os\nsorted(os.listdir('../assets'))").of("execute_result")[0]["data"] == {
        "text/plain": "['x.txt']"
    }


def test_a_cell_cannot_write_above_its_folder_but_writes_in_it(kernel: tuple[Any, Any], course: Path) -> None:
    _km, kc = kernel
    result = execute(kc, "open('../written.txt', 'w').write('x')")
    assert result.content["ename"] in ("OSError", "PermissionError")  # EROFS in the view, EACCES under Landlock
    assert not (course / "written.txt").exists()
    result = execute(kc, "import os\nos.remove('../data.csv')")
    assert result.status == "error" and (course / "data.csv").read_text() == DATA
    assert execute(kc, "open('notes.txt', 'w').write('mine')").status == "ok"
    assert (course / "lesson" / "notes.txt").read_text() == "mine"


def test_the_home_outside_the_course_stays_hidden(kernel: tuple[Any, Any], course: Path) -> None:
    _km, kc = kernel
    secret = course.parent / "secret.txt"
    for path in (str(secret), "../../secret.txt"):
        result = execute(kc, _read(path))
        assert result.stream().startswith("unreadable "), path
    assert secret.read_text() == SECRET  # the file is there: only the cell's view lacks it


def test_the_kernels_connection_file_in_the_course_stays_hidden(kernel: tuple[Any, Any]) -> None:
    km, kc = kernel
    key = km.session.key.decode()
    assert key and key in Path(km.connection_file).read_text()
    name = os.path.basename(km.connection_file)
    for path in (km.connection_file, f"../{name}"):
        out = execute(kc, _read(path)).stream()
        assert out in ("''\n", "unreadable FileNotFoundError\n", "unreadable PermissionError\n"), out
        assert key not in out


# --------------------------------------------------------------------------- finding the course root


def test_the_nearest_repository_is_the_course_root_before_a_project_file(tmp_path: Path) -> None:
    lesson = tmp_path / "course" / "unit" / "lesson"
    lesson.mkdir(parents=True)
    (tmp_path / "course" / ".git").mkdir()
    (tmp_path / "course" / "unit" / "requirements.txt").write_text("numpy\n")
    assert find_course_root(str(lesson)) == os.path.realpath(tmp_path / "course")
    shutil.rmtree(tmp_path / "course" / ".git")
    assert find_course_root(str(lesson)) == os.path.realpath(tmp_path / "course" / "unit")
    os.remove(tmp_path / "course" / "unit" / "requirements.txt")
    assert find_course_root(str(lesson)) == os.path.realpath(lesson)  # nothing found: the notebook folder alone


def test_the_search_never_reaches_the_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home"
    lesson = home / "lesson"
    lesson.mkdir(parents=True)
    (home / ".git").mkdir()  # dotfiles kept in git: the whole home is still no course
    monkeypatch.setenv("HOME", str(home))
    assert find_course_root(str(lesson)) == os.path.realpath(lesson)


def test_a_submission_in_an_nbgrader_course_gets_no_tree_above_its_folder(tmp_path: Path) -> None:
    # nbgrader autograde runs a submission in autograded/STUDENT/ASSIGNMENT/ of the course directory, whose
    # tree holds every student's work and the gradebook: a .git kept there must not open it to the submission.
    course = tmp_path / "course"
    (course / ".git").mkdir(parents=True)
    (course / "nbgrader_config.py").write_text("c = get_config()\n")
    graded = course / "autograded" / "ada" / "ps1"
    graded.mkdir(parents=True)
    assert find_course_root(str(graded)) == os.path.realpath(graded)
    (course / "autograded" / "ada" / "requirements.txt").write_text("numpy\n")  # the student's own folder: fine
    assert find_course_root(str(graded)) == os.path.realpath(course / "autograded" / "ada")


@pytest.mark.parametrize("which", ["/", "home", "home's parent", "temporary"])
def test_a_course_root_that_would_show_a_home_or_the_machine_is_refused(which: str) -> None:
    path = {
        "/": "/",
        "home": str(Path.home()),
        "home's parent": str(Path.home().parent),
        "temporary": tempfile.gettempdir(),
    }[which]
    with pytest.raises(CourseRootError, match=r"^CellboxKernel.course_root: .* cannot be a course root: it is "):
        check_course_root(path, source="CellboxKernel.course_root")


def test_a_relative_course_root_is_refused() -> None:
    with pytest.raises(CourseRootError, match="is not an absolute path; give the course folder's full path"):
        check_course_root("../course")


def test_landlock_reads_the_course_around_a_hidden_file(tmp_path: Path) -> None:
    root = tmp_path / "course"
    (root / "lesson").mkdir(parents=True)
    (root / "data.csv").write_text(DATA)
    secret = root / "kernel-1.json"
    secret.write_text("{}")
    isolation = Isolation.auto(read_only=(str(root),), hidden=(str(secret),))
    plan = make_plan(isolation, probe(), user=None)
    rules = landlock_rules(isolation, plan, programs=[], cwd=str(root / "lesson"), task=str(tmp_path), path="")
    read = rules["read"]
    assert isinstance(read, list)
    assert str(secret) not in read and str(root) not in read
    assert {str(root / "data.csv"), str(root / "lesson")} <= set(read)


def test_the_course_root_is_found_once_for_the_session(tmp_path: Path) -> None:
    """A ``.git`` made after the kernel started (by a cell, or anyone) changes no later cell's view."""
    from cellbox.kernel.kernel import CellboxKernel

    lesson = tmp_path / "course" / "lesson"
    lesson.mkdir(parents=True)

    class Kernel:
        _isolation_found = None
        isolation, network, course_root, notebook_dir, parent = "auto", False, "", str(lesson), None
        course_tree = CellboxKernel.course_tree
        _find_cell_isolation = CellboxKernel._find_cell_isolation

    kernel = Kernel()
    first = CellboxKernel.cell_isolation(kernel)  # type: ignore[arg-type]
    assert str(tmp_path / "course") not in first.read_only  # nothing above the lesson folder marks a course
    (tmp_path / "course" / ".git").mkdir()
    assert find_course_root(str(lesson)) == os.path.realpath(tmp_path / "course")  # found now, if looked for
    later = CellboxKernel.cell_isolation(kernel)  # type: ignore[arg-type]
    assert later == first and os.path.realpath(tmp_path / "course") not in later.read_only
