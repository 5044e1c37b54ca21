"""Child side of the session: a keeper that never runs cell code, and the snapshots runs are forked from.

Standard library only until the preload list is imported.  The parent
(:class:`cellbox.forkserver.ForkServer`) starts this module through the sandbox
core's launcher, ``python -m cellbox._forkserver_child CONFIG``, inside the
session's isolation (its namespaces, user and pids cgroup), so the whole
session runs with the scrubbed environment, under rlimits, in a tree the
launcher kills with everything in it.  Its fd 3 is one end of a
``SOCK_SEQPACKET`` socket pair that only the kernel holds.

Who is who (one session)::

    kernel ──socket──> keeper K (this module's main; trusted: never runs cell code)
                        ├── base snapshot S0  (forked once: warm shell, no cell has run in it)
                        ├── snapshots S1..Sn  (each a fork of a finished cell: its state)
                        └── cell C            (forked from Sn, or from S0 for a pristine run)

* The **keeper** imports the preload list, forks ``S0``, and then only
  supervises: it is a child subreaper (every process of a run ends up its
  child), not dumpable (prctl(2) ``PR_SET_DUMPABLE``: no ptrace, no
  ``/proc/K/mem`` or ``environ`` for anyone of its user), and outside the
  Landlock domain its snapshots and cells are in, so none of them can signal
  or trace it (landlock(7), ``LANDLOCK_SCOPE_SIGNAL``).  Per run it obeys the
  control pipe (``interrupt``, ``kill``), reaps, kills every process of the run
  when its command ends, and writes the launcher's JSON exit record on the
  status pipe.
* A **snapshot** is a process image that holds a session's state, so it
  holds a cell's memory: nothing it says is trusted.  It is not dumpable (no
  later cell may trace it or write its memory), and stopped (SIGSTOP) while
  nobody needs it, so no work of a cell runs between cells; the keeper
  continues it to fork one run, then stops it again.  It forks twice, so the
  run's command is re-parented to the keeper, which alone waits for it (its
  exit status and rusage come from wait4(2) in the keeper).  The command
  waits for one byte on a pipe from the keeper, written only once the keeper
  has checked that the pid the snapshot named is its own child; a snapshot
  that names another is dropped with whatever it started, and the run is
  forked from the snapshot before it.
* A **run's command** applies the run's limits (soft limits: a snapshot keeps
  the hard limits it started with, so a later cell can be given more) and runs
  its module.  When the run asks for a snapshot and its command finishes the
  module alive, it forks the next snapshot (its main thread only: fork(2)
  copies the calling thread) before it exits; that process closes the run's
  pipes, says hello on its own socket, and waits.  The kernel then keeps it
  (``settle``) or drops it.

Requests on the kernel's socket, one JSON message each (fds beside, as
SCM_RIGHTS, unix(7)), one reply each: ``run`` (the run's spec and pipes;
reply: the command's pid), ``settle`` (keep or drop the newest snapshot),
``undo`` (drop the last N kept snapshots), ``stat`` (sizes).
"""

import atexit
import builtins
import gc
import importlib
import importlib.util
import json
import math
import os
import random
import re
import resource
import runpy
import select
import signal
import socket
import sys
import threading
import time
import traceback
import types
import warnings

from cellbox import _launch

# The fds a hand-off carries, in the order the parent sends them ("stdin" and
# the channel's two only when the run has them).
HANDOFF_NAMES = ("status", "control", "stdout", "stderr", "stdin", "message", "reply")
MAX_MESSAGE = 1024 * 1024
MAX_FDS = len(HANDOFF_NAMES) + 2  # and, from the keeper to a snapshot, "go" and "snapshot"
PR_SET_NAME = 15
PR_SET_DUMPABLE = 4
SNAPSHOT_NAME = b"cellbox-snap"
KEEPER_NAME = b"cellbox-keeper"
# Where the channel's ends go in the command, as for a spawned command (sandbox.CHANNEL_FDS).
CHANNEL_TARGETS = {"message": 3, "reply": 4}
# Seconds a snapshot may take to fork a run, and a finished command to say its snapshot is there.
SNAPSHOT_TIMEOUT = 5.0
# Seconds between two looks at a run's CPU time, for a run that keeps soft limits only.
CPU_CHECK = 0.1
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
# (spec, code) of the warmed module's ``python -m`` entry, found once by the keeper.
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
    """One message and its fds; ``(None, [])`` at end of file."""
    data, fds, _flags, _addr = socket.recv_fds(sock, MAX_MESSAGE, MAX_FDS)
    if not data:
        for fd in fds:
            os.close(fd)
        return None, []
    return json.loads(data), fds


# --------------------------------------------------------------------------- preload


def preload(names):
    """Import ``names``; return ``(loaded, {name: reason})``."""
    if "cellbox.cellrunner" in names:
        prepare_entry("cellbox.cellrunner")
    loaded, failed = [], {}
    for name in names:
        try:
            importlib.import_module(name)
            loaded.append(name)
        except Exception as exc:  # noqa: BLE001 - a module that is not installed is reported, not fatal
            failed[name] = f"{type(exc).__name__}: {exc}"
    return loaded, failed


def prepare_entry(module):
    """What an entry module does to the process before its imports, done again in each child.

    The cell runner picks matplotlib's backend through ``MPLBACKEND`` before
    matplotlib is imported; matplotlib reads it once, at import, so with
    matplotlib already imported the child must set it again.
    """
    if module == "cellbox.cellrunner":
        from cellbox import cellrunner

        cellrunner._prepare_process({})
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
    module's exit status.
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
            sys.path[0] = os.getcwd()  # as `python -m` puts the working directory first
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
    if status in (0, 1) and make_snapshot(snapshot):
        return socket.socket(fileno=snapshot)  # here, in the new snapshot
    # A cell's run: threads it left are not waited for, they end with it (the runner said so).
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(status)


def make_snapshot(fd):
    """Fork the next snapshot from this finished command; ``True`` in the snapshot, ``False`` never returns here.

    The command waits until the snapshot has said hello on its socket, so the
    keeper finds the hello when it reaps the command.  Returns ``True`` in the
    new snapshot; in the command it returns ``False`` (the caller then ends it).
    """
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    ready_r, ready_w = os.pipe()
    # Born not dumpable: no later cell may trace a snapshot or write its memory (ptrace(2),
    # process_vm_writev(2)); this command ends right after the fork anyway.
    set_dumpable(False)
    try:
        pid = os.fork()
    except OSError:
        return False
    if pid == 0:
        try:
            os.close(ready_r)
            become_snapshot(fd)
            os.write(ready_w, b"x")
            os.close(ready_w)
            return True
        except BaseException:  # noqa: BLE001 - a snapshot that cannot start leaves quietly
            os._exit(0)
    os.close(ready_w)
    select.select([ready_r], [], [], SNAPSHOT_TIMEOUT)
    os.close(ready_r)
    return False


def become_snapshot(fd):
    """In a new snapshot: let go of the run's streams and channel, say hello, block SIGINT."""
    devnull = os.open(os.devnull, os.O_RDWR)
    for target in (0, 1, 2):
        os.dup2(devnull, target)
    os.close(devnull)
    for target in CHANNEL_TARGETS.values():
        try:
            os.close(target)
        except OSError:
            pass
    # An interrupt meant for the next cell's group never reaches its snapshot.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    set_name(SNAPSHOT_NAME)
    send_json(socket.socket(fileno=os.dup(fd)), {"event": "snapshot", "pid": os.getpid()})


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
    middle = os.fork()
    if middle == 0:
        command = -1
        try:
            os.close(pid_r)
            command = os.fork()
            if command:
                os.write(pid_w, str(command).encode())
        finally:
            if command != 0:
                os._exit(0)  # the middle process: its only job was the fork
        try:
            os.close(pid_w)
            sock.close()
            # The command waits until the keeper has checked the reply: one byte to go,
            # end of file not to (the snapshot's reply named another process).
            go = named.pop("go")
            if os.read(go, 1) != b"x":
                os._exit(0)
            os.close(go)
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
    size, _resident = vm_size()
    send_json(sock, {"event": "snapshot", "pid": os.getpid(), "landlock": problem, "warmed": warmed, "vm_size": size})
    serve_snapshot(sock)


# --------------------------------------------------------------------------- the keeper


def process_state(pid):
    """``(state letter, ppid, threads)`` of ``pid`` from /proc, or ``None`` when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return fields[0].decode(), int(fields[1]), int(fields[17])
    except (OSError, IndexError, ValueError):
        return None


def subtree(root):
    """Live descendants of ``root``, from /proc/PID/task/TID/children (proc(5)).

    Reads only the subtree, not all of /proc; falls back to the launcher's scan
    of /proc where the kernel has no ``children`` files.
    """
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tasks:
            try:
                with open(f"/proc/{pid}/task/{tid}/children") as f:
                    children = [int(child) for child in f.read().split()]
            except FileNotFoundError:
                if pid == root and tid == tasks[0]:
                    return _launch.descendants(root)
                continue
            except (OSError, ValueError):
                continue
            for child in children:
                state = process_state(child)
                if state is not None and state[0] != "Z":
                    found.append(child)
                todo.append(child)
    return found


def cpu_seconds(pid):
    """User and system CPU seconds of ``pid`` so far (/proc/PID/stat), 0 when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
    except (OSError, IndexError, ValueError):
        return 0.0


def resident_of(pid):
    """Resident bytes of ``pid`` (/proc/PID/statm, cheap), 0 when unreadable."""
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError, TypeError):
        return 0


def memory_of(pid):
    """``{"rss": bytes, "pss": bytes}`` of ``pid`` (/proc/PID/smaps_rollup), zeros when unreadable."""
    sizes = {"rss": 0, "pss": 0}
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in ("Rss", "Pss"):
                    sizes[key.lower()] = int(rest.split()[0]) * 1024
    except (OSError, ValueError):
        pass
    return sizes


class Snapshot:
    """One kept process image, stopped while nobody needs it."""

    def __init__(self, pid, sock):
        self.pid = pid
        self.sock = sock

    def stop(self):
        try:
            os.kill(self.pid, signal.SIGSTOP)
        except OSError:
            pass

    def kill(self):
        try:
            os.kill(self.pid, signal.SIGKILL)
        except OSError:
            pass
        self.sock.close()

    def fork(self, request, fds, spared):
        """Continue this snapshot, have it fork a run, stop it again; the command's pid.  Raises OSError.

        ``spared`` are the session's snapshots, which the command cannot be.
        """
        try:
            os.kill(self.pid, signal.SIGCONT)
            self.sock.settimeout(SNAPSHOT_TIMEOUT)
            send_json(self.sock, request, fds)
            data = self.sock.recv(65536)
        finally:
            self.stop()
        # A snapshot holds a cell's memory: its word is checked, never trusted. The
        # command must be a child of the keeper's (perhaps already ended, a zombie
        # not yet reaped) that is not a snapshot.
        try:
            reply = json.loads(data) if data else {"error": "the snapshot is gone"}
            pid = reply["pid"] if isinstance(reply, dict) else None
        except (ValueError, KeyError):
            raise OSError(0, "the snapshot's reply named no process") from None
        state = process_state(pid) if isinstance(pid, int) and not isinstance(pid, bool) and pid > 1 else None
        if state is None or state[1] != os.getpid() or pid in spared:
            raise OSError(0, "the snapshot named a process that is not the run's command")
        return pid


class Run:
    """The one run the keeper supervises: its pipes, its command, its accounts."""

    def __init__(self, request, named, pid, following):
        self.spec = request
        self.status_fd = named["status"]
        self.control_fd = named["control"]
        self.pid = pid
        self.following = following  # the keeper's end of the next snapshot's socket, or None
        self.status = None
        self.rusage = None
        self.peak_kib = 0
        self.killed = set()
        self.kill_requested = False
        self.cpu_before = self.children_cpu()
        # Only a run that becomes a snapshot keeps soft limits alone, and needs its hard CPU limit kept here.
        cpu = float(request["limits"]["cpu_time"])
        self.cpu_hard = math.ceil(cpu) + 1 if following is not None else None
        self.refusals_before = None

    @staticmethod
    def children_cpu():
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        return usage.ru_utime + usage.ru_stime


class Keeper:
    """The session's trusted supervisor: the snapshot chain and the run now going."""

    def __init__(self, sock, config):
        self.sock = sock
        self.config = config
        self.undo_depth = int(config.get("undo_depth", 0))
        self.base = None
        self.kept = []  # snapshots, oldest first; the last is the current state
        self.pending = None  # the newest snapshot, until the kernel settles it
        self.evicted = False  # an older snapshot was let go beyond the undo depth
        self.run = None
        self.wake_r = None

    # ---------------------------------------------------------------- start

    def start_base(self):
        """Fork ``S0`` and wait for its hello; the hello's facts (Landlock) for the ready message."""
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        pid = os.fork()
        if pid == 0:
            try:
                self.sock.close()
                mine.close()
                start_base(theirs, self.config)
            finally:
                os._exit(1)
        theirs.close()
        mine.settimeout(self.config.get("ready_timeout", 120))
        hello, _fds = receive(mine)
        if not hello or hello.get("pid") != pid:
            raise OSError(0, "the base snapshot did not start")
        self.base = Snapshot(pid, mine)
        self.base.stop()
        return hello

    # ---------------------------------------------------------------- loop

    def serve(self):
        wake_r, _wake_w = _launch.supervisor_signals()
        self.wake_r = wake_r
        while True:
            watched = [self.sock, wake_r]
            if self.run is not None:
                watched.append(self.run.control_fd)
            # A run whose command keeps its hard limits (a snapshot's) is held to
            # RLIMIT_CPU's hard limit here: looked at every CPU_CHECK seconds.
            timeout = CPU_CHECK if self.run is not None and self.run.cpu_hard is not None else None
            ready, _, _ = select.select(watched, [], [], timeout)
            if self.run is not None and self.run.cpu_hard is not None:
                self.enforce_cpu()
            if wake_r in ready:
                try:
                    os.read(wake_r, 4096)
                except OSError:
                    pass
            if self.run is not None and self.run.control_fd in ready:
                self.on_control()
            self.reap()
            if self.run is not None and self.run.status is not None:
                self.end_run()
            if self.sock in ready and not self.on_request():
                return

    def on_request(self):
        """One request from the kernel; ``False`` when the kernel is gone."""
        try:
            request, fds = receive(self.sock)
        except OSError:
            return False
        if request is None:
            return False
        op = request.get("op", "run")
        if op == "run":
            reply = self.start_run(request, fds)
        elif op == "settle":
            reply = self.settle(bool(request.get("keep")))
        elif op == "undo":
            reply = self.undo(int(request.get("n", 1)))
        elif op == "stat":
            reply = self.stat()
        else:
            reply = {"error": f"unknown request {op!r}"}
        send_json(self.sock, reply)
        return True

    # ---------------------------------------------------------------- runs

    def start_run(self, request, fds):
        """Fork the run from the snapshot it names; reply with the command's pid.

        A snapshot that does not fork the run as asked (its reply names another
        process, or none: cell code runs in it) is dropped with whatever it
        started, and the run is forked from the snapshot before it; the run's
        notes say its state is older than asked.
        """
        named = dict(zip(request["handoff"], fds, strict=True))
        if self.run is not None or source_missing(self):
            for fd in fds:
                os.close(fd)
            return {"error": "the session is busy with another run" if self.run else "the base snapshot is gone"}
        if self.pending is not None:
            self.settle(False)  # never settled: the kernel moved on without it
        self.set_processes(request)
        problem = None
        try:
            for source in self.sources(request):
                pid, following, problem = self.fork_from(source, request, named)
                if pid is not None:
                    if problem:
                        _launch.note(named["status"], problem)
                    self.run = Run(request, named, pid, following)
                    self.run.refusals_before = self.pids_refusals()
                    return {"pid": pid}
        finally:
            # The command has its own copies now; the keeper keeps only status and control.
            for name in named:
                if name not in ("status", "control"):
                    os.close(named[name])
        for name in ("status", "control"):
            os.close(named[name])
        return {"error": problem or "no snapshot could fork the run"}

    def sources(self, request):
        """The snapshots to fork the run from, in order: the latest kept one, then older ones, then the base."""
        carried = list(reversed(self.kept)) if request.get("from") == "current" else []
        return [*carried, *([self.base] if self.base is not None else [])]

    def fork_from(self, source, request, named):
        """One try: ``(pid, following socket, note)``, or ``(None, None, why)`` after dropping ``source``."""
        following = theirs = None
        if request.get("snapshot"):
            following, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        go_r, go_w = os.pipe()
        names = [name for name in named if name != "control"] + ["go"] + (["snapshot"] if theirs else [])
        carried = [named[name] for name in names if name not in ("go", "snapshot")] + [go_r]
        carried += [theirs.fileno()] if theirs else []
        try:
            pid = source.fork(dict(request, handoff=names), carried, self.keepers())
            os.write(go_w, b"x")
            return pid, following, None
        except OSError as exc:
            problem = exc.strerror or str(exc)
        finally:
            os.close(go_r)
            os.close(go_w)  # the command that was not told to go reads end of file, and leaves
            if theirs is not None:
                theirs.close()
        if following is not None:
            following.close()
        which = "base" if source is self.base else "latest"
        self.drop(source)
        return None, None, (
            f"session: the {which} snapshot did not fork the run ({problem}); it was dropped, and the run "
            "was forked from the one before it"
        )

    def drop(self, snapshot):
        """Kill a snapshot that misbehaved, and every process of the session that is not a kept snapshot."""
        snapshot.kill()
        self.kept = [snap for snap in self.kept if snap is not snapshot]
        if snapshot is self.base:
            self.base = None
        spared = self.keepers()
        _launch.kill_processes(None, [pid for pid in subtree(os.getpid()) if pid not in spared])
        self.reap()

    def set_processes(self, request):
        """The run's processes limit on the session's pids cgroup: the session's own tasks, plus the run's.

        Counted here (the keeper and its snapshots, threads included), not read
        from ``pids.current``, which still counts the last run's unreaped zombies.
        """
        cgroup = self.config.get("cgroup")
        if not cgroup:
            return
        mine = [os.getpid(), *subtree(os.getpid())]
        tasks = 0
        for pid in mine:
            try:
                tasks += len(os.listdir(f"/proc/{pid}/task"))
            except OSError:
                continue
        try:
            with open(os.path.join(cgroup, "pids.max"), "w") as f:
                # The limit counts the command itself; the snapshot's middle process
                # lives a moment beside it.
                f.write(str(tasks + 1 + int(request["limits"]["processes"])))
        except (OSError, ValueError):
            pass

    def pids_refusals(self):
        """How many forks the session's pids cgroup has refused so far (``max`` in ``pids.events``), or ``None``."""
        cgroup = self.config.get("cgroup")
        if not cgroup:
            return None
        try:
            with open(os.path.join(cgroup, "pids.events")) as f:
                words = f.read().split()
        except OSError:
            return None
        counts = dict(zip(words[::2], words[1::2], strict=False))
        return int(counts.get("max", "0"))

    def enforce_cpu(self):
        """SIGKILL each process of the run whose CPU time reached the run's hard limit (soft + 1 s, setrlimit(2))."""
        run, spared = self.run, self.keepers()
        spent = [pid for pid in subtree(os.getpid()) if pid not in spared and cpu_seconds(pid) >= run.cpu_hard]
        _launch.kill_processes(None, spent)

    def on_control(self):
        run = self.run
        for word in _launch.control_words(run.control_fd):
            if word == b"interrupt":
                try:
                    os.killpg(run.pid, signal.SIGINT)
                except OSError:
                    pass
            elif word == b"kill":
                run.kill_requested = True
                self.kill_run()

    def reap(self):
        """Reap every exited child: the command's status and rusage, the others' peak; drop dead snapshots."""
        while True:
            try:
                pid, status, usage = os.wait4(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            run = self.run
            if run is not None:
                run.peak_kib = max(run.peak_kib, usage.ru_maxrss)
                if pid == run.pid:
                    run.status, run.rusage = status, usage
            self.forget(pid)

    def forget(self, pid):
        """A snapshot that died (killed by hand, or by the OOM killer) is no longer the state."""
        if self.base is not None and self.base.pid == pid:
            self.base = None
        self.kept = [snap for snap in self.kept if snap.pid != pid]
        if self.pending is not None and self.pending.pid == pid:
            self.pending = None

    def keepers(self):
        """Pids the end of a run must not kill: the snapshots."""
        pids = {snap.pid for snap in self.kept}
        if self.base is not None:
            pids.add(self.base.pid)
        if self.pending is not None:
            pids.add(self.pending.pid)
        return pids

    def kill_run(self):
        """SIGKILL every process of the run (every descendant but the snapshots) until none is left.

        Once the command is reaped, every process it left is in this
        process's subtree (its orphans were re-parented here before it could
        be reaped), so one scan that finds none of them is the end.
        """
        run = self.run
        while True:
            spared = self.keepers()
            # Below a snapshot too: whatever cell code a snapshot ran (an at-fork handler's
            # child) is the run's, and dies with it.
            pids = [pid for pid in subtree(os.getpid()) if pid not in spared]
            run.killed.update(pid for pid in pids if pid != run.pid)
            _launch.kill_processes(run.pid if run.status is None else None, pids)
            self.reap()
            if not pids and run.status is not None:
                return
            select.select([], [], [], 0.001)

    def end_run(self):
        """The command has ended: take its snapshot, kill the rest, report."""
        run = self.run
        self.take_snapshot(run)
        self.kill_run()
        self.report(run)
        for fd in (run.status_fd, run.control_fd):
            try:
                os.close(fd)
            except OSError:
                pass
        self.run = None

    def take_snapshot(self, run):
        """Accept the hello the finished command's snapshot sent, if it names a child of ours; stop it at once.

        fork(2) copied the command's main thread only; a thread that an at-fork
        handler of the cell's starts in it is stopped with it (SIGSTOP stops
        the whole process), so nothing runs in a snapshot between cells.
        """
        following, run.following = run.following, None
        if following is None:
            return
        following.setblocking(False)
        try:
            hello, _fds = receive(following)
        except (OSError, ValueError):
            hello = None
        pid = hello.get("pid") if isinstance(hello, dict) else None
        state = process_state(pid) if isinstance(pid, int) else None
        if (
            self.pending is not None
            or state is None
            or state[1] != os.getpid()
            or pid in self.keepers()
        ):
            following.close()
            return
        following.setblocking(True)
        self.pending = Snapshot(pid, following)
        self.pending.stop()

    def report(self, run):
        status = run.status
        record = {
            "event": "exit",
            "killed": len(run.killed),
            "kill_requested": run.kill_requested,
            "snapshot": self.pending is not None,
        }
        if os.WIFSIGNALED(status):
            record["signal"] = os.WTERMSIG(status)
        else:
            record["exit_code"] = os.WEXITSTATUS(status)
        if run.refusals_before is not None:
            record["pids_refused"] = (self.pids_refusals() or 0) > run.refusals_before
        mine = run.rusage
        record["command_cpu"] = mine.ru_utime + mine.ru_stime
        record["cpu"] = max(record["command_cpu"], Run.children_cpu() - run.cpu_before)
        record["peak_kib"] = max(run.peak_kib, mine.ru_maxrss)
        _launch.emit(run.status_fd, record)

    # ---------------------------------------------------------------- the chain

    def settle(self, keep):
        """Keep the newest snapshot as the current state, or drop it; older ones beyond the undo depth go."""
        pending, self.pending = self.pending, None
        if pending is not None and keep:
            self.kept.append(pending)
            while len(self.kept) > self.undo_depth + 1:
                self.kept.pop(0).kill()
                self.evicted = True
        elif pending is not None:
            pending.kill()
        self.reap()
        current = self.kept[-1].pid if self.kept else None
        return {"kept": bool(pending and keep), "depth": len(self.kept), "rss": resident_of(current)}

    def undo(self, count):
        """Drop the newest ``count`` kept snapshots (at most all but the base)."""
        undone = 0
        # The base is the state before every cell: a way back only while no snapshot was let go.
        floor = 1 if self.evicted else 0
        while undone < count and len(self.kept) > floor:
            self.kept.pop().kill()
            undone += 1
        self.reap()
        return {"undone": undone, "depth": len(self.kept)}

    def stat(self):
        size, resident = vm_size()
        snaps = [self.base] if self.base is not None else []
        snaps += self.kept
        return {
            "vm_size": size,
            "rss": resident,
            "snapshots": [{"pid": snap.pid, **memory_of(snap.pid)} for snap in snaps],
            "keeper": memory_of(os.getpid()),
        }


def own_pids_cgroup():
    """This process's pids cgroup directory when its ``pids.max`` is writable here (cgroups(7)), else ``None``.

    cgroup v1's ``pids`` hierarchy first (``N:pids:/path``), else the v2 one (``0::/path``).
    """
    try:
        with open("/proc/self/cgroup") as f:
            lines = [line.strip().split(":", 2) for line in f if line.count(":") >= 2]
    except OSError:
        return None
    places = [
        os.path.join("/sys/fs/cgroup/pids", path.lstrip("/")) for _n, kinds, path in lines if "pids" in kinds.split(",")
    ]
    places += [os.path.join("/sys/fs/cgroup", path.lstrip("/")) for n, kinds, path in lines if n == "0" and not kinds]
    for directory in places:
        if os.access(os.path.join(directory, "pids.max"), os.W_OK):
            return directory
    return None


def source_missing(keeper):
    """``True`` when the keeper has no snapshot left to fork from."""
    return keeper.base is None and not keeper.kept


def vm_size():
    """This process's address space and resident memory, bytes (/proc/self/statm)."""
    with open("/proc/self/statm") as f:
        size, resident = f.read().split()[:2]
    page = os.sysconf("SC_PAGE_SIZE")
    return int(size) * page, int(resident) * page


def main():
    config = json.loads(sys.argv[1])
    set_name(KEEPER_NAME)
    sock = socket.socket(fileno=int(config.get("fd", 3)))
    global PREFETCHED
    started = time.monotonic()
    loaded, failed = preload(config.get("preload", []))
    PREFETCHED = prefetch(config.get("warm"))
    _launch.become_subreaper(2)
    gc.collect()
    gc.freeze()
    config.setdefault("cgroup", own_pids_cgroup())
    keeper = Keeper(sock, config)
    hello = keeper.start_base()
    # From here on nothing of this process is open to its own user's programs.
    dumpable = set_dumpable(False)
    size, resident = vm_size()
    size = max(size, int(hello.get("vm_size", 0)))  # what a pristine run starts with: the base's
    ready = {"event": "ready", "pid": os.getpid(), "vm_size": size, "rss": resident, "loaded": loaded}
    ready.update(failed=failed, landlock=hello.get("landlock"), dumpable=not dumpable, cgroup=bool(config["cgroup"]))
    ready["seconds"] = round(time.monotonic() - started, 3)
    send_json(sock, ready)
    keeper.serve()


if __name__ == "__main__":
    # Run from the imported module, whose globals (SNAPSHOT) the cell runner reads.
    from cellbox._forkserver_child import main as _main

    _main()
