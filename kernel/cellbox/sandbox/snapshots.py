"""The snapshot chain: process images that hold a session's state, and the runs forked from them.

Standard library only until the preload list is imported.  Runs in the
session's processes (see :mod:`cellbox.sandbox.keeper` for who is who): the
keeper holds a :class:`Chain` of :class:`Snapshot` handles; the functions
below run in the snapshots themselves and in the commands they fork.

* A **snapshot** is a process image that holds a session's state, so it
  holds a cell's memory: nothing it says is trusted.  It is not dumpable (no
  later cell may trace it or write its memory), and stopped (SIGSTOP) while
  nobody needs it, so no work of a cell runs between cells; the keeper
  continues it to fork one run (in that run's time, never between cells),
  then stops it again.  It forks twice, so the
  run's command is re-parented to the keeper, which alone waits for it (its
  exit status and rusage come from wait4(2) in the keeper).  The command
  waits for one byte on a pipe from the keeper, written only once the keeper
  has checked that the pid the snapshot named is its own child; a snapshot
  that names another is dropped with whatever it started, and the run is
  forked from the snapshot before it.
* A **spare** is a run's command forked ahead of its run: by the command of
  the cell before, beside its snapshot (:func:`make_snapshot`), or by the
  base snapshot (:meth:`cellbox.sandbox.keeper.Keeper.make_spare`).  The
  keeper checks its pid as it checks a run's, stops it, and later sends it
  the run's request and pipes on its own socket, so a run does not wait for
  a fork.
* A **run's command** applies the run's limits (soft limits: a snapshot keeps
  the hard limits it started with, so a later cell can be given more) and runs
  its module.  When the run asks for a snapshot and its command finishes the
  module alive, it lets go of the run's pipes, forks the next snapshot (its
  main thread only: fork(2) copies the calling thread), names it on the
  snapshot's socket, and exits; the snapshot waits there for the keeper's
  requests (the first: fork the next spare).  The kernel then keeps it
  (``settle``) or drops it.
* The **chain** is the base snapshot ``S0`` (no run has changed it), the kept
  snapshots (the last is the session's state; the ones before it are what
  ``undo`` goes back to, up to the undo depth), and the newest one until its
  owner settles it.
"""

import _imp
import atexit
import builtins
import errno
import fcntl
import importlib
import importlib.util
import json
import os
import random
import re
import resource
import runpy
import select
import signal
import socket
import struct
import sys
import threading
import time
import traceback
import types
import warnings

from . import _launch, atfork
from .limits import format_size

# The fds a hand-off carries, in the order the parent sends them ("stdin" and
# the channel's two only when the run has them).
HANDOFF_NAMES = ("status", "control", "stdout", "stderr", "stdin", "message", "reply")
MAX_MESSAGE = 1024 * 1024
MAX_FDS = len(HANDOFF_NAMES) + 3  # and, from the keeper to a snapshot, "go", "snapshot" and "next_spare"
PR_SET_NAME = 15
PR_SET_DUMPABLE = 4
SNAPSHOT_NAME = b"cellbox-snap"
# Where the channel's ends go in the command, as for a spawned command (sandbox.CHANNEL_FDS).
CHANNEL_TARGETS = {"message": 3, "reply": 4}
# The niceness snapshots (and so the runs forked from them) start at: the lowest priority, as the
# keeper's was; a run then sets its own (nice), which only root may set lower (setpriority(2)).
SNAPSHOT_NICE = 19
# The running kernel's (major, minor), as uname(2) gives it ("6.8.0-45-generic" is (6, 8)).
KERNEL_RELEASE = tuple(int(part) for part in re.findall(r"\d+", os.uname().release)[:2])
# Seconds a snapshot may take to fork a run, and a finished command to say its snapshot is there.
SNAPSHOT_TIMEOUT = 5.0
# The most messages the keeper reads off a run's snapshot socket at once (queued_words): the cell's own
# processes send there, and a process of the cell's may go on sending while the keeper reads.
MAX_QUEUED_WORDS = 1024
# Bytes of one such word that are read (a snapshot's word names at most 8 paths, each at most 4096 bytes, which
# JSON's escapes (6 bytes for one at worst) make at most 192 KiB: a longer word is not JSON once cut),
# and bytes of words read at once: what the keeper parses and holds for a cell stays bounded however fast its
# processes send (a 1 MiB word of empty JSON objects took 25 MB and 0.15 s of the keeper's to parse).
MAX_WORD = 256 * 1024
MAX_QUEUED_BYTES = 1024 * 1024
# (spec, code) of the warmed module's ``python -m`` entry, found once by the keeper (see prefetch).
PREFETCHED = None
# In a run's command: the session wants a snapshot of it when its module returns
# (read by the cell runner, which then returns instead of leaving).
SNAPSHOT = False


def set_name(name):
    """The process's name in ps and /proc/PID/comm (prctl(2) PR_SET_NAME, 15 bytes)."""
    try:
        _launch.libc().prctl(PR_SET_NAME, name[:15], 0, 0, 0)
    except (OSError, AttributeError):
        pass


def set_dumpable(flag):
    """prctl(2) PR_SET_DUMPABLE: 0 closes ptrace and /proc/PID/{mem,environ} to everyone without CAP_SYS_PTRACE."""
    try:
        return _launch.libc().prctl(PR_SET_DUMPABLE, int(flag), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def send_json(sock, message, fds=()):
    """One JSON message, with ``fds`` attached as SCM_RIGHTS (unix(7))."""
    socket.send_fds(sock, [json.dumps(message).encode()], list(fds))


def receive(sock):
    """One message and its fds; ``(None, [])`` at end of file.

    Raises :class:`OSError` from recvmsg(2) (:class:`BlockingIOError` when
    nothing is queued on a non-blocking socket) and :class:`ValueError` for a
    message that is not JSON (or nests too deep to decode), whose fds are
    closed first.
    """
    data, fds, _flags, _addr = socket.recv_fds(sock, MAX_MESSAGE, MAX_FDS)
    if not data:
        for fd in fds:
            os.close(fd)
        return None, []
    try:
        return json.loads(data), fds
    except (ValueError, RecursionError) as exc:
        for fd in fds:
            os.close(fd)
        raise ValueError(f"not a message: {type(exc).__name__}") from None


def queued_words(sock, timeout=0.0, limit=None):
    """The messages queued on ``sock``, oldest first, each one's fds closed: a cell's process sends them.

    The first is waited for up to ``timeout`` seconds, the others not;
    reading stops at an empty queue, at end of file, after ``limit``
    reads (:data:`MAX_QUEUED_WORDS`), or after :data:`MAX_QUEUED_BYTES`,
    since the cell's other processes may go on sending.  Each message is
    read up to :data:`MAX_WORD` bytes (the rest is discarded: SOCK_SEQPACKET
    keeps message boundaries, unix(7)).  A message that is not JSON is
    skipped, and so is an empty one: a SOCK_SEQPACKET read returns 0 bytes
    both for an empty message and at end of file, which is told by POLLHUP
    (every peer closed; poll(2)).  An ECONNRESET (the peer closed with
    messages of ours unread, unix(7)) is reported once and then cleared, and
    the reading goes on.  The socket's timeout is as it was after.
    """
    limit = MAX_QUEUED_WORDS if limit is None else limit
    words = []
    left = MAX_QUEUED_BYTES
    was = sock.gettimeout()
    sock.settimeout(timeout)
    try:
        for _ in range(limit):
            try:
                data, fds, _flags, _addr = socket.recv_fds(sock, MAX_WORD, MAX_FDS)
            except ConnectionResetError:
                data, fds = None, []
            except OSError:
                break
            sock.settimeout(0)
            for fd in fds:
                os.close(fd)
            if data == b"":
                poller = select.poll()
                poller.register(sock, select.POLLIN)
                if any(events & select.POLLHUP for _fd, events in poller.poll(0)):
                    break
            elif data is not None:
                try:
                    words.append(json.loads(data))
                except (ValueError, RecursionError):
                    pass
                left -= len(data)
                if left <= 0:
                    break
    finally:
        sock.settimeout(was)
    return words


# --------------------------------------------------------------------------- preload


def preload(names, entry=None):
    """Import ``names``; return ``(loaded, {name: reason})``.

    ``entry`` (the module runs are started with, if listed) comes first, and
    its ``prepare_process()`` is called before the others are imported: it may
    set what they read once, at import (the cell runner sets ``MPLBACKEND``
    before matplotlib is imported).
    """
    atfork.install()  # before any library registers a cache clear (see cellbox.sandbox.atfork)
    loaded, failed = [], {}
    ordered = [entry, *(name for name in names if name != entry)] if entry in names else list(names)
    for name in ordered:
        try:
            importlib.import_module(name)
            loaded.append(name)
        except Exception as exc:  # noqa: BLE001 - a module that is not installed is reported, not fatal
            failed[name] = f"{type(exc).__name__}: {exc}"
            continue
        if name == entry:
            prepare_entry(entry)
    return loaded, failed


def prepare_entry(module):
    """What an entry module does to the process before its imports, done again in each child.

    Calls the loaded module's ``prepare_process()``, if it has one.
    matplotlib reads ``MPLBACKEND`` once, at import, so with matplotlib already
    imported the child sets its backend again.
    """
    hook = getattr(sys.modules.get(module or ""), "prepare_process", None)
    if hook is not None:
        hook()
    matplotlib = sys.modules.get("matplotlib")
    if matplotlib is not None and os.environ.get("MPLBACKEND"):
        try:
            matplotlib.rcParams["backend"] = os.environ["MPLBACKEND"]
        except Exception:  # noqa: BLE001 - a backend matplotlib refuses stays as it was
            pass


def warm(module):
    """Call ``module.warm_start()`` when the module is loaded and has one; ``False`` when it failed.

    The base snapshot does it once: the cell runner builds IPython's shell
    there, and every cell of the session then runs in that shell's copies.
    """
    hook = getattr(sys.modules.get(module or ""), "warm_start", None)
    if hook is None:
        return True
    try:
        hook()
        return True
    except Exception:  # noqa: BLE001 - only a head start; the first cell builds what is missing
        return False


# --------------------------------------------------------------------------- a run's command


def command_main(request, named):
    """``C``: become the run's command, run it; return the next snapshot's socket in that snapshot only.

    In the command itself it never returns: the process ends with the
    module's exit status.  In the spare the command forked beside its
    snapshot, it waits for the next run and becomes its command.
    """
    while True:
        kind, fd = run_command(request, named)
        if kind == "snapshot":
            return socket.socket(fileno=fd)
        request, named = wait_for_go(request, {"spare": fd})


def run_command(request, named):
    """One run's command: ``("snapshot", socket fd)`` in the snapshot it leaves, ``("spare", socket fd)`` in its spare.

    In the command itself it never returns.
    """
    global SNAPSHOT
    SNAPSHOT = "snapshot" in named
    status_fd = named["status"]
    carried = request.get("from") == "current"
    # A carried cell goes on where the last one left off: its %cd, its %env, its sys.path, its seeds.
    where = current_directory() if carried else None
    try:
        places = [[named["stdout"], 1], [named["stderr"], 2]]
        if "stdin" in named:
            places.append([named["stdin"], 0])
        else:
            places.append([os.open(os.devnull, os.O_RDONLY), 0])
        places += [[named[name], target] for name, target in CHANNEL_TARGETS.items() if name in named]
        # A run that becomes a snapshot keeps its hard limits as they were (see apply_limits).
        spec = dict(request, fds=places, landlock=None, soft_limits=SNAPSHOT)
        status_fd = _launch.prepare_command(spec, status_fd, exact_priority=True)
        if carried:
            below_state(request)
        set_dumpable(True)  # the cell's own process, as any program (its snapshot is not)
        python_signals()
        if carried:
            os.environ["CELLBOX_CHANNEL"] = request["env"].get("CELLBOX_CHANNEL", "")
            if where is not None and os.path.isdir(where):
                os.chdir(where)
        else:
            # A pristine run: nothing of the base or of earlier runs reaches it.
            keep = {0, 1, 2, status_fd, *(target for _fd, target in places)}
            if "snapshot" in named:
                keep.add(named["snapshot"])
            close_other_fds(keep)
            replace_environment(request["env"])
            # As `python -m` puts the working directory first: in the run's own process only (the
            # keeper and its snapshots have none, see importpath.KEEPER_FLAGS).
            sys.path.insert(0, os.getcwd())
            reseed()
        prepare_entry(request["argv"][2])
    except OSError as exc:
        _launch.emit(status_fd, {"event": "exec_error", "text": f"cannot start the command: {exc.strerror or exc}"})
        os._exit(126)
    except BaseException as exc:  # noqa: BLE001 - never return into the snapshot's loop
        _launch.emit(status_fd, {"event": "exec_error", "text": f"cannot start the command: {exc!r}"})
        os._exit(126)
    os.close(status_fd)
    status = run_module(request["argv"])
    snapshot = named.get("snapshot")
    if snapshot is None:
        finish(status)
    if status in (0, 1):
        # A cell that ended well in one thread and no children is its own snapshot (one fork, no exit);
        # any other keeps the fork of make_snapshot.
        made = become_own_snapshot(snapshot, named.get("next_spare")) if status == 0 else None
        made = made or make_snapshot(snapshot, named.get("next_spare"))
        if made is not None:
            return made  # here, in the new snapshot or the next spare
    # A cell's run: threads it left are not waited for, they end with it (the runner said so).
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(status)


def below_state(request):
    """End a carried run whose memory limit is below the address space its state already holds.

    RLIMIT_AS counts what the run starts with (setrlimit(2)): under a lower
    limit every allocation fails, so the run is ended at once, before any of
    its code, as a program that ran out of memory (a ``MemoryError`` as its
    last line, exit status 1), which its caller classifies ``memory_limit``.
    """
    memory = request.get("limits", {}).get("memory")
    if memory is None:
        return
    size, _resident = vm_size()
    if size < memory:
        return
    held, limit = format_size(size), format_size(memory)
    os.write(
        2,
        f"MemoryError: the notebook's state already takes {held} of address space, more than this run's "
        f"memory limit of {limit}: raise the limit (for example %%limits memory=...) or free memory first\n".encode(),
    )
    os._exit(1)


# Mappings whose writes no snapshot can take back: shared anonymous memory (mmap(-1, n) shows as
# "/dev/zero (deleted)"), memfds, POSIX and System V shared memory, deleted files (multiprocessing's heap).
SHARED_MEMORY_PATHS = ("/dev/zero", "/memfd:", "/dev/shm/", "/SYSV")


# PROCMAP_QUERY (Linux 6.11, include/uapi/linux/fs.h): _IOWR('f', 17, struct procmap_query), an ioctl(2) on
# /proc/PID/maps that finds one mapping at a time, here only the shared ones, without the text of all of them.
PROCMAP_QUERY = 0xC0686611
PROCMAP_QUERY_VMA_SHARED, PROCMAP_QUERY_COVERING_OR_NEXT_VMA = 0x08, 0x10
# size, query_flags, query_addr, vma_start, vma_end, vma_flags, vma_page_size, vma_offset, inode; dev_major,
# dev_minor; vma_name_size, build_id_size; vma_name_addr, build_id_addr.
PROCMAP_QUERY_STRUCT = struct.Struct("=9Q2I2I2Q")
# The longest name the query may give (PATH_MAX); a longer one makes it fail (ENAMETOOLONG), and maps is read.
MAPPING_NAME_BYTES = 4096


def shared_mappings():
    """This process's shared memory mappings: ``{"count": n, "bytes": total, "names": [largest first]}``.

    The mappings made with MAP_SHARED (proc(5): an ``s`` in /proc/self/maps'
    permissions) whose writes reach every process that holds them: a snapshot
    forked now holds the same mappings, and nothing takes such a write back.
    Found with the ``PROCMAP_QUERY`` ioctl(2) where the kernel has it (Linux
    6.11), which asks for the shared mappings alone: reading the whole of
    /proc/self/maps (300 to 400 lines for a session's interpreter) took 0.6 to
    0.8 ms of every cell's end, the query 0.05 ms.  Read here, in the command,
    because the keeper may not read a snapshot's maps (it is not dumpable:
    ptrace access mode checks).  Empty when unreadable.
    """
    try:
        mappings = _queried_shared_mappings()
    except OSError:
        mappings = _listed_shared_mappings()
    found = {}
    for start, end, path in mappings:
        if path.startswith(SHARED_MEMORY_PATHS) or path.endswith("(deleted)") or path == "anonymous":
            found[path] = found.get(path, 0) + end - start
    names = sorted(found, key=lambda name: -found[name])
    return {"count": len(found), "bytes": sum(found.values()), "names": names[:8]}


def _queried_shared_mappings():
    """``[(start, end, name)]`` of this process's shared mappings, from ``PROCMAP_QUERY``.

    Names are as /proc/self/maps shows them (a newline as ``\\012``,
    ``anonymous`` for none).  Raises OSError where the kernel has no such query
    (ENOTTY before Linux 6.11) or it fails.
    """
    import ctypes

    name = ctypes.create_string_buffer(MAPPING_NAME_BYTES)
    where = ctypes.addressof(name)
    flags = PROCMAP_QUERY_VMA_SHARED | PROCMAP_QUERY_COVERING_OR_NEXT_VMA
    found, address = [], 0
    with open("/proc/self/maps", "rb", buffering=0) as maps:
        while True:
            query = bytearray(PROCMAP_QUERY_STRUCT.size)
            # The outputs (from vma_start to dev_minor) zero; the name's buffer; no build id.
            PROCMAP_QUERY_STRUCT.pack_into(query, 0, len(query), flags, address, *[0] * 8, len(name), 0, where, 0)
            try:
                fcntl.ioctl(maps.fileno(), PROCMAP_QUERY, query, True)
            except OSError as exc:
                if exc.errno == errno.ENOENT:
                    return found  # no mapping at or above the address
                raise
            fields = PROCMAP_QUERY_STRUCT.unpack(query)
            start, end, name_size = fields[3], fields[4], fields[11]
            text = name.raw[: max(name_size - 1, 0)].decode("utf-8", "replace").replace("\n", "\\012")
            found.append((start, end, text or "anonymous"))
            if end <= address:
                raise OSError(errno.EIO, "PROCMAP_QUERY went backwards")
            address = end


def _listed_shared_mappings():
    """:func:`_queried_shared_mappings` from the text of /proc/self/maps, for kernels before 6.11."""
    found = []
    try:
        with open("/proc/self/maps", "rb") as f:
            lines = f.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return found
    for line in lines:
        fields = line.split(None, 5)
        if len(fields) < 5 or "s" not in fields[1]:
            continue
        start, _dash, end = fields[0].partition("-")
        try:
            found.append((int(start, 16), int(end, 16), fields[5].strip() if len(fields) == 6 else "anonymous"))
        except ValueError:
            continue
    return found


def detached_sysv_segments():
    """``{"System V segment ID": bytes}`` of the session's System V shared memory segments no process maps.

    From /proc/sysvipc/shm (proc(5); the session's own IPC namespace, which the
    keeper shares, so it reads them itself): such a segment keeps what was
    written to it for the whole session, whatever a stop or an undo takes back,
    and no process's maps show it.  Empty when unreadable (no IPC namespace:
    the filter refuses shmget).
    """
    found = {}
    try:
        with open("/proc/sysvipc/shm") as f:
            lines = f.read().splitlines()[1:]
    except OSError:
        return found
    for line in lines:
        fields = line.split()  # key shmid perms size cpid lpid nattch ...
        try:
            if int(fields[6]) == 0:
                found[f"System V segment {int(fields[1])}"] = int(fields[3])
        except (IndexError, ValueError):
            continue
    return found


def _as_spare(fd, spare_fd, sequence, sock=None):
    """In the child just forked as the next run's spare: ``("spare", spare_fd)``, or its end if that fails.

    The spare draws the random numbers the snapshot would (``sequence``), and
    keeps no end of the snapshot's socket ``fd`` (the keeper's and the snapshot's alone), nor ``sock``, the
    snapshot's copy of it.
    """
    try:
        random.setstate(sequence)
        os.close(fd)
        if sock is not None:
            sock.close()
        set_name(SNAPSHOT_NAME)
        return "spare", spare_fd
    except BaseException:  # noqa: BLE001 - a spare that cannot become one ends; the next run forks the snapshot
        os._exit(0)


def make_snapshot(fd, spare_fd=None):
    """Fork the next snapshot and the next run's spare from this finished command.

    Returns ``("snapshot", fd)`` in the snapshot, ``("spare", spare_fd)`` in
    the spare, ``None`` in the command.  The command lets go of the run's
    streams and channel first (neither child holds them, and the run's output
    ends when the command does), forks both (each its main thread only:
    fork(2) copies the calling thread; both hold what the cell left, the
    spare is the next cell's process), names them on the snapshot's socket
    ``fd``, and returns to end.  The keeper, once it has reaped the command,
    reads those names (:meth:`cellbox.sandbox.keeper.Keeper.take_snapshot`)
    and stops both before it reports the run, so nothing either does (an
    at-fork handler of the cell's) runs after the cell's reply.  No spare
    without ``spare_fd``, or when its fork is refused (the run's processes
    limit): the next run is then forked from the snapshot.
    """
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    release_streams()
    # Born not dumpable: no later cell may trace a snapshot or write its memory (ptrace(2),
    # process_vm_writev(2)); this command ends right after the fork anyway.
    set_dumpable(False)
    sequence = random.getstate()
    names = {"event": "snapshot", "pid": None, "spare": None, "shared": shared_mappings()}
    try:
        names["pid"] = atfork.chain_fork()
    except OSError as exc:
        # Said at once (the keeper would wait for a name): the run's processes limit, most often.
        names["error"] = f"its process could not be copied ({exc.strerror or exc})"
    if names["pid"] == 0:
        try:
            random.setstate(sequence)  # as in fork_run: the random module reseeds every fork child
            become_snapshot(spare_fd)
            return "snapshot", fd
        except BaseException:  # noqa: BLE001 - a snapshot that cannot start leaves quietly
            os._exit(0)
    if names["pid"] is not None and spare_fd is not None:
        try:
            names["spare"] = atfork.chain_fork()
        except OSError:
            pass  # no room for it: the next run is forked from the snapshot
        if names["spare"] == 0:
            return _as_spare(fd, spare_fd, sequence)
    try:
        send_json(socket.socket(fileno=os.dup(fd)), names)
    except OSError:
        pass  # the keeper is gone: so is the session
    return None


# clone(2)'s number where its arguments are (flags, stack, parent_tid, child_tid, tls); elsewhere no sibling fork.
SYS_CLONE = {"x86_64": 56}
CLONE_PARENT = 0x00008000
CLONE_CHILD_SETTID = 0x01000000
# Where glibc's thread descriptor (pthread_self()) keeps the thread's id, found once by find_tid_offset.
TID_OFFSET = None
# (syscall, pthread_self) as ctypes calls, made once by find_tid_offset: made in a cell's process, a fresh fork,
# they took 0.1 to 0.25 ms of every cell's end (copies of the pages ctypes' caches write).
_SIBLING_CALLS = None
# The kinds of anonymous inode a process's own snapshot may hold: none of them reaches its memory. Any other
# (userfaultfd, io_uring, perf events, unknown ones) could write or read the snapshot's memory from its spare.
SAFE_ANON_INODES = ("[eventfd]", "[eventpoll]", "[signalfd]", "[timerfd]", "[pidfd]", "inotify", "[fanotify]")


def find_tid_offset():
    """The offset of the thread id in glibc's thread descriptor, or ``None``; set :data:`TID_OFFSET`.

    fork(2) in glibc writes the child's thread id there (``CLONE_CHILD_SETTID``);
    :func:`sibling_fork` asks the kernel to do the same.  Found as the one offset
    (of the first 1 KiB) that holds the thread's id in this thread and in a
    second one; ``None`` when that is not exactly one place.  Call it before the
    process forks anything (the keeper does, once): it starts and joins a thread.
    """
    global TID_OFFSET, _SIBLING_CALLS
    if os.uname().machine not in SYS_CLONE:
        return None
    try:
        import ctypes

        syscall = ctypes.PyDLL(None, use_errno=True).syscall  # holds the GIL through each call, as os.fork does
        syscall.restype = ctypes.c_long
        self_of = _launch.libc().pthread_self
        self_of.restype = ctypes.c_void_p

        def places():
            base, tid = self_of(), threading.get_native_id()
            return {off for off in range(0, 1024, 4) if ctypes.c_int.from_address(base + off).value == tid}

        other = []
        thread = threading.Thread(target=lambda: other.append(places()))
        thread.start()
        thread.join()
        found = places() & (other[0] if other else set())
    except Exception:  # noqa: BLE001 - no sibling fork, then: every cell takes make_snapshot's way
        return None
    TID_OFFSET = found.pop() if len(found) == 1 else None
    _SIBLING_CALLS = (syscall, self_of) if TID_OFFSET is not None else None
    return TID_OFFSET


def sibling_fork():
    """fork(2), but the child is this process's sibling: its parent is this process's parent (``CLONE_PARENT``).

    The keeper, a cell's parent, is then the spare's parent too, and alone waits
    for it, while the cell's process lives on as its snapshot.  The child runs
    CPython's fork steps (``PyOS_AfterFork_Child``: the runtime's locks and
    threads made anew, then the ``after_in_child`` handlers), and glibc's thread
    id is set in it as its fork sets it.  This process runs no handler of
    :func:`os.register_at_fork`, before or after: with one thread and no cell
    handlers (:func:`own_snapshot_problem`) the base's only take and give back
    locks no other thread can hold (logging's, ``concurrent.futures'``) or stop a
    thread that is not there (IPython history's), and so no Python runs between
    the checks before the fork and the snapshot's stop but cellbox's own.  It
    takes the import lock around the clone, as ``PyOS_BeforeFork`` does (the
    child makes it anew).  Call it with one thread only.  Returns 0 in the child
    and the child's pid here.

    Raises:
        OSError: clone(2) refused (a syscall filter, the run's processes limit), or no sibling fork on this
            machine (:func:`find_tid_offset` found no place).
    """
    import ctypes

    if TID_OFFSET is None or _SIBLING_CALLS is None or os.uname().machine not in SYS_CLONE:
        raise OSError(0, "no sibling fork on this machine")
    python = ctypes.pythonapi  # holds the GIL through each call, as os.fork does
    syscall, self_of = _SIBLING_CALLS
    child_tid = ctypes.c_void_p(self_of() + TID_OFFSET)
    flags = CLONE_PARENT | CLONE_CHILD_SETTID | signal.SIGCHLD
    atfork.chain_forking = True
    _imp.acquire_lock()
    try:
        pid = syscall(ctypes.c_long(SYS_CLONE[os.uname().machine]), ctypes.c_ulong(flags), None, None, child_tid, None)
        error = ctypes.get_errno()
        if pid == 0:
            python.PyOS_AfterFork_Child()
        else:
            _imp.release_lock()
    finally:
        atfork.chain_forking = False
    if pid < 0:
        raise OSError(error, os.strerror(error))
    return pid


def own_snapshot_problem(session_fds):
    """Why this finished command may not become its own snapshot, or ``None`` when it may.

    It may when it has one thread, is not traced, has no children, and no fd
    that reaches its memory from its spare (a ``/proc/PID/mem``, an anonymous
    inode not in :data:`SAFE_ANON_INODES`) or could carry one to it (a socket
    other than ``session_fds``, whose queue may hold fds in flight): a fork
    gives the old way's snapshot a memory of its own, which none of these
    reach.  A cell that registered fork handlers of its own
    (:data:`atfork.registered`) keeps the old way too, where they run in the
    processes they ran in before.  Only a choice of way: the keeper checks the
    stop itself (one task, a real group stop, TracerPid 0, no children).
    """
    if TID_OFFSET is None:
        return "no sibling fork"
    if atfork.registered != atfork.at_base:
        # Its own fork handlers ran in a command that ended and in a snapshot that is a child: so they still do.
        return "fork handlers"
    try:
        with open("/proc/self/status", "rb") as f:
            status = f.read()
        if status_field(status, b"Threads") != b"1":
            return "threads"
        if status_field(status, b"TracerPid") != b"0":
            return "traced"
        with open(f"/proc/self/task/{os.getpid()}/children") as f:
            if f.read().split():
                return "children"
        names = os.listdir("/proc/self/fd")
    except OSError:
        return "unreadable"
    if _holds_record_locks(names):
        # fcntl(2) record locks are the process's and fork does not copy them: the old way's snapshot holds none,
        # and the cell's end lets them go, as ipykernel's next cell may take them again.  Kept, they would hold
        # the file against every later cell.
        return "record locks"
    for name in names:
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue  # the listing's own fd
        if target.startswith("socket:") and int(name) not in session_fds:
            return "a socket"
        if target.startswith("/proc/") and target.endswith("/mem"):
            return "its memory file"
        if target.startswith("anon_inode:") and target[len("anon_inode:") :] not in SAFE_ANON_INODES:
            return target
    return None


def _holds_record_locks(fds):
    """Whether this process holds a POSIX record lock (fcntl(2) ``F_SETLK``, lockf(3)); ``fds`` are its fd names.

    A record lock is held through an open fd (closing any fd of the file lets
    the process's locks on it go: fcntl(2)), and since Linux 4.1 that fd's
    /proc/self/fdinfo lists it as a ``lock:`` line (proc(5)), so the fds are
    read one by one: /proc/locks walks every lock of the machine and took
    12 ms to read on a 2-core machine with none.  Older kernels read
    /proc/locks.  Open file description locks (``OFDLCK``) and flock(2) locks
    belong to the open file, which fork shares, so they do not count.
    ``True`` when nothing can be read (the copy's way is the safe one).
    """
    if KERNEL_RELEASE < (4, 1):
        return _holds_record_locks_machine_wide(os.getpid())
    for name in fds:
        try:
            with open(f"/proc/self/fdinfo/{name}") as f:
                info = f.read()
        except FileNotFoundError:
            continue  # closed since the listing (its own fd)
        except OSError:
            return True
        # "lock:\t1: POSIX  ADVISORY  WRITE 1234 08:01:5678 0 EOF": only the caller's own locks are listed.
        if any(line.split()[2:3] == ["POSIX"] for line in info.splitlines() if line.startswith("lock:")):
            return True
    return False


def _holds_record_locks_machine_wide(pid):
    """:func:`_holds_record_locks` from /proc/locks, for kernels before 4.1."""
    try:
        with open("/proc/locks") as f:
            lines = f.read().splitlines()
    except OSError:
        return True
    mine = str(pid)
    # "1: POSIX  ADVISORY  WRITE 1234 08:01:5678 0 EOF"; a waiter's line has "->" after the number.
    return any(fields[1:2] == ["POSIX"] and fields[4:5] == [mine] for fields in (line.split() for line in lines))


def become_own_snapshot(fd, spare_fd):
    """Make this finished command the next snapshot: fork the next run's spare beside it, name both, stop.

    Returns ``("snapshot", fd)`` here once the keeper continues it as a
    snapshot, ``("spare", spare_fd)`` in the spare, or ``None`` (nothing done
    that :func:`make_snapshot` does not do again) when it may not
    (:func:`own_snapshot_problem`) or the fork was refused.  The spare is the
    keeper's child (:func:`sibling_fork`); this
    process names itself and the spare on ``fd``, and stops (SIGSTOP).  The
    keeper takes that stop, as the OS reports it (waitid(2) ``WSTOPPED``), for
    the command's end, checks it as every stop it keeps (one task, a real group
    stop, not traced: :func:`stop_problem`), and stops the spare before it
    reports the run (:meth:`cellbox.sandbox.keeper.Keeper.own_snapshot`).
    """
    if spare_fd is None:
        return None
    # Nothing of the cell's runs here now: an interrupt for it (even one already caught) is ignored, and no
    # signal reaches a handler of the cell's (the runs a snapshot forks unblock them: prepare_command).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # All blocked, as plain ints: signal.pthread_sigmask would make a Signals member of each (_launch.raw_sigmask).
    blocked = _launch.raw_sigmask(signal.SIG_BLOCK, _launch.ALL_SIGNALS)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    release_streams()
    set_dumpable(False)  # as every snapshot: no later cell may trace it or write its memory
    if own_snapshot_problem({fd, spare_fd}) is not None:
        _launch.raw_sigmask(signal.SIG_SETMASK, blocked)
        return None
    for timer in (signal.ITIMER_REAL, signal.ITIMER_VIRTUAL, signal.ITIMER_PROF):
        signal.setitimer(timer, 0)  # fork(2) does not copy a cell's timers into its snapshot: nor does this
    sequence = random.getstate()
    # All the snapshot does once the spare is forked is made ready before the fork: from the fork on, every page
    # this process writes is a copy (copy-on-write, fork(2)), so it only puts the spare's pid in its word, sends
    # it, lets go of the spare's socket and stops.  Its CPU time goes on counting the cell's: a snapshot keeps no
    # soft CPU limit of a cell's (fork(2) zeroes the spare's time, and every run sets its own: apply_limits).
    head, tail = _snapshot_word(os.getpid(), shared_mappings())
    sock = socket.socket(fileno=os.dup(fd))
    name = _own_name()
    set_name(SNAPSHOT_NAME)  # the spare's name too, until it is a run's (become_snapshot's, but before the fork)
    soft, hard = resource.getrlimit(resource.RLIMIT_CPU)
    resource.setrlimit(resource.RLIMIT_CPU, (hard, hard))
    try:
        spare = sibling_fork()
    except OSError:
        resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))
        set_name(name)
        sock.close()
        _launch.raw_sigmask(signal.SIG_SETMASK, blocked)
        return None
    if spare == 0:
        # It waits on its socket; the keeper stops it before the run's report (a stop of its own
        # could come after the keeper's, and so after the keeper's SIGCONT).
        return _as_spare(fd, spare_fd, sequence, sock)
    # No fork handler ran here (sibling_fork): what the checks found still holds.  A finalizer of the cell's that
    # starts a thread or a child from here on fails the keeper's check of the stop (its state is not kept).
    try:
        sock.send(b"%s%d%s" % (head, spare, tail))
    except OSError:
        os._exit(0)  # the keeper is gone: so is the session
    os.close(spare_fd)  # the next run's request goes to the spare, never through a snapshot (become_snapshot)
    os.kill(os.getpid(), signal.SIGSTOP)
    return "snapshot", fd


def _own_name():
    """This process's name (/proc/self/comm, proc(5)), bytes; ``b""`` when it cannot be read."""
    try:
        with open("/proc/self/comm", "rb") as f:
            return f.read().rstrip(b"\n")
    except OSError:
        return b""


def _snapshot_word(pid, shared):
    """The own snapshot's word to the keeper, ``{"event": "snapshot", "pid", "shared", "spare"}`` as JSON, cut
    where the spare's pid goes, at its end: ``(head, tail)``, bytes."""
    return json.dumps({"event": "snapshot", "pid": pid, "shared": shared})[:-1].encode() + b', "spare": ', b"}"


def release_streams():
    """Put /dev/null on fds 0, 1 and 2 and close the channel's: the run's pipes stay with nobody but the caller."""
    devnull = os.open(os.devnull, os.O_RDWR)
    for target in (0, 1, 2):
        os.dup2(devnull, target)
    os.close(devnull)
    for target in CHANNEL_TARGETS.values():
        try:
            os.close(target)
        except OSError:
            pass


def become_snapshot(spare_fd=None):
    """In a new snapshot: block SIGINT, take the snapshot's name, let go of the spare's socket."""
    if spare_fd is not None:
        os.close(spare_fd)  # the next run's request goes to the spare, never through a snapshot
    # An interrupt meant for the next cell's group never reaches its snapshot.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    set_name(SNAPSHOT_NAME)


def current_directory():
    """The working directory, or ``None`` when it was removed."""
    try:
        return os.getcwd()
    except OSError:
        return None


def replace_environment(env):
    """The run's environment in place of the snapshot's, in ``os.environ``, ``os.environb`` and the C library's."""
    os.environb.clear()
    os.environ.clear()
    os.environ.update(env)
    os.environb.update((key.encode(), value.encode()) for key, value in env.items())
    # tempfile chose its directory from the keeper's TMPDIR if anything asked before the fork.
    tempfile = sys.modules.get("tempfile")
    if tempfile is not None:
        tempfile.tempdir = None


def python_signals():
    """The signal dispositions a new interpreter starts with (prepare_command set them to the default).

    Python's start-up ignores SIGPIPE and SIGXFSZ (so writes fail with EPIPE
    and EFBIG instead) and turns SIGINT into KeyboardInterrupt.
    """
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.default_int_handler)


def close_other_fds(keep):
    """Close every fd but ``keep``: nothing of the keeper or of earlier runs reaches a pristine command."""
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd not in keep:
            try:
                os.close(fd)
            except OSError:
                pass


def reseed():
    """New random state per pristine run: the fork copied the base's (random(3) and numpy alike)."""
    random.seed()
    numpy_random = sys.modules.get("numpy.random")
    if numpy_random is not None:
        try:
            numpy_random.seed()
        except Exception:  # noqa: BLE001
            pass


def prefetch(module):
    """``(spec, code)`` of ``module`` as ``python -m`` would run it, or ``None`` (a package, or not found)."""
    try:
        spec = importlib.util.find_spec(module) if module else None
        if spec is None or spec.loader is None or spec.submodule_search_locations is not None:
            return None
        code = spec.loader.get_code(module)
    except Exception:  # noqa: BLE001 - runpy finds it in the run instead, and reports what is wrong
        return None
    return (spec, code) if code is not None else None


def run_as_main(spec, code):
    """Execute ``code`` in a new ``__main__`` module, with the globals runpy gives a ``python -m`` module."""
    main = types.ModuleType("__main__")
    main.__dict__.update(
        __file__=spec.origin,
        __cached__=spec.cached,
        __loader__=spec.loader,
        __package__=spec.parent,
        __spec__=spec,
        __builtins__=builtins,
    )
    sys.modules["__main__"] = main
    sys.argv[0] = spec.origin
    exec(code, main.__dict__)  # noqa: S102 - the run's own entry module


def run_module(argv):
    """Run ``argv = [python, "-m", module, args...]`` as ``python -m`` does; return the exit status."""
    sys.argv = [argv[0], *argv[3:]]
    # runpy warns when the module was imported before it is run as __main__:
    # here that is the point of the preload, not a mistake of the program's.
    warnings.filterwarnings("ignore", f"'{re.escape(argv[2])}' found in sys.modules", RuntimeWarning, "runpy")
    try:
        if PREFETCHED is not None and PREFETCHED[0].name == argv[2]:
            run_as_main(*PREFETCHED)
        else:
            runpy.run_module(argv[2], run_name="__main__", alter_sys=True)
        return 0
    except SystemExit as exc:
        return exit_status(exc.code)
    except KeyboardInterrupt:
        traceback.print_exc()
        return -signal.SIGINT
    except BaseException:  # noqa: BLE001 - printed as the interpreter would
        sys.excepthook(*sys.exc_info())
        return 1


def exit_status(code):
    """``sys.exit(code)``'s exit status (see sys.exit)."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def finish(status):
    """End as the interpreter ends: join threads, run atexit, flush; die of SIGINT after KeyboardInterrupt."""
    try:
        threading._shutdown()  # type: ignore[attr-defined]
    except BaseException:  # noqa: BLE001
        pass
    try:
        atexit._run_exitfuncs()
    except BaseException:  # noqa: BLE001
        pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:  # noqa: BLE001
            pass
    if status < 0:
        signal.signal(-status, signal.SIG_DFL)
        os.kill(os.getpid(), -status)
        status = 128 - status
    os._exit(status)


# --------------------------------------------------------------------------- a snapshot


def serve_snapshot(sock):
    """A snapshot's loop: fork one run per request.  Returns never; a forked run may continue it as a new snapshot."""
    while True:
        request, fds = receive(sock)
        if request is None:
            os._exit(0)
        following = fork_run(sock, request, fds)
        if following is not None:
            sock = following  # this process is now the next snapshot


def fork_run(sock, request, fds):
    """Fork the run's command twice over (so the keeper is its parent); reply with its pid.

    Returns the next snapshot's socket in a snapshot the command made, else
    ``None`` (in this snapshot, after the reply).
    """
    named = dict(zip(request["handoff"], fds, strict=True))
    pid_r, pid_w = os.pipe()
    sequence = random.getstate()
    middle = atfork.chain_fork()
    if middle == 0:
        command = -1
        try:
            os.close(pid_r)
            command = atfork.chain_fork()
            if command:
                os.write(pid_w, str(command).encode())
        finally:
            if command != 0:
                os._exit(0)  # the middle process: its only job was the fork
        try:
            # The random module reseeds itself in every child of a fork (os.register_at_fork): a run
            # carried on from a snapshot keeps the cell's sequence (a pristine one is reseeded later).
            random.setstate(sequence)
            os.close(pid_w)
            sock.close()
            request, named = wait_for_go(request, named)
            return command_main(request, named)  # returns only in the next snapshot
        except BaseException:  # noqa: BLE001 - never back into this snapshot's loop as a command
            os._exit(1)
    os.close(pid_w)
    for fd in fds:
        os.close(fd)
    data = b""
    while True:
        chunk = os.read(pid_r, 64)
        if not chunk:
            break
        data += chunk
    os.close(pid_r)
    # Reaped first: the command is then the keeper's child, which the keeper checks.
    os.waitpid(middle, 0)
    send_json(sock, {"pid": int(data)} if data else {"error": "the run's command could not be forked"})
    return None


def wait_for_go(request, named):
    """In a command just forked: wait until the keeper has checked the snapshot's reply; the run's request.

    A run's command waits for one byte on its ``go`` pipe (end of file: the
    snapshot's reply named another process, and it leaves).  A **spare**, forked
    ahead of its run, waits on its own socket for the run's request and pipes,
    which the keeper sends when the run comes (end of file: it was discarded).
    """
    if "spare" in named:
        with socket.socket(fileno=named.pop("spare")) as spare:
            request, fds = receive(spare)
        if request is None:
            os._exit(0)
        return request, dict(zip(request["handoff"], fds, strict=True))
    go = named.pop("go")
    if os.read(go, 1) != b"x":
        os._exit(0)
    os.close(go)
    return request, named


def signal_scope_problem():
    """Enter a Landlock domain that only scopes signals (``_launch.apply_signal_scope``); why not, or ``None``."""
    read_end, write_end = os.pipe()
    try:
        _launch.apply_signal_scope(write_end)
    finally:
        os.close(write_end)
    text = os.read(read_end, 65536).decode(errors="replace")
    os.close(read_end)
    notes = [json.loads(line).get("text", "") for line in text.splitlines() if line.strip()]
    return "; ".join(notes) or None


def start_base(sock, config):
    """In ``S0``: join the session's Landlock domain, build the warm shell, say hello, serve.

    It stays not dumpable, as every snapshot: no run may trace it or write its memory.
    """
    set_dumpable(False)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    set_name(SNAPSHOT_NAME)
    landlock = config.get("landlock")
    problem = None
    if landlock:
        try:
            _launch.apply_landlock(landlock)
        except OSError as exc:
            if landlock.get("required"):
                os._exit(1)
            problem = f"landlock: not applied ({exc.strerror or exc})"
    else:
        # No Landlock layer: the session's runs still may not signal or trace the keeper.
        problem = signal_scope_problem()
    warmed = warm(config.get("warm"))
    atfork.at_base = atfork.registered
    try:
        os.setpriority(os.PRIO_PROCESS, 0, max(SNAPSHOT_NICE, os.getpriority(os.PRIO_PROCESS, 0)))
    except OSError:
        pass
    size, _resident = vm_size()
    send_json(sock, {"event": "snapshot", "pid": os.getpid(), "landlock": problem, "warmed": warmed, "vm_size": size})
    serve_snapshot(sock)


def vm_size():
    """This process's address space and resident memory, bytes (/proc/self/statm)."""
    with open("/proc/self/statm") as f:
        size, resident = f.read().split()[:2]
    page = os.sysconf("SC_PAGE_SIZE")
    return int(size) * page, int(resident) * page


def own_child(pid, besides=()):
    """Whether ``pid``, a word from a snapshot or a command (checked, never trusted), is a child of this process.

    A zombie not yet reaped counts (a command may already have ended); a pid
    in ``besides`` (the snapshots, which a run or a spare can never be) does not.
    """
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 1 or pid in besides:
        return False
    state = process_state(pid)
    return state is not None and state[1] == os.getpid()


# Bytes asked of each read of a /proc or cgroup file (read_proc).
PROC_READ = 65536


def read_proc(path):
    """The bytes of the /proc or cgroup file ``path``, read with os.read.  Raises OSError.

    The keeper reads about forty such files at the end of every cell; each
    through ``open()`` built a file object first, which took as long as the read
    (stat: 12.5 us against 7.7 us; children: 11.2 us against 5.3 us).  One read
    of 64 KiB takes the whole of most; a read that fills it is followed by
    more (a ``children`` file lists every child, and a seq_file read falls
    short of the size asked only at its end).
    """
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks = [os.read(fd, PROC_READ)]
        while len(chunks[-1]) == PROC_READ:
            chunks.append(os.read(fd, PROC_READ))
    finally:
        os.close(fd)
    return b"".join(chunks) if len(chunks) > 1 else chunks[0]


def process_state(pid):
    """``(state letter, ppid, threads)`` of ``pid`` from /proc, or ``None`` when it is gone."""
    try:
        fields = read_proc(f"/proc/{pid}/stat").rsplit(b")", 1)[1].split()
        return fields[0].decode(), int(fields[1]), int(fields[17])
    except (OSError, IndexError, ValueError):
        return None


# --------------------------------------------------------------------------- the chain, as the keeper holds it


# Seconds a process the keeper stops may take to be stopped; one that is not by then is killed.
STOP_TIMEOUT = 5.0
# Pids the keeper stopped and took the stop report of (waitid(2) WSTOPPED): any later report of theirs is a
# stop it did not make, so something continued them meanwhile (see Keeper.check_stopped).
HELD: set[int] = set()


def stop_process(pid):
    """SIGSTOP ``pid`` until it is in a real group stop; SIGKILL it if it is traced, or not stopped in time.

    The stop is sent again while waiting: a SIGCONT sent meanwhile discards a
    pending SIGSTOP (signal(7)).  Stopped means every thread in the group stop
    and none traced (:func:`stop_problem`): a traced thread turns SIGSTOP into
    a ptrace stop its tracer may end (PTRACE_CONT sends no SIGCONT), and an
    untraced thread beside it runs on.  A snapshot or spare the keeper cannot
    keep stopped is not kept at all.

    Returns:
        ``None`` when it is stopped (or already gone), else why it was killed:
        ``"it was traced (by pid 12)"``, ``"it did not stop (state S)"``.
    """
    deadline = time.monotonic() + STOP_TIMEOUT
    pause = 0.0002
    while True:
        try:
            os.kill(pid, signal.SIGSTOP)
        except OSError:
            return None
        problem = stop_problem(pid)
        if problem is None:
            take_stop_report(pid)
            return None
        if problem.startswith("it was traced") or time.monotonic() >= deadline:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
            return problem
        time.sleep(pause)
        pause = min(pause * 2, 0.05)


def stop_problem(pid, status=None):
    """Why ``pid`` is not held in a real group stop, or ``None`` when it is (or when it has ended).

    Read from /proc/PID/task/TID/status of each thread (proc(5)): every live
    thread must be in state ``T`` (stopped by a signal), not ``t`` (a ptrace
    stop), with ``TracerPid`` 0.  A zombie thread group leader whose other
    threads still run (the leader called exit(2) alone) is not stopped either.
    Who calls it: :func:`stop_process`, and the keeper before it continues a
    snapshot or the spare and after every run
    (:meth:`cellbox.sandbox.keeper.Keeper.check_held`).  ``status``: the
    process's /proc/PID/status when the caller has just read it.
    """
    try:
        status = read_proc(f"/proc/{pid}/status") if status is None else status
    except OSError:
        return None
    # One thread, alive: the process's own status is its thread's (most snapshots and spares: one read, not two).
    if status_field(status, b"Threads") == b"1" and status_field(status, b"State")[:1] != b"Z":
        return _thread_stop_problem(status)
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    for tid in tids:
        try:
            problem = _thread_stop_problem(read_proc(f"/proc/{pid}/task/{tid}/status"))
        except OSError:
            continue  # a thread that ended meanwhile
        if problem is not None:
            return problem
    return None


def status_field(status, name):
    """The value of field ``name`` (bytes) of a /proc/PID/status text ``status`` (bytes), or ``b""``.

    Looked for after the first line, ``Name:``, which holds the process's name (set by the process itself).
    """
    start = status.find(b"\n%s:" % name, status.find(b"\n"))
    if start < 0:
        return b""
    end = status.find(b"\n", start + 1)
    return status[start + len(name) + 2 : end if end >= 0 else len(status)].strip()


def _thread_stop_problem(status):
    """Why the thread whose /proc status text (bytes) is ``status`` is not in a group stop, or ``None``."""
    tracer = status_field(status, b"TracerPid").decode(errors="replace")
    if tracer not in ("", "0"):
        return f"it was traced (by pid {tracer})"
    state = status_field(status, b"State")[:1].decode(errors="replace") or "?"
    if state not in ("T", "Z", "X"):
        return f"it did not stop (state {state})"
    return None


def take_stop_report(pid):
    """Take the report of the stop the keeper just made of ``pid`` (all its threads are in ``T``), and hold it.

    The thread that completes a group stop sets the report before it takes state
    ``T`` (kernel/signal.c, do_signal_stop), so a fresh stop's report is there
    now.  One already held has none left to take: a report found for it is
    another's stop, which :meth:`cellbox.sandbox.keeper.Keeper.check_stopped`
    must see.
    """
    if pid in HELD:
        return
    try:
        os.waitid(os.P_PID, pid, os.WSTOPPED | os.WNOHANG)
    except ChildProcessError:
        return  # not (yet) the keeper's child
    HELD.add(pid)


def continue_process(pid):
    """SIGCONT ``pid`` (the keeper's own continuing), and consume the ``continued`` report it makes (waitid(2)).

    SIGCONT's continuing happens when it is sent, so the report is there at
    once; any later one for a snapshot or the spare is someone else's SIGCONT
    (see :meth:`cellbox.sandbox.keeper.Keeper.check_stopped`), and one found
    here, before the keeper's own, is too.

    Raises:
        OSError: it was continued from outside since the keeper stopped it, it is traced or
            not in a real group stop (:func:`stop_problem`; it is then killed), or it is gone.
    """
    try:
        # A stop report of a held process is a stop after someone else's SIGCONT (it ran meanwhile).
        earlier = os.waitid(os.P_PID, pid, os.WCONTINUED | (os.WSTOPPED if pid in HELD else 0) | os.WNOHANG)
    except ChildProcessError:
        earlier = None  # not (yet) the keeper's child: it reports to its parent
    if earlier is not None:
        raise OSError(0, "it was continued from outside the session (SIGCONT)")
    HELD.discard(pid)
    problem = stop_problem(pid)
    if problem is not None:
        # Traced, or running already: whatever a cell left in it has run between cells.
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
        raise OSError(0, f"{problem}, so it was killed")
    os.kill(pid, signal.SIGCONT)
    try:
        os.waitid(os.P_PID, pid, os.WCONTINUED | os.WNOHANG)
    except ChildProcessError:
        pass


class Snapshot:
    """The keeper's handle on one snapshot process: its pid and its socket; stopped while nobody needs it."""

    # What its command said of its shared memory mappings (keeper.checked_shared): writes there outlive a stop
    # and an undo, so the kernel names them.  None for the base.
    shared = {"count": 0, "bytes": 0, "names": []}
    # What made it, once kept (Chain.settle): a "cell", or a "comm" run (a frontend's comm message).
    kind = "cell"
    # Pids of snapshots and spares killed and not yet reaped (the keeper's): a large image takes a while to go,
    # and a run killed meanwhile must not count them as its own processes.
    dying: set[int] = set()

    def __init__(self, pid, sock):
        self.pid = pid
        self.sock = sock

    def stop(self):
        """SIGSTOP it and wait until it is stopped; ``None``, or why it was killed instead (:func:`stop_process`)."""
        return stop_process(self.pid)

    def kill(self):
        try:
            os.kill(self.pid, signal.SIGKILL)
            Snapshot.dying.add(self.pid)
        except OSError:
            pass
        self.sock.close()

    def fork(self, request, fds, spared):
        """Continue this snapshot, have it fork a run, stop it again; the command's pid.  Raises OSError.

        ``spared`` are the session's snapshots, which the command cannot be.
        """
        self.ask_fork(request, fds)
        return self.forked(spared, SNAPSHOT_TIMEOUT)

    def ask_fork(self, request, fds):
        """The first half of :meth:`fork`: continue this snapshot and send it the request.  Raises OSError."""
        try:
            # What is queued before the request is no reply to it: a process of the run the snapshot came from
            # may have sent words on this socket after the keeper read them, until the run's end killed it.
            queued_words(self.sock)
            continue_process(self.pid)
            self.sock.settimeout(SNAPSHOT_TIMEOUT)
            send_json(self.sock, request, fds)
        except OSError:
            self.stop()
            raise

    def forked(self, spared, timeout):
        """The second half of :meth:`fork`: its reply within ``timeout`` seconds, checked; the command's pid.

        Stops the snapshot again whatever the reply.  Raises OSError.
        """
        try:
            self.sock.settimeout(timeout)
            data = self.sock.recv(65536)
        finally:
            self.stop()
        try:
            reply = json.loads(data) if data else {"error": "the snapshot is gone"}
            pid = reply["pid"] if isinstance(reply, dict) else None
        except (ValueError, KeyError):
            raise OSError(0, "the snapshot's reply named no process") from None
        if not own_child(pid, spared):
            raise OSError(0, "the snapshot named a process that is not the run's command")
        return pid


def keep_state(states, state, undo_depth):
    """Put the newly kept ``state`` on top of ``states`` (oldest first); ``(replaced, evicted)``, the states let go.

    Each state's ``kind`` is ``"cell"`` or ``"comm"`` (the run of a frontend's
    comm message: a widget event), and ``%undo`` counts cells, not widget
    events.  So a comm state replaces a comm state on top: above each cell's
    state at most one is kept, the last event's, which is what the next cell
    starts from.  And states go from the front only while more than
    ``undo_depth`` cells' states are above the oldest kept one (the floor an
    undo stops at once one was let go), however many widget events came
    between.  The keeper's :class:`Chain` and the kernel's record of comms
    (:class:`cellbox.kernel.comms.CommRecord`) both follow this rule, so they
    agree on what an undo of N cells drops.
    """
    replaced = []
    if state.kind == "comm" and states and states[-1].kind == "comm":
        replaced.append(states.pop())
    states.append(state)
    evicted = []
    while len(states) > 1 and sum(1 for kept in states[1:] if kept.kind == "cell") > undo_depth:
        evicted.append(states.pop(0))
    return replaced, evicted


class Chain:
    """The session's snapshots, as the keeper holds them.

    ``base`` is ``S0`` (no run has changed it); ``kept`` are the kept
    snapshots, oldest first, the last being the session's state; ``pending`` is
    the newest, until its owner settles it.  What is kept follows
    :func:`keep_state`: ``undo_depth`` cells' states above the oldest kept,
    each with at most one widget event's after it; ``evicted`` says an older
    one was let go, so ``undo`` stops above the base.
    """

    def __init__(self, undo_depth):
        self.undo_depth = undo_depth
        self.base = None
        self.kept = []
        self.pending = None
        self.evicted = False

    def empty(self):
        """``True`` when no snapshot is left to fork from."""
        return self.base is None and not self.kept

    def current(self):
        """The snapshot that holds the session's state (``None`` before any run was kept)."""
        return self.kept[-1] if self.kept else None

    def sources(self, carried):
        """The snapshots to fork a run from, in order: the latest kept one, then older ones, then the base."""
        older = list(reversed(self.kept)) if carried else []
        return [*older, *([self.base] if self.base is not None else [])]

    def snapshots(self):
        """The base and the kept snapshots, oldest first."""
        return [*([self.base] if self.base is not None else []), *self.kept]

    def pids(self):
        """Pids of every snapshot (base, kept, pending): the processes the end of a run must not kill."""
        found = {snap.pid for snap in self.kept}
        if self.base is not None:
            found.add(self.base.pid)
        if self.pending is not None:
            found.add(self.pending.pid)
        return found

    def remove(self, snapshot):
        """Kill ``snapshot`` and take it out of the chain (it misbehaved)."""
        snapshot.kill()
        self.kept = [snap for snap in self.kept if snap is not snapshot]
        if snapshot is self.base:
            self.base = None
        if snapshot is self.pending:
            self.pending = None

    def forget(self, pid):
        """A snapshot that died (killed by hand, or by the OOM killer) is no longer the state."""
        if self.base is not None and self.base.pid == pid:
            self.base = None
        self.kept = [snap for snap in self.kept if snap.pid != pid]
        if self.pending is not None and self.pending.pid == pid:
            self.pending = None

    def offer(self, snapshot, stop=True):
        """Take ``snapshot`` as the pending one, stopped; ``False`` (and nothing kept) when one is pending already.

        With ``stop=False`` the caller stops it: the keeper asks a new snapshot
        for the next spare at once, and stops it when it has answered.
        """
        if self.pending is not None or snapshot.pid in self.pids():
            return False
        self.pending = snapshot
        if stop:
            snapshot.stop()
        return True

    def settle(self, keep, kind="cell"):
        """Keep the pending snapshot as the state, or drop it; ``True`` if kept.

        ``kind`` is what made it, a ``"cell"`` or a ``"comm"`` run; the
        snapshots :func:`keep_state` lets go are killed.
        """
        pending, self.pending = self.pending, None
        if pending is None:
            return False
        if not keep:
            pending.kill()
            return False
        pending.kind = "comm" if kind == "comm" else "cell"
        replaced, evicted = keep_state(self.kept, pending, self.undo_depth)
        for snapshot in (*replaced, *evicted):
            snapshot.kill()
        self.evicted = self.evicted or bool(evicted)
        return True

    def depth_if_kept(self):
        """How many snapshots :meth:`settle` would leave kept if it kept the pending one as a cell's."""
        kinds = [types.SimpleNamespace(kind=snap.kind) for snap in self.kept]
        keep_state(kinds, types.SimpleNamespace(kind="cell"), self.undo_depth)
        return len(kinds)

    def let_go(self):
        """Kill the oldest kept snapshot, never the session's state; the one let go, or ``None`` when none could be.

        The session's memory is short (see :meth:`cellbox.sandbox.ForkServer.let_go`): ``undo`` stops above the
        base from then on, as when :func:`keep_state` lets one go.
        """
        if len(self.kept) < 2:
            return None
        oldest = self.kept.pop(0)
        oldest.kill()
        self.evicted = True
        return oldest

    def undo(self, count):
        """Drop the newest ``count`` kept snapshots; how many went.

        The base is the state before every cell: a way back only while no
        snapshot was let go.
        """
        undone = 0
        floor = 1 if self.evicted else 0
        while undone < count and len(self.kept) > floor:
            self.kept.pop().kill()
            undone += 1
        return undone
