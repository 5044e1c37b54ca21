"""A run's task directory is thrown away, and the kernel writes its cell specs, without following what a program left.

A program owns its task directory (HOME and TMPDIR point there) and may put symlinks in it; the caller (root, or
the user, outside every sandbox) then removes it, and the kernel writes each cell's spec in its tmp/. Neither may
change, create or remove anything through such a link.
"""

from __future__ import annotations

import json
import os
import stat
import sys
import tempfile
import time
from pathlib import Path

import pytest

from cellbox.sandbox import run
from cellbox.sandbox.environment import open_up
from cellbox.sandbox.isolation import Isolation
from cellbox.sandbox.limits import Limits
from kernelkit import execute, running_kernel

LIMITS = Limits(wall_time=20, cpu_time=10)


PLANT_IN_HOME = """
import os, sys
os.symlink(sys.argv[1], os.path.join(os.environ["HOME"], "link"))
os.makedirs(os.path.join(os.environ["HOME"], "closed", "inner"))
os.symlink(sys.argv[1], os.path.join(os.environ["HOME"], "closed", "inner", "link"))
os.chmod(os.path.join(os.environ["HOME"], "closed", "inner"), 0)
os.chmod(os.path.join(os.environ["HOME"], "closed"), 0)
print("planted")
"""


@pytest.mark.parametrize("isolation", ["none", "auto", "keep-root"])
def test_a_run_cannot_make_its_caller_chmod_a_folder_through_a_link(victim: Path, isolation: str) -> None:
    chosen = Isolation.auto(keep_root=True) if isolation == "keep-root" else isolation
    with tempfile.TemporaryDirectory() as work:
        os.chmod(work, 0o777)  # as root, `auto` alone runs the program as nobody
        outcome = run([sys.executable, "-c", PLANT_IN_HOME, str(victim)], isolation=chosen, cwd=work, limits=LIMITS)
    assert outcome.stdout == "planted\n", outcome.stderr
    assert stat.S_IMODE(victim.stat().st_mode) == 0o755
    assert sorted(entry.name for entry in victim.iterdir()) == ["secret"]


def test_open_up_opens_closed_folders_and_leaves_links_alone(victim: Path, tmp_path: Path) -> None:
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "link").symlink_to(victim)
    (tmp_path / "a" / "b").chmod(0)
    (tmp_path / "a").chmod(0)
    open_up(tmp_path)
    assert stat.S_IMODE((tmp_path / "a").stat().st_mode) == 0o700
    assert stat.S_IMODE((tmp_path / "a" / "b").stat().st_mode) == 0o700
    assert stat.S_IMODE(victim.stat().st_mode) == 0o755


def test_a_cell_cannot_make_the_kernel_chmod_a_folder_through_a_link(victim: Path, tmp_path: Path) -> None:
    with running_kernel("cellbox", cwd=str(tmp_path)) as (_km, kc):
        reply = execute(kc, f"import os; os.symlink({str(victim)!r}, os.environ['HOME'] + '/link'); print('planted')")
        assert reply.stream() == "planted\n", reply.traceback
    assert stat.S_IMODE(victim.stat().st_mode) == 0o755


SWAP_TMPDIR = """
import os, shutil
shutil.rmtree(os.environ["TMPDIR"])
os.symlink({target!r}, os.environ["TMPDIR"])
print("planted")
"""

SWAP_WHILE_RUNNING = """
import os
tmp = os.environ["TMPDIR"]
os.rename(tmp, tmp + ".moved")
os.symlink({target!r}, tmp)
print("swapped")
"""


def test_a_cell_cannot_make_the_kernel_write_outside_the_task_directory(victim: Path, tmp_path: Path) -> None:
    before = victim.stat().st_mtime_ns
    time.sleep(0.05)
    with running_kernel("cellbox", cwd=str(tmp_path)) as (_km, kc):
        first = execute(kc, SWAP_TMPDIR.format(target=str(victim)))
        assert first.stream() == "planted\n", first.traceback
        # The kernel puts a real tmp/ back for the next cell's spec, and the cell runs.
        assert execute(kc, "print('next')").stream() == "next\n"
        # A cell that swaps tmp/ for a link while it runs: its spec is removed from where it was written.
        swapped = execute(kc, SWAP_WHILE_RUNNING.format(target=str(victim)))
        assert swapped.stream() == "swapped\n", swapped.traceback
        moved = execute(kc, "import os, json; print(json.dumps(os.listdir(os.environ['TMPDIR'] + '.moved')))")
        assert execute(kc, "print('after')").stream() == "after\n"
    assert [name for name in json.loads(moved.stream()) if name.startswith("cellbox-cell-")] == []
    assert sorted(entry.name for entry in victim.iterdir()) == ["secret"]
    assert victim.stat().st_mtime_ns == before


PLANTING_SUBMISSION = """
import os
os.symlink({target!r}, os.path.join(os.environ["HOME"], "link"))


def add(a, b):
    return a + b
"""


def test_a_submission_cannot_make_the_grader_chmod_a_folder_through_a_link(victim: Path, tmp_path: Path) -> None:
    from cellbox.cli import main

    (tmp_path / "subs").mkdir()
    (tmp_path / "tests").mkdir()
    (tmp_path / "subs" / "planter.py").write_text(PLANTING_SUBMISSION.format(target=str(victim)))
    (tmp_path / "tests" / "test_add.py").write_text(
        "import submission\n\n\ndef test_add():\n    assert submission.add(1, 2) == 3\n"
    )
    status = main(["grade", str(tmp_path / "subs"), "--tests", str(tmp_path / "tests"), "--out", str(tmp_path / "out")])
    assert status == 0
    assert "planter,verified" in (tmp_path / "out" / "grades.csv").read_text()
    assert stat.S_IMODE(victim.stat().st_mode) == 0o755
