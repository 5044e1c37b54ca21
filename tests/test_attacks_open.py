"""Attacks that still break a promise of the docs: each test fails (xfail, strict) until the hole is closed.

Each test names the promise it breaks (the doc line) and asserts what the promise says; remove its
``xfail`` mark when the fix lands.  They run as root and as a normal user; where a test needs root it says so.
"""

from __future__ import annotations

import os
import stat
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cellbox.sandbox import run
from cellbox.sandbox.isolation import Isolation
from cellbox.sandbox.limits import Limits
from kernelkit import execute, running_kernel

LIMITS = Limits(wall_time=20, cpu_time=10)


@pytest.fixture
def victim() -> Iterator[Path]:
    """A directory of this test's user outside every run (mode 0o755), with a file in it (mode 0o600)."""
    folder = Path(tempfile.mkdtemp(prefix="cellbox-victim-", dir="/var/tmp"))
    folder.chmod(0o755)
    (folder / "secret").write_text("secret\n")
    (folder / "secret").chmod(0o600)
    try:
        yield folder
    finally:
        folder.chmod(0o700)
        for entry in folder.iterdir():
            entry.unlink()
        folder.rmdir()


# ------------------------------------------------------------------ the task directory's removal follows symlinks

PLANT_IN_HOME = """
import os, sys
os.symlink(sys.argv[1], os.path.join(os.environ["HOME"], "link"))
print("planted")
"""


@pytest.mark.xfail(strict=True, reason="TaskDirectory.remove() chmods 0o700 the target of a symlink a run left")
@pytest.mark.parametrize("isolation", ["none", "auto", "keep-root"])
def test_a_run_cannot_make_its_caller_chmod_a_host_directory(victim: Path, isolation: str) -> None:
    # Promise (docs/run.md): the program "owns root's files ... and nothing more"; (README) "nothing it
    # started stays alive" and the task directory is thrown away.  After the run, the caller's
    # TaskDirectory.remove() walks the task directory and chmods every entry of os.walk's `dirs` (which
    # lists symlinks to directories) with os.chmod, which follows the link: as root, `ln -s / $HOME/x`
    # turns the host's / (or /etc, /usr, /tmp) into mode 0700.
    chosen = Isolation.auto(keep_root=True) if isolation == "keep-root" else isolation
    with tempfile.TemporaryDirectory() as work:
        os.chmod(work, 0o777)  # as root, `auto` alone runs the program as nobody
        outcome = run([sys.executable, "-c", PLANT_IN_HOME, str(victim)], isolation=chosen, cwd=work, limits=LIMITS)
    assert outcome.stdout == "planted\n", outcome.stderr
    assert stat.S_IMODE(victim.stat().st_mode) == 0o755


@pytest.mark.xfail(strict=True, reason="the kernel's task directory removal chmods through a cell's symlink")
def test_a_cell_cannot_make_the_kernel_chmod_a_host_directory(victim: Path, tmp_path: Path) -> None:
    # Promise (docs/kernel.md): a cell sees "nothing of the user's home ... or the kernel process"; the
    # task directory "is removed when the kernel shuts down".  The kernel (root, or the user, outside
    # every sandbox) chmods the symlink's target to 0o700 on shutdown.
    with running_kernel("cellbox", cwd=str(tmp_path)) as (_km, kc):
        reply = execute(kc, f"import os; os.symlink({str(victim)!r}, os.environ['HOME'] + '/link'); print('planted')")
        assert reply.stream() == "planted\n", reply.traceback
    assert stat.S_IMODE(victim.stat().st_mode) == 0o755


# ------------------------------------------------------------------ the kernel writes its cell spec through a symlink

SWAP_TMPDIR = """
import os, shutil
shutil.rmtree(os.environ["TMPDIR"])
os.symlink({target!r}, os.environ["TMPDIR"])
print("planted")
"""


@pytest.mark.xfail(strict=True, reason="the kernel's mkstemp(dir=task.tmp) follows a tmp/ a cell made a symlink")
def test_a_cell_cannot_make_the_kernel_write_outside_the_task_directory(victim: Path, tmp_path: Path) -> None:
    # Promise (kernel.py): "A new file (O_EXCL), never a path a cell could have made a symlink."  A cell
    # replaces the task's tmp/ with a symlink to any host directory; the kernel (root, or the user, outside
    # every sandbox) then writes the next cell's spec there: a 0o644 file holding that cell's code.  As
    # root, with the target /etc (in the view), the next cell swaps tmp/ again while it runs, so the
    # kernel's unlink misses and /etc/cellbox-cell-*.json stays, owned by root.  Here the directory's
    # mtime shows the kernel's create and unlink.
    before = victim.stat().st_mtime_ns
    time.sleep(0.05)
    with running_kernel("cellbox", cwd=str(tmp_path)) as (_km, kc):
        first = execute(kc, SWAP_TMPDIR.format(target=str(victim)))
        assert first.stream() == "planted\n", first.traceback
        execute(kc, "print('next')")
    assert sorted(entry.name for entry in victim.iterdir()) == ["secret"]
    assert victim.stat().st_mtime_ns == before


# ------------------------------------------------------------------ the grader, through a submission's symlink

PLANTING_SUBMISSION = """
import os
os.symlink({target!r}, os.path.join(os.environ["HOME"], "link"))


def add(a, b):
    return a + b
"""


@pytest.mark.xfail(strict=True, reason="the grader's task directory removal chmods through a submission's symlink")
def test_a_submission_cannot_make_the_grader_chmod_a_host_directory(victim: Path, tmp_path: Path) -> None:
    # Promise (docs/grading.md): "Each submission is graded in its own task directory"; the submission
    # "runs in its own sandboxed process (the same limits and isolation as `cellbox run`)".  Its import
    # leaves $HOME/link -> any host directory, and the grader (root in CI) chmods it to 0o700 when it
    # removes the task directory: `-> /` locks every other user out of the machine.
    from cellbox.cli import main

    (tmp_path / "subs").mkdir()
    (tmp_path / "tests").mkdir()
    (tmp_path / "subs" / "evil.py").write_text(PLANTING_SUBMISSION.format(target=str(victim)))
    (tmp_path / "tests" / "test_add.py").write_text(
        "import submission\n\n\ndef test_add():\n    assert submission.add(1, 2) == 3\n"
    )
    status = main(["grade", str(tmp_path / "subs"), "--tests", str(tmp_path / "tests"), "--out", str(tmp_path / "out")])
    assert status == 0
    assert "evil,verified" in (tmp_path / "out" / "grades.csv").read_text()
    assert stat.S_IMODE(victim.stat().st_mode) == 0o755


@pytest.mark.xfail(strict=True, reason="two submission ids that match one student (case, or a Canvas ID) give two rows")
def test_canvas_gradebook_has_one_row_per_student(tmp_path: Path) -> None:
    # Promise (docs/gradebooks.md): "--canvas-roster ... copies each student's Student, ID ... matching the
    # submission's id ... to the student's SIS Login ID, SIS User ID or ID, without regard to case".  A
    # submission named ADA.py (or 101.py, Ada's Canvas ID) is matched to Ada too: canvas.csv then holds two
    # rows for her, 0.00 and 100.00, without a warning, and the import keeps whichever Canvas takes.
    from cellbox.cli import main

    subs, tests = tmp_path / "subs", tmp_path / "tests"
    subs.mkdir()
    tests.mkdir()
    (subs / "ada.py").write_text("def add(a, b):\n    return a + b\n")
    (subs / "ADA.py").write_text("def add(a, b):\n    return 0\n")
    (tests / "test_add.py").write_text("import submission\n\n\ndef test_add():\n    assert submission.add(1, 2) == 3\n")
    roster = tmp_path / "roster.csv"
    roster.write_text(
        'Student,ID,SIS User ID,SIS Login ID,Section,Lab (1)\nPoints Possible,,,,,100\n"Lovelace, Ada",101,S-1,ada,A,\n'
    )
    out = tmp_path / "out"
    argv = ["grade", str(subs), "--tests", str(tests), "--out", str(out), "--format", "canvas"]
    assert main([*argv, "--canvas-roster", str(roster)]) == 0
    rows = (out / "canvas.csv").read_text().splitlines()[2:]
    assert [row for row in rows if row.startswith('"Lovelace, Ada"')] == ['"Lovelace, Ada",101,S-1,ada,A,100.00']
