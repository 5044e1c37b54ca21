"""A run's cgroups: the pids cgroup caps the processes and threads of a run, and lists every one of them;
the memory cgroup caps its resident memory (the ``resident`` limit).

A process cannot leave a cgroup it was put in without write access to
another (cgroups(7)), so the cgroup finds a run's processes that left its
session and process group.  Only where this process may create cgroups
(usually root): elsewhere RLIMIT_NPROC stands in (see :mod:`cellbox.sandbox.runs`).
"""

from __future__ import annotations

import atexit
import os
import queue
import signal
import threading
import time
import uuid
from pathlib import Path

__all__ = [
    "PidsCgroup",
    "MemoryCgroup",
    "pids_cgroup_root",
    "memory_cgroup_root",
    "stale_cgroups",
    "REMOVER",
    "CGROUP_PREFIX",
    "STALE_CGROUP_AGE",
    "UNBOUNDED_MEMORY",
]

# What is not bounded without a memory cgroup: said by `cellbox doctor` and in a bounded session's notes.
UNBOUNDED_MEMORY = (
    "no writable memory cgroup (root or a delegated cgroup gives one): memfds, shared mappings and what runs keep "
    "in /tmp and /dev/shm are not bounded as a whole, only by each tmpfs's size and each process's address space"
)

# Seconds the cgroups of finished runs may take to be removed when the process exits.
DRAIN_TIMEOUT = 2.0


def pids_cgroup_root() -> Path | None:
    """A pids cgroup directory this process may create run cgroups in, or ``None``.

    cgroup v1's ``pids`` hierarchy, or the v2 root when its ``pids`` controller is
    on for children (see the kernel's cgroup-v1/pids.rst and cgroup-v2.rst).
    Usually only root can write there; elsewhere RLIMIT_NPROC stands in.
    """
    return _cgroup_root("pids")


def _cgroup_root(controller: str) -> Path | None:
    """The writable cgroup directory of ``controller``: its v1 hierarchy, or the v2 root where it is on for children."""
    candidates = [Path("/sys/fs/cgroup") / controller]
    v2 = Path("/sys/fs/cgroup")
    try:
        if controller in (v2 / "cgroup.subtree_control").read_text().split():
            candidates.append(v2)
    except OSError:
        pass
    for path in candidates:
        if (path / "cgroup.procs").exists() and os.access(path, os.W_OK):
            return path
    return None


class PidsCgroup:
    """One run's pids cgroup: caps processes and threads, and lists all of them."""

    def __init__(self, root: Path, limit: int) -> None:
        REMOVER.start(root)
        self.path = root / f"{CGROUP_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:12]}"
        self.path.mkdir()
        try:
            (self.path / "pids.max").write_text(str(limit))
        except OSError:
            self.path.rmdir()
            raise

    def remove(self) -> None:
        for _ in range(50):
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                for line in (self.path / "cgroup.procs").read_text().split():
                    try:
                        os.kill(int(line), signal.SIGKILL)
                    except OSError:
                        pass
                time.sleep(0.02)

    def pids(self) -> list[int]:
        """The processes in the cgroup now (``cgroup.procs``); empty once it is gone."""
        try:
            return [int(line) for line in (self.path / "cgroup.procs").read_text().split()]
        except OSError:
            return []

    def refused(self) -> bool:
        """``True`` when a fork or a thread was refused at ``pids.max`` (the ``max`` count of ``pids.events``)."""
        try:
            events = (self.path / "pids.events").read_text().split()
        except OSError:
            return False
        counts = dict(zip(events[::2], events[1::2], strict=False))
        return counts.get("max", "0") != "0"

    def remove_later(self) -> None:
        """Remove it in the background: rmdir(2) of a cgroup takes milliseconds no run's result should wait for."""
        REMOVER.put(self)


CGROUP_PREFIX = "cellbox-"


def memory_cgroup_root() -> Path | None:
    """A memory cgroup directory this process may create run cgroups in, or ``None``.

    First this process's own cgroup v1 memory cgroup, so that a run's cgroup
    nests below it and stays inside whatever bound the machine put on this
    process (a container's, a CI job's: v1 charges and limits hierarchically,
    cgroup-v1/memory.rst section 6); else cgroup v1's ``memory`` hierarchy, or
    the v2 root when its ``memory`` controller is on for children (cgroup-v2.rst).
    Usually only root can write there.
    """
    own = _own_v1_cgroup("memory")
    if own is not None and (own / "memory.limit_in_bytes").exists() and os.access(own, os.W_OK):
        return own
    return _cgroup_root("memory")


def _own_v1_cgroup(controller: str) -> Path | None:
    """This process's cgroup directory in the v1 hierarchy of ``controller`` (``/proc/self/cgroup``), or ``None``."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _number, kinds, path = line.split(":", 2)
        if controller in kinds.split(","):
            return Path("/sys/fs/cgroup") / controller / path.lstrip("/")
    return None


class MemoryCgroup(PidsCgroup):
    """One run's memory cgroup: caps the memory all its processes hold, and counts OOM kills.

    The kernel charges a cgroup with its processes' anonymous memory, the tmpfs
    and memfd pages they write and the page cache they fill (cgroup-v1/memory.rst
    section 2.2, cgroup-v2.rst "Memory Ownership"), so a run cannot hold memory
    outside it by putting it in ``/dev/shm``.  ``limit`` ``None``: counted only.

    v1 writes ``memory.limit_in_bytes`` (and ``memory.memsw.limit_in_bytes``,
    so swap does not stretch the cap); v2 ``memory.max`` and ``memory.swap.max``.
    At the cap the kernel reclaims, then its OOM killer kills a process of the run.
    """

    def __init__(self, root: Path, limit: int | None) -> None:
        REMOVER.start(root)
        self.path = root / f"{CGROUP_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:12]}"
        self.path.mkdir()
        self.v2 = not (self.path / "memory.limit_in_bytes").exists()
        self.limit = limit
        try:
            if limit is None:
                pass  # no cap: the cgroup still counts (peak) what the run holds, tmpfs and memfds included
            elif self.v2:
                (self.path / "memory.max").write_text(str(limit))
                if (self.path / "memory.swap.max").exists():
                    (self.path / "memory.swap.max").write_text("0")
            else:
                (self.path / "memory.limit_in_bytes").write_text(str(limit))
                if (self.path / "memory.memsw.limit_in_bytes").exists():
                    (self.path / "memory.memsw.limit_in_bytes").write_text(str(limit))
        except OSError:
            self.path.rmdir()
            raise

    def oom_kills(self) -> int:
        """Processes of the run the OOM killer killed at the cap (``oom_kill``, cgroup v2 or v1)."""
        name = "memory.events" if self.v2 else "memory.oom_control"
        try:
            words = (self.path / name).read_text().split()
        except OSError:
            return 0
        counts = dict(zip(words[::2], words[1::2], strict=False))
        return int(counts.get("oom_kill", "0"))

    def held(self) -> int:
        """Memory the run holds that only freeing it gives back, bytes: anonymous pages and tmpfs, shmem and memfd
        pages (0 when unknown).

        The page cache the run filled is left out, since the kernel reclaims it at the cap.  v2 sums
        ``memory.stat``'s ``anon`` and ``shmem``, v1 its hierarchical ``total_rss`` and ``total_shmem``
        (cgroup-v2.rst "memory.stat", cgroup-v1/memory.rst section 5.2).  ``memory.current`` (v2) or
        ``memory.usage_in_bytes`` (v1), one number and cheaper, bounds it from above, so :meth:`held_over` reads
        the stat only when that number is over.
        """
        try:
            words = (self.path / "memory.stat").read_text().split()
        except OSError:
            return 0
        counts = dict(zip(words[::2], words[1::2], strict=False))
        names = ("anon", "shmem") if self.v2 else ("total_rss", "total_shmem")
        try:
            return sum(int(counts.get(name, "0")) for name in names)
        except ValueError:
            return 0

    def held_over(self, bytes_: int) -> int | None:
        """:meth:`held` when it is more than ``bytes_``, else ``None`` (also when it cannot be read)."""
        name = "memory.current" if self.v2 else "memory.usage_in_bytes"
        try:
            usage = int((self.path / name).read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None
        if usage <= bytes_:
            return None
        held = self.held()
        return held if held > bytes_ else None

    def peak(self) -> int:
        """Most resident memory the run's processes held together, bytes (0 when unknown)."""
        name = "memory.peak" if self.v2 else "memory.max_usage_in_bytes"
        try:
            return int((self.path / name).read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return 0


class CgroupRemover:
    """One background thread that removes the cgroups of finished runs, and those of dead processes.

    A cgroup's rmdir(2) waits for the kernel to retire it (about 4 ms each on
    cgroup v1): done here, it never delays a run's result.  Its first job, once
    per process, is the empty cgroups that processes killed before they could
    clean up left under the root (see :func:`stale_cgroups`): those are only
    rmdir'ed, never emptied by killing, since a maker that looks dead from here
    may be alive in another pid namespace.  At exit the queue is drained, for
    at most :data:`DRAIN_TIMEOUT` seconds.
    """

    def __init__(self) -> None:
        self._queue: queue.Queue[PidsCgroup | Path] = queue.Queue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._swept = False

    def start(self, root: Path) -> None:
        """Start the thread if needed, and queue the leftovers under ``root`` once."""
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._work, name="cellbox-cgroup-remover", daemon=True)
                self._thread.start()
                atexit.register(self.drain)
            if self._swept:
                return
            self._swept = True
        for stale in stale_cgroups(root):
            self._queue.put(stale)

    def put(self, cgroup: PidsCgroup) -> None:
        self.start(cgroup.path.parent)
        self._queue.put(cgroup)

    def _work(self) -> None:
        while True:
            cgroup = self._queue.get()
            try:
                if isinstance(cgroup, Path):
                    os.rmdir(cgroup)  # fails (EBUSY) while any process is in it
                else:
                    cgroup.remove()
            except OSError:
                pass  # gone, in use, or not ours to remove
            finally:
                self._queue.task_done()

    def drain(self, timeout: float = DRAIN_TIMEOUT) -> bool:
        """Wait until every queued cgroup is removed; ``False`` when ``timeout`` seconds passed first."""
        deadline = time.monotonic() + timeout
        while self._queue.unfinished_tasks:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.005)
        return True


def stale_cgroups(root: Path, now: float | None = None) -> list[Path]:
    """Run cgroups under ``root`` that look left behind: their maker (the pid in the name) is not
    running here, and they are older than :data:`STALE_CGROUP_AGE` seconds (so a run that has made its
    cgroup but not yet moved its command in is never among them).  Only ever rmdir'ed: rmdir(2) of a
    cgroup with a process in it fails, so a run of another pid namespace is never touched.
    """
    found = []
    now = time.time() if now is None else now
    try:
        names = os.listdir(root)
    except OSError:
        return []
    for name in names:
        maker = name[len(CGROUP_PREFIX) :].split("-", 1)[0]
        if not name.startswith(CGROUP_PREFIX) or not maker.isdigit():
            continue
        try:
            os.kill(int(maker), 0)
            continue
        except ProcessLookupError:
            pass
        except PermissionError:
            continue  # alive, another user's
        try:
            if now - os.stat(root / name).st_mtime < STALE_CGROUP_AGE:
                continue
        except OSError:
            continue
        found.append(root / name)
    return found


# Seconds a cgroup of a dead maker must have existed before it counts as left behind.
STALE_CGROUP_AGE = 60.0


REMOVER = CgroupRemover()
