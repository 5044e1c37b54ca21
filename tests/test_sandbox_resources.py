"""Disk and resident memory: a run that writes too much in total, or touches more memory than it may.

Each test runs a real child.  The disk limit is a size-capped tmpfs over the
task directory, which needs bubblewrap's fs layer; the resident limit is a
memory cgroup, which needs one this process may write (root, as in CI).
Where the machine lacks either, the test checks the note that says so.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from cellbox.cli import main
from cellbox.sandbox import run
from cellbox.sandbox.cgroups import MemoryCgroup, memory_cgroup_root
from cellbox.sandbox.environment import TaskDirectory
from cellbox.sandbox.isolation import probe
from cellbox.sandbox.limits import Limits
from cellbox.sandbox.outcome import Status
from test_isolation import require_layers

MiB = 1024**2

# 20 files of 60 MiB each (1,200 MiB) in the working directory, each under the 64M file size limit.
TWENTY_FILES = """
chunk = b"x" * (60 * 1024**2)
for i in range(20):
    with open(f"f{i}", "wb") as f:
        f.write(chunk)
    print("wrote", i)
"""
DISK = Limits(wall_time=30, disk=256 * MiB, file_size=64 * MiB)


def test_writing_past_the_disk_limit_stops_the_run_with_a_note() -> None:
    require_layers("fs")
    if not probe().tmpfs_size:
        pytest.skip("this bwrap has no --size (bubblewrap 0.7 or later)")
    outcome = run([sys.executable, "-c", TWENTY_FILES], limits=DISK, isolation="auto")
    assert outcome.status is Status.ERROR
    assert outcome.stdout == "".join(f"wrote {i}\n" for i in range(4))  # 4 x 60 MiB fit in 256 MiB
    assert outcome.stderr.rstrip().endswith("OSError: [Errno 28] No space left on device")
    assert (
        "disk: the run filled its task directory's limit of 256M; writes past it failed with ENOSPC "
        "(No space left on device)"
    ) in outcome.notes
    assert "disk-tmpfs" in outcome.isolation


def test_disk_limit_covers_home_and_tmpdir_too() -> None:
    require_layers("fs")
    code = TWENTY_FILES.replace('open(f"f{i}"', 'open(os.path.join(os.environ["TMPDIR"], f"f{i}")')
    outcome = run([sys.executable, "-c", "import os\n" + code], limits=DISK, isolation="auto")
    assert outcome.status is Status.ERROR
    assert outcome.stdout.count("wrote") == 4


def test_under_the_disk_limit_nothing_is_said() -> None:
    require_layers("fs")
    code = TWENTY_FILES.replace("range(20)", "range(2)")
    outcome = run([sys.executable, "-c", code], limits=DISK, isolation="auto")
    assert outcome.status is Status.OK, outcome.stderr
    assert not [note for note in outcome.notes if note.startswith("disk:")]


def test_without_the_fs_layer_the_disk_note_says_only_files_are_capped() -> None:
    code = TWENTY_FILES.replace("range(20)", "range(1)")
    outcome = run([sys.executable, "-c", code], limits=DISK, isolation="none")
    assert outcome.status is Status.OK, outcome.stderr
    assert (
        "disk: the total written is not capped (a size-capped tmpfs needs the fs layer: isolation auto with "
        "bubblewrap 0.7 or later); file_size caps each file at 64M"
    ) in outcome.notes


def test_a_task_directory_the_caller_keeps_is_not_replaced(tmp_path: Path) -> None:
    require_layers("fs")
    with TaskDirectory.create(base=tmp_path) as task:
        task.open_to(os.geteuid(), os.getegid())
        (task.work / "given.txt").write_text("given")
        os.chmod(task.path, 0o755)
        for part in (task.home, task.work, task.tmp):
            os.chmod(part, 0o777)
        outcome = run(["cat", "given.txt"], limits=DISK, isolation="auto", task=task)
    assert outcome.stdout == "given"
    assert outcome.notes[-1].startswith("disk: the total written is not capped (the run writes a task directory")


def test_cellbox_run_disk_flag_caps_the_task_and_names_the_working_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    require_layers("fs")
    code = "import os\n" + TWENTY_FILES.replace('open(f"f{i}"', 'open(os.path.join(os.environ["HOME"], f"f{i}")')
    argv = ["run", "--json", "--cwd", str(tmp_path), "--disk", "256M", "--file-size", "64M"]
    exit_status = main([*argv, "--", sys.executable, "-c", code])
    outcome = json.loads(capsys.readouterr().out)
    assert exit_status == 10 and outcome["status"] == "error"
    assert outcome["stdout"].count("wrote") == 4
    assert outcome["limits"]["disk"] == 256 * MiB
    assert (
        f"disk: the working directory {tmp_path} is outside the task directory: its total is not capped there, "
        "file_size caps each file at 64M"
    ) in outcome["notes"]
    assert list(tmp_path.iterdir()) == []


# --------------------------------------------------------------------------- resident memory

# Reserves 4 GiB of address space and touches only argv[1] MiB of it.
RESERVE_AND_TOUCH = """
import mmap, sys
reserved = mmap.mmap(-1, 4 * 1024**3, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
for offset in range(0, int(sys.argv[1]) * 1024**2, 4096):
    reserved[offset] = 1
print("touched", sys.argv[1])
"""
RESIDENT = Limits(wall_time=30, memory=None, resident=100 * MiB)


def require_memory_cgroup() -> None:
    if memory_cgroup_root() is None:
        pytest.skip("no writable memory cgroup here (needs root, or a delegated cgroup v2 subtree)")


@pytest.mark.parametrize("isolation", ["none", "auto"])
def test_reserving_much_and_touching_little_passes_under_a_resident_limit(isolation: str) -> None:
    require_memory_cgroup()
    outcome = run([sys.executable, "-c", RESERVE_AND_TOUCH, "50"], limits=RESIDENT, isolation=isolation)
    assert outcome.status is Status.OK, outcome.stderr
    assert outcome.stdout == "touched 50\n"
    assert "memory-cgroup" in outcome.isolation
    assert outcome.notes == () or not [n for n in outcome.notes if n.startswith("resident:")]


@pytest.mark.parametrize("isolation", ["none", "auto"])
def test_touching_past_the_resident_limit_is_memory_limit(isolation: str) -> None:
    require_memory_cgroup()
    outcome = run([sys.executable, "-c", RESERVE_AND_TOUCH, "300"], limits=RESIDENT, isolation=isolation)
    assert outcome.status is Status.MEMORY_LIMIT
    assert outcome.signal == "SIGKILL"
    assert outcome.stdout == ""
    assert (
        "resident: the run reached its resident memory limit of 100M (memory cgroup) and the kernel killed a "
        "process of it"
    ) in outcome.notes


def test_without_a_writable_memory_cgroup_the_resident_limit_is_a_note(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("cellbox.sandbox.confinement.memory_cgroup_root", lambda: None)
    outcome = run([sys.executable, "-c", RESERVE_AND_TOUCH, "10"], limits=RESIDENT, isolation="none")
    assert outcome.status is Status.OK
    assert "memory-cgroup" not in outcome.isolation
    assert outcome.notes[0].startswith("resident: not applied (no writable memory cgroup here")


@pytest.mark.parametrize(
    ("v2", "stat", "usage_file"),
    [
        (
            False,
            "cache 900\nrss 7\nshmem 5\ntotal_cache 4000\ntotal_rss 300\ntotal_shmem 200\n",
            "memory.usage_in_bytes",
        ),
        (True, "anon 300\nfile 4000\nshmem 200\nfile_mapped 60\n", "memory.current"),
    ],
)
def test_a_cgroups_held_memory_is_its_anonymous_and_shared_pages_without_the_page_cache(
    tmp_path: Path, v2: bool, stat: str, usage_file: str
) -> None:
    # A cgroup's files as v1 (hierarchical totals) and v2 give them: page cache, which the kernel reclaims at the cap,
    # does not count as held.
    (tmp_path / "memory.stat").write_text(stat)
    cgroup = object.__new__(MemoryCgroup)
    cgroup.path, cgroup.v2 = tmp_path, v2
    assert cgroup.held() == 500
    (tmp_path / usage_file).write_text("4500\n")
    assert cgroup.held_over(499) == 500
    assert cgroup.held_over(500) is None  # usage is over, what is held is not
    (tmp_path / usage_file).write_text("450\n")
    (tmp_path / "memory.stat").unlink()  # not read: the usage alone shows nothing is over
    assert cgroup.held_over(450) is None and cgroup.held() == 0


def test_cellbox_run_resident_flag(capsys: pytest.CaptureFixture[str]) -> None:
    require_memory_cgroup()
    argv = ["run", "--json", "--memory", "none", "--resident", "100M", "--", sys.executable, "-c", RESERVE_AND_TOUCH]
    code = main([*argv, "300"])
    outcome = json.loads(capsys.readouterr().out)
    assert code == 14 and outcome["status"] == "memory_limit"
    assert outcome["limits"]["resident"] == 100 * MiB


# --------------------------------------------------------------------------- memory outside RLIMIT_AS

# Holds argv[1] memfds of 64 MiB each (each under file_size), written, so they are memory: RLIMIT_AS never sees them.
MEMFD_FILLER = """
import os, sys
chunk = b"x" * (1 << 20)
fds = []
for i in range(int(sys.argv[1])):
    fd = os.memfd_create(f"fill{i}")
    for _ in range(64):
        os.write(fd, chunk)
    fds.append(fd)
    print("held", (i + 1) * 64, flush=True)
"""


def test_memfds_past_the_runs_memory_bound_end_memory_limit(capsys: pytest.CaptureFixture[str]) -> None:
    require_memory_cgroup()
    # 1.5 GiB of memfds under --memory 256M: the run's bound is 256M + 2 x 512M of tmpfs = 1.25 GiB.
    exit_status = main(["run", "--json", "--memory", "256M", "--", sys.executable, "-c", MEMFD_FILLER, "24"])
    outcome = json.loads(capsys.readouterr().out)
    bound = Limits(memory=256 * MiB).memory_bound()
    assert bound == 256 * MiB + 2 * Limits().shared_memory
    assert exit_status == 14 and outcome["status"] == "memory_limit" and outcome["signal"] == "SIGKILL"
    held = int(outcome["stdout"].split()[-1]) * MiB
    assert bound - 128 * MiB <= held < bound
    # The cgroup's peak, not one process's max RSS (about 20M here): what the run really held.
    assert held <= outcome["peak_memory"] <= bound
    assert "memory-cgroup" in outcome["isolation"]
    assert (
        "memory: the run reached its memory bound of 1.2G (its processes, /tmp, /dev/shm and memfds together, a "
        "memory cgroup) and the kernel killed a process of it; --resident raises it"
    ) in outcome["notes"]


def test_memfds_under_the_bound_count_in_peak_memory() -> None:
    require_memory_cgroup()
    outcome = run([sys.executable, "-c", MEMFD_FILLER, "4"], limits=Limits(memory=256 * MiB))
    assert outcome.status is Status.OK, outcome.stderr
    assert outcome.stdout.split()[-1] == "256"
    assert outcome.peak_memory >= 256 * MiB


TMP_FILLER = """
import errno
chunk = b"x" * (1 << 20)
n = 0
try:
    for i in range(20):
        with open(f"/tmp/f{i}", "wb") as f:
            for _ in range(100):
                f.write(chunk)
                n += 1
except OSError as e:
    print(errno.errorcode[e.errno], n)
"""


def test_filling_tmp_stops_at_shared_memory_with_enospc_and_counts_as_memory() -> None:
    require_layers("fs")
    if not probe().tmpfs_size:
        pytest.skip("this bwrap has no --size (bubblewrap 0.7 or later)")
    limits = Limits(shared_memory=300 * MiB)
    outcome = run([sys.executable, "-c", TMP_FILLER], limits=limits, isolation="auto")
    assert outcome.status is Status.OK, outcome.stderr
    error, written = outcome.stdout.split()
    assert error == "ENOSPC" and 298 <= int(written) <= 300
    if memory_cgroup_root() is not None:
        assert outcome.peak_memory >= 298 * MiB  # tmpfs pages are charged to the run's memory cgroup


SEGMENT = """
from multiprocessing import shared_memory
s = shared_memory.SharedMemory(create=True, size=160 * 1024**2)
s.buf[-1] = 7
print(len(s.buf), s.buf[-1])
s.close()
s.unlink()
"""


@pytest.mark.parametrize("isolation", ["none", "auto"])
def test_a_160_mib_shared_memory_segment_works_at_the_default_limits(isolation: str) -> None:
    outcome = run([sys.executable, "-c", SEGMENT], isolation=isolation)
    assert outcome.status is Status.OK, outcome.stderr
    assert outcome.stdout == f"{160 * MiB} 7\n"


def test_dev_shm_is_a_tmpfs_of_shared_memory_not_of_file_size() -> None:
    require_layers("fs")
    if not probe().tmpfs_size:
        pytest.skip("this bwrap has no --size (bubblewrap 0.7 or later)")
    code = "import os\nfor p in ('/tmp', '/dev/shm'):\n    v = os.statvfs(p); print(v.f_blocks * v.f_frsize)"
    outcome = run(
        [sys.executable, "-c", code], limits=Limits(file_size=8 * MiB, shared_memory=200 * MiB), isolation="auto"
    )
    assert outcome.stdout.split() == [str(200 * MiB), str(200 * MiB)]
