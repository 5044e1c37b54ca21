"""The kernel's ceiling and the session's memory, through a real kernel.

A ``%%limits`` line may lower any limit and raise one only up to the ceiling an administrator set
(``CellboxKernel.ceiling``); a cell that asks for more runs at the ceiling, told so in one line, and
the limit it really gets (its rlimits, read inside the cell) is the ceiling.  The session's ``/tmp``
and ``/dev/shm`` are tmpfs of the ceiling's ``shared_memory``; writes to shared memory that a stop or
``%undo`` cannot take back are named in the reply.  One kernel serves every test.
"""

from __future__ import annotations

import os
import resource
from collections.abc import Iterator
from pathlib import Path

import pytest
from jupyter_client.blocking.client import BlockingKernelClient

from cellbox.kernel.magics import ceiling_from_text
from cellbox.sandbox.cgroups import UNBOUNDED_MEMORY, memory_cgroup_root
from cellbox.sandbox.limits import DEFAULT_CEILING, Limits
from kernelkit import execute, running_kernel

MiB = 1024**2
CEILING = "wall=60 cpu=60 memory=1G processes=40 open_files=512"
LIMITS = ceiling_from_text(CEILING)
NOTE = "cellbox: note: %%limits asked for more than this kernel's ceiling; the cell runs at the ceiling: "
READ_LIMITS = (
    "import resource\nprint(resource.getrlimit(resource.RLIMIT_AS), resource.getrlimit(resource.RLIMIT_NOFILE))"
)


@pytest.fixture(scope="module")
def notebook_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("ceiling")
    path.chmod(0o777)
    return path


@pytest.fixture(scope="module")
def kc(notebook_dir: Path) -> Iterator[BlockingKernelClient]:
    # The session's own limits lie under the ceiling (they would raise it where higher: both are the administrator's).
    extra = [
        f"--CellboxKernel.ceiling={CEILING}",
        "--CellboxKernel.session_memory=3G",
        "--CellboxKernel.memory=512M",
        "--CellboxKernel.max_processes=20",
    ]
    with running_kernel("cellbox", cwd=str(notebook_dir), extra=extra) as (_km, client):
        first = execute(client, "print('ready')")
        # Where no memory cgroup is writable, the first cell says in one line what is not bounded.
        assert (UNBOUNDED_MEMORY in first.notes) is (memory_cgroup_root() is None)
        yield client


def test_the_default_ceiling_holds_a_student_on_a_shared_server() -> None:
    assert DEFAULT_CEILING.memory is not None and DEFAULT_CEILING.memory <= 4 * 1024**3
    assert 100 <= DEFAULT_CEILING.processes < 1000
    assert DEFAULT_CEILING.shared_memory <= 1024**3
    assert ceiling_from_text("") == DEFAULT_CEILING


@pytest.mark.parametrize(
    ("line", "named", "rlimit", "value"),
    [
        ("memory=none", "memory=1G", "RLIMIT_AS", 1024**3),
        ("memory=100G", "memory=1G", "RLIMIT_AS", 1024**3),
        ("open_files=100000", "open_files=512", "RLIMIT_NOFILE", 512),
    ],
)
def test_raising_an_rlimit_past_the_ceiling_runs_at_the_ceiling(
    kc: BlockingKernelClient, line: str, named: str, rlimit: str, value: int
) -> None:
    result = execute(kc, f"%%limits {line}\nimport resource\nprint(resource.getrlimit(resource.{rlimit}))")
    assert result.status == "ok", result.traceback
    assert result.notes.splitlines() == [f"{NOTE}{named} (an administrator sets it: CellboxKernel.ceiling)"]
    # Soft and hard: the session's hard limits are the ceiling, so the cell cannot raise its own either.
    assert result.stream() == f"({value}, {value})\n"


def test_a_cell_cannot_raise_its_soft_limit_past_the_ceiling_itself(kc: BlockingKernelClient) -> None:
    code = (
        "import resource\n"
        "try:\n    resource.setrlimit(resource.RLIMIT_AS, (2 * 1024**3, 2 * 1024**3))\n"
        "except ValueError as e:\n    print('refused', e)\n"
        "print(resource.getrlimit(resource.RLIMIT_AS))"
    )
    result = execute(kc, "%%limits memory=none\n" + code)
    assert result.stream().splitlines() == ["refused not allowed to raise maximum limit", f"({1024**3}, {1024**3})"]


def test_a_wall_time_past_the_ceiling_is_the_ceilings(kc: BlockingKernelClient) -> None:
    result = execute(kc, "%%limits wall=99999 cpu=99999\n%limits")
    assert result.notes.splitlines() == [
        f"{NOTE}wall_time=60s, cpu_time=60s (an administrator sets it: CellboxKernel.ceiling)"
    ]
    assert result.stream().startswith("wall 60 s, cpu 60 s, memory 512M")
    assert result.metadata["cellbox"]["limits"]["wall_time"] == 60.0


def test_processes_past_the_ceiling_are_refused_at_the_ceiling(kc: BlockingKernelClient) -> None:
    code = (
        "import threading, time\nstarted = []\nstop = threading.Event()\n"
        "for i in range(120):\n"
        "    try:\n        t = threading.Thread(target=stop.wait); t.start(); started.append(t)\n"
        "    except RuntimeError:\n        break\n"
        "stop.set()\nprint(len(started))"
    )
    result = execute(kc, "%%limits processes=100000\n" + code)
    assert result.notes.startswith(f"{NOTE}processes=40 ")
    started = int(result.stream().split()[-1])
    # At most the ceiling, never the 120 tried. A pids cgroup (root) counts the cell's threads exactly; RLIMIT_NPROC,
    # which stands in elsewhere, counts the user's tasks when the cell started, give or take the few that came or went.
    slack = 0 if os.geteuid() == 0 else 4
    assert 20 <= started <= LIMITS.processes + slack, result.stream()


def test_lowering_a_limit_still_works_and_says_nothing(kc: BlockingKernelClient) -> None:
    result = execute(kc, f"%%limits memory=600M open_files=100\n{READ_LIMITS}")
    assert result.notes == "" and result.stream("stderr") == ""
    soft = result.stream().split(") (")
    assert soft[0] == f"({600 * MiB}, {1024**3}"
    assert soft[1].startswith("100, ")


@pytest.mark.parametrize(
    "line",
    ["processes=99999999999999999999999999", "memory=1e9", "wall=-1", "nice=-20", "memory=", "io_class=realtime"],
)
def test_a_bad_limits_line_is_one_error_and_the_kernel_lives_on(kc: BlockingKernelClient, line: str) -> None:
    result = execute(kc, f"%%limits {line}\nprint('ran')")
    if result.status == "ok":  # a value past the ceiling: capped, and said
        assert result.stream() == "ran\n" and result.notes.startswith(NOTE)
    else:
        assert [e["ename"] for e in result.errors] == ["LimitError"] and result.stream() == ""
    assert execute(kc, "print(6 * 7)").stream() == "42\n"


def test_a_nicer_priority_than_the_ceiling_is_capped(kc: BlockingKernelClient) -> None:
    result = execute(kc, "%%limits nice=0\nimport os\nprint(os.nice(0))")
    assert result.notes.startswith(f"{NOTE}nice=19 ")
    assert result.stream() == "19\n"


# --------------------------------------------------------------------------- shared memory and /tmp


def test_a_160_mib_shared_memory_segment_works_at_the_default_limits(kc: BlockingKernelClient) -> None:
    code = (
        "from multiprocessing import shared_memory\n"
        "s = shared_memory.SharedMemory(create=True, size=160 * 1024**2)\n"
        "s.buf[-1] = 7\nprint(len(s.buf), s.buf[-1])\ns.close(); s.unlink()"
    )
    result = execute(kc, code)
    assert result.status == "ok", result.traceback
    assert result.stream() == f"{160 * MiB} 7\n"


def test_the_sessions_tmp_and_dev_shm_are_bounded(kc: BlockingKernelClient) -> None:
    code = "import os\nfor p in ('/tmp', '/dev/shm'):\n    v = os.statvfs(p); print(p, v.f_blocks * v.f_frsize)"
    result = execute(kc, "%%limits cpu=1 memory=256M\n" + code)
    sizes = dict(line.split() for line in result.stream().splitlines())
    if sizes["/tmp"] != str(DEFAULT_CEILING.shared_memory):
        pytest.skip(f"no fs layer with bwrap --size here: /tmp is the host's ({sizes['/tmp']} bytes)")
    assert sizes == {"/tmp": str(LIMITS.shared_memory), "/dev/shm": str(LIMITS.shared_memory)}


def test_filling_the_sessions_tmp_stops_at_its_bound_with_enospc(kc: BlockingKernelClient) -> None:
    code = (
        "import errno, os\nchunk = b'x' * (1 << 20)\nn = 0\n"
        "try:\n"
        "    for i in range(40):\n"
        "        with open(f'/tmp/f{i}', 'wb') as f:\n"
        "            for _ in range(100):\n                f.write(chunk); n += 1\n"
        "except OSError as e:\n    print(errno.errorcode[e.errno], n)\n"
        "for i in range(40):\n"
        "    try:\n        os.unlink(f'/tmp/f{i}')\n    except FileNotFoundError:\n        pass"
    )
    probe = execute(kc, "import os\nv = os.statvfs('/tmp'); print(v.f_blocks * v.f_frsize)")
    if probe.stream().strip() != str(LIMITS.shared_memory):
        pytest.skip("no fs layer with bwrap --size here: /tmp is the host's")
    result = execute(kc, "%%limits memory=256M\n" + code)
    error, written = result.stream().split()
    assert error == "ENOSPC"
    assert LIMITS.shared_memory // MiB - 2 <= int(written) <= LIMITS.shared_memory // MiB


def test_a_stopped_cell_without_shared_memory_has_no_such_line(kc: BlockingKernelClient) -> None:
    # Before any test here maps shared memory: multiprocessing keeps its heap once it has one.
    result = execute(kc, "%%limits cpu=1\nplain = 6\nwhile True: pass")
    assert result.status == "error"
    assert not [line for line in result.errors[-1]["traceback"] if "shared memory" in line]


SHARED = "import mmap, multiprocessing\nm = mmap.mmap(-1, 4096)\nv = multiprocessing.Value('i', 1)\nplain = 1"


def test_undo_names_the_shared_memory_it_cannot_take_back(kc: BlockingKernelClient) -> None:
    assert execute(kc, SHARED).status == "ok"
    assert execute(kc, "m[0] = 9; v.value = 3; plain = 3").status == "ok"
    undo = execute(kc, "%undo")
    lines = undo.stream().splitlines()
    assert lines[0].startswith("Undid 1 cell")
    note = lines[1]
    assert note.startswith("cellbox: writes to shared memory (mmap MAP_SHARED, multiprocessing, shared_memory, memfd)")
    assert "/dev/zero (deleted)" in note and "pym-" in note  # mmap(-1, n) and multiprocessing's heap
    # What the note says: the plain name went back, the shared memory did not.
    assert execute(kc, "print(m[0], v.value, plain)").stream() == "9 3 1\n"


# A System V segment written and let go (no process maps it): it keeps its bytes for the session.
DETACHED_SEGMENT = """
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
segment = libc.shmget(0, 1 << 20, 0o1000 | 0o600)  # IPC_PRIVATE, IPC_CREAT
if segment >= 0:
    address = libc.shmat(segment, None, 0)
    ctypes.memset(address, 7, 1 << 20)
    libc.shmdt(ctypes.c_void_p(address))
print(segment)
plain = 4
"""


def test_undo_names_a_system_v_segment_no_process_maps(kc: BlockingKernelClient) -> None:
    made = execute(kc, DETACHED_SEGMENT)
    assert made.status == "ok", made.traceback
    segment = made.stream().strip()
    if segment == "-1":
        pytest.skip("no IPC namespace here: the filter refuses shmget")
    undo = execute(kc, "%undo")
    note = undo.stream().splitlines()[1]
    assert note.startswith("cellbox: writes to shared memory")
    assert f"System V segment {segment}" in note


def test_a_stopped_cell_names_the_shared_memory_it_wrote(kc: BlockingKernelClient) -> None:
    assert execute(kc, SHARED).status == "ok"
    result = execute(kc, "%%limits cpu=1\nm[0] = 5; v.value = 5; plain = 5\nwhile True: pass")
    assert result.status == "error"
    tail = result.errors[-1]["traceback"][-1]
    assert tail.startswith("cellbox: writes to shared memory") and "/dev/zero (deleted)" in tail
    assert execute(kc, "print(m[0], v.value, plain)").stream() == "5 5 1\n"


def test_the_session_is_one_memory_cgroup_bounded_at_session_memory(kc: BlockingKernelClient) -> None:
    if memory_cgroup_root() is None:
        pytest.skip("no writable memory cgroup here (the first cell said so)")
    lines = execute(kc, "print(open('/proc/self/cgroup').read())").stream().splitlines()
    v1 = [line.split(":", 2)[2] for line in lines if ":memory:" in line]
    if v1:
        cgroup, limit = Path("/sys/fs/cgroup/memory") / v1[0].lstrip("/"), "memory.limit_in_bytes"
    else:
        path = next(line.split(":", 2)[2] for line in lines if line.startswith("0::"))
        cgroup, limit = Path("/sys/fs/cgroup") / path.lstrip("/"), "memory.max"
    assert cgroup.name.startswith("cellbox-"), cgroup  # the session's own, not the machine's
    assert cgroup.parent == memory_cgroup_root()  # below the kernel's own cgroup where it may write there
    assert (cgroup / limit).read_text().strip() == str(3 * 1024**3)


def test_limits_capped_and_widened_agree_with_the_kernel() -> None:
    asked = Limits().updated({"memory": "none", "processes": "100000", "wall": "99999"})
    capped, over = asked.capped(LIMITS)
    assert over == ["wall_time", "memory", "processes"]
    assert (capped.wall_time, capped.memory, capped.processes) == (60.0, 1024**3, 40)
    assert resource.RLIM_INFINITY not in (capped.memory,)


SESSION_BOUND = ["--CellboxKernel.session_memory=1G", "--CellboxKernel.memory=1G"]


def test_a_state_that_fills_the_sessions_memory_stops_the_cell_with_the_sessions_words(notebook_dir: Path) -> None:
    # Each cell adds a 300 MiB bytes object the session's state keeps, so by the third or fourth cell the session's
    # 1G cgroup is full though every cell stays under its own 2G RLIMIT_AS; letting the states kept for %undo go
    # cannot help, since the current state holds every object.
    if memory_cgroup_root() is None:
        pytest.skip("no writable memory cgroup here: the session's memory is not bounded")
    extra = ["--CellboxKernel.session_memory=1G", "--CellboxKernel.memory=2G"]
    with running_kernel("cellbox", cwd=str(notebook_dir), extra=extra) as (_km, client):
        results = [execute(client, f"big{n} = b'{n}' * (300 * 2**20)", timeout=60) for n in range(5)]
        failed = next(result for result in results if result.status == "error")
        [error] = failed.errors
        assert error["ename"] == "CellMemoryLimitError"
        assert error["evalue"].startswith("the cell was stopped: the session's memory reached its 1G bound")
        assert "RLIMIT_AS" not in error["evalue"]
        assert "memory: the session reached its memory bound of 1G" in failed.notes
        assert "the run reached its memory bound" not in failed.notes  # the cell's own bound was not reached
        stopped = results.index(failed)
        assert stopped >= 2  # two objects fit in 1G
        # The kernel lives on, and the next cell sees the state before the stopped one.
        names = execute(client, "print(sorted(n for n in dir() if n.startswith('big')))").stream()
        assert names == f"{[f'big{n}' for n in range(stopped)]}\n"


def test_a_notebook_that_redefines_a_large_object_runs_as_under_ipykernel_and_undo_says_what_was_let_go(
    notebook_dir: Path,
) -> None:
    # Each cell replaces a 300 MiB bytes object. Each state kept for %undo holds its own copy, so three kept states
    # and the current one would fill the session's 1G cgroup and stop the third cell, where ipykernel, holding one
    # copy, runs them all. The oldest kept states are let go while the session holds more than half its bound.
    if memory_cgroup_root() is None:
        pytest.skip("no writable memory cgroup here: the session's memory is not bounded")
    with running_kernel("cellbox", cwd=str(notebook_dir), extra=SESSION_BOUND) as (_km, client):
        results = [execute(client, f"big = b'{n}' * (300 * 2**20)", timeout=60) for n in range(6)]
        assert [result.status for result in results] == ["ok"] * 6
        # Kept now: the last cell's state and the one before it (let go at the next cell's start); older ones went.
        undo = execute(client, "%undo 3", timeout=60).stream()
        assert undo.startswith("Undid 1 cell: the names are as they were before it."), undo
        assert (
            "(Only 1 cell could be undone: older states were let go when the session held more than half its 1G" in undo
        )
        assert "CellboxKernel.session_memory sets the bound" in undo
        assert "undo_depth" not in undo
        assert execute(client, "print(len(big), big[:1])").stream() == f"{300 * 2**20} b'4'\n"
