"""Child side of the fork server: a warm interpreter that forks one supervisor and command per run.

Standard library only until the preload list is imported.  The parent
(:class:`cellbox.forkserver.ForkServer`) starts this module through the sandbox
core's launcher, ``python -m cellbox._forkserver_child CONFIG``, so the server
itself runs with the scrubbed environment, under rlimits, in a process group
the launcher kills with everything in it.  Its fd 3 is one end of a
``SOCK_SEQPACKET`` socket pair; nothing else can reach the server.

The server is single-threaded (fork(2) of a threaded process copies one thread
and whatever locks the others held).  It imports the preload list, freezes
the garbage collector's view of what it loaded (``gc.freeze``: the children's
collections then never write to those objects' pages), says ``ready``, and
keeps one **spare** forked ahead of time:

* the spare's **supervisor** (``P``): its own session, a child subreaper once
  it has a run; it is :class:`cellbox._launch.Supervisor`, so killing,
  reaping and the JSON exit record are the launcher's own code;
* the spare's **command** (``C``), forked from ``P`` at once: it moves itself
  into the pids cgroup the parent made for the next run (a move waits for
  every fork on the machine to finish, milliseconds, so it is done here while
  nobody waits), calls the
  ``warm_start()`` of the module the server was told to warm (the cell runner
  builds IPython's shell and runs an empty cell through it, paying that and
  its copy-on-write faults while nobody waits), then blocks until it is given
  a run.

A hand-off is one message from the parent: the run's spec as JSON, and its
pipes (status, control, stdout, stderr, stdin, the channel) as SCM_RIGHTS
(unix(7); ``socket.send_fds``).  The server passes both to the spare's ``P``
and answers the parent with ``P``'s pid; ``P`` passes the command's fds on to
``C`` and supervises it.  ``C`` applies the run's limits with the launcher's
:func:`~cellbox._launch.prepare_command` (group, signals, fds, priority, user,
rlimits, Landlock), replaces its environment, reseeds ``random`` (and
numpy's global generator when it is loaded), closes every other fd and runs the
module with :func:`runpy.run_module`, as ``python -m`` would.  A spare is used
for exactly one run; the next one is forked right after the answer.
"""

import atexit
import builtins
import gc
import importlib
import importlib.util
import json
import os
import random
import re
import runpy
import signal
import socket
import sys
import threading
import traceback
import types
import warnings

from cellbox import _launch

# The fds a hand-off carries, in the order the parent sends them ("stdin" and
# the channel's two only when the run has them).
HANDOFF_NAMES = ("status", "control", "stdout", "stderr", "stdin", "message", "reply")
MAX_MESSAGE = 1024 * 1024
MAX_FDS = len(HANDOFF_NAMES)
PR_SET_NAME = 15
SPARE_NAME = b"cellbox-spare"
SERVER_NAME = b"cellbox-forksrv"
# Where the channel's ends go in the command, as for a spawned command (sandbox.CHANNEL_FDS).
CHANNEL_TARGETS = {"message": 3, "reply": 4}
# (spec, code) of the warmed module's ``python -m`` entry, found once by the server:
# finding and reading it in every run took milliseconds (more with a stale .pyc).
PREFETCHED = None


def set_name(name):
    """The process's name in ps and /proc/PID/comm (prctl(2) PR_SET_NAME, 15 bytes)."""
    try:
        _launch.libc().prctl(PR_SET_NAME, name[:15], 0, 0, 0)
    except (OSError, AttributeError):
        pass


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
    """Import ``names``, then what an empty cell imports; return ``(loaded, {name: reason}, probed)``."""
    if "cellbox.cellrunner" in names:
        prepare_entry("cellbox.cellrunner")
    loaded, failed = [], {}
    for name in names:
        try:
            importlib.import_module(name)
            loaded.append(name)
        except Exception as exc:  # noqa: BLE001 - a module that is not installed is reported, not fatal
            failed[name] = f"{type(exc).__name__}: {exc}"
    probed = []
    if "cellbox.cellrunner" in loaded:
        for name in probe_cell_modules():
            try:
                importlib.import_module(name)
                probed.append(name)
            except Exception:  # noqa: BLE001, S112 - only a head start; the cell imports it again if it must
                continue
    return loaded, failed, probed


def probe_cell_modules():
    """Modules an empty cell imports beyond the preload list, found in a throwaway child.

    IPython imports much of itself only when its first shell is made (the
    completer, the history store, pyplot for the inline backend).  An empty
    cell run in a child that is then discarded names them, and the server
    imports them too, without keeping the shell or anything it set up.
    """
    result_r, result_w = os.pipe()
    message_r, message_w = os.pipe()
    reply_r, reply_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            from cellbox import cellrunner
            from cellbox.limits import Limits

            devnull = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(devnull, fd)
            os.environ["CELLBOX_CHANNEL"] = f"{message_w},{reply_r}"
            spec = {"code": "pass", "carry_state": False, "history": [""], "limits": Limits().as_dict()}
            cellrunner.run(spec)
            os.write(result_w, json.dumps(sorted(sys.modules)).encode())
        finally:
            os._exit(0)
    for fd in (result_w, message_w, reply_r):
        os.close(fd)
    chunks = []
    while True:
        chunk = os.read(result_r, 1 << 16)
        if not chunk:
            break
        chunks.append(chunk)
    for fd in (result_r, message_r, reply_w):
        os.close(fd)
    os.waitpid(pid, 0)
    try:
        names = json.loads(b"".join(chunks) or b"[]")
    except ValueError:
        return []
    return [name for name in names if name not in sys.modules and name != "__main__"]


def prepare_entry(module):
    """What an entry module does to the process before its imports, done again in each child.

    The cell runner picks matplotlib's backend through ``MPLBACKEND`` before
    matplotlib is imported; matplotlib reads it once, at import
    (``matplotlib/__init__.py``), so with matplotlib preloaded the child must
    set it again.
    """
    if module == "cellbox.cellrunner":
        from cellbox import cellrunner

        cellrunner._prepare_process({})
    matplotlib = sys.modules.get("matplotlib")
    # pyplot picks its backend from rcParams when first used (never in the server).
    if matplotlib is not None and os.environ.get("MPLBACKEND"):
        try:
            matplotlib.rcParams["backend"] = os.environ["MPLBACKEND"]
        except Exception:  # noqa: BLE001 - a backend matplotlib refuses stays as it was
            pass


def warm(module):
    """Call ``module.warm_start()`` when the module is loaded and has one; ``False`` when it failed.

    It prepares, in this spare only, what the module's next run would build
    first (see :func:`cellbox.cellrunner.warm_start`).  A warm-up that fails
    is forgotten: the run then builds everything itself, as a spawned one does.
    """
    hook = getattr(sys.modules.get(module or ""), "warm_start", None)
    if hook is None:
        return True
    try:
        hook()
        return True
    except Exception:  # noqa: BLE001 - only a head start
        return False


# --------------------------------------------------------------------------- the command


def join_cgroup(path):
    """Move this process into the cgroup at ``path`` (:func:`cellbox._launch.join_cgroup`); ``True`` once there."""
    if not path:
        return False
    try:
        _launch.join_cgroup(path)
        return True
    except OSError:
        return False  # the run's own set-up tries again, and reports what fails


def command_main(sock, warm_module, cgroup):
    """``C``: join the next run's cgroup, warm up, wait for the run, then become it.  Never returns."""
    try:
        joined = cgroup if join_cgroup(cgroup) else None
        warm(warm_module)
        spec, fds = receive(sock)
        sock.close()
        if spec is None:
            os._exit(0)
        named = dict(zip(spec["handoff"], fds, strict=True))
        if joined and spec.get("cgroup") == joined:
            spec["cgroup"] = None  # already in it
    except BaseException:  # noqa: BLE001 - a spare that cannot start leaves quietly
        os._exit(0)
    status_fd = named["status"]
    try:
        places = [[named["stdout"], 1], [named["stderr"], 2]]
        if "stdin" in named:
            places.append([named["stdin"], 0])
        else:
            places.append([os.open(os.devnull, os.O_RDONLY), 0])
        places += [[named[name], target] for name, target in CHANNEL_TARGETS.items() if name in named]
        spec["fds"] = places
        status_fd = _launch.prepare_command(spec, status_fd, exact_priority=True)
        python_signals()
        set_name(os.path.basename(sys.executable).encode())
        keep = {0, 1, 2, status_fd, *(target for _fd, target in places)}
        close_other_fds(keep)
        replace_environment(spec["env"])
        sys.path[0] = os.getcwd()  # as `python -m` puts the working directory first
        reseed()
        prepare_entry(spec["argv"][2])
    except OSError as exc:
        _launch.emit(status_fd, {"event": "exec_error", "text": f"cannot start the command: {exc.strerror or exc}"})
        os._exit(126)
    except BaseException as exc:  # noqa: BLE001 - never return into the server's loop
        _launch.emit(status_fd, {"event": "exec_error", "text": f"cannot start the command: {exc!r}"})
        os._exit(126)
    os.close(status_fd)
    finish(run_module(spec["argv"]))


def replace_environment(env):
    """The run's environment in place of the server's, in ``os.environ``, ``os.environb`` and the C library's."""
    os.environb.clear()
    os.environ.clear()
    os.environ.update(env)
    os.environb.update((key.encode(), value.encode()) for key, value in env.items())
    # tempfile chose its directory from the server's TMPDIR if anything asked before the fork.
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
    """Close every fd but ``keep``: nothing of the server or of earlier runs reaches the command."""
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd not in keep:
            try:
                os.close(fd)
            except OSError:
                pass


def reseed():
    """New random state per run: the fork copied the server's (random(3) and numpy alike)."""
    random.seed()
    numpy_random = sys.modules.get("numpy.random")
    if numpy_random is not None:
        try:
            numpy_random.seed()
        except Exception:  # noqa: BLE001
            pass


def prefetch(module):
    """``(spec, code)`` of ``module`` as ``python -m`` would run it, or ``None`` (a package, or not found).

    The module's spec and code object (importlib's ``find_spec`` and the
    loader's ``get_code``), found once so a run only executes the code.
    """
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


# --------------------------------------------------------------------------- the supervisor


def supervisor_main(sock, warm_module, cgroup):
    """``P``: fork the command ahead of time, wait for a run, hand it on, supervise.  Never returns."""
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the server's SIG_IGN would reap the command for us
        os.setsid()
        set_name(SPARE_NAME)
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        child = os.fork()
        if child == 0:
            try:
                sock.close()
                mine.close()
                command_main(theirs, warm_module, cgroup)
            finally:
                os._exit(1)  # never back into this function's caller
        theirs.close()
        spec, fds = receive(sock)
        sock.close()
    except BaseException:  # noqa: BLE001
        os._exit(0)
    if spec is None:
        os._exit(0)  # the server went away: the command sees end of file too
    named = dict(zip(spec["handoff"], fds, strict=True))
    status_fd, control_fd = named["status"], named["control"]
    set_name(b"cellbox-super")
    _launch.become_subreaper(status_fd)
    wake_r, wake_w = _launch.supervisor_signals()
    command_fds = [fd for name, fd in named.items() if name not in ("control",)]
    command_spec = dict(spec, handoff=[name for name in named if name != "control"])
    try:
        send_json(mine, command_spec, command_fds)
    except OSError as exc:
        _launch.emit(status_fd, {"event": "exec_error", "text": f"the fork server's spare is gone ({exc.strerror})"})
    mine.close()
    _launch.supervise(spec, status_fd, control_fd, child, wake_r, [fd for fd in command_fds if fd != status_fd])
    os._exit(0)


# --------------------------------------------------------------------------- the server


class Spare:
    """A supervisor and command pair forked ahead of time, and the socket to hand it a run."""

    def __init__(self, server_sock, warm_module, cgroup):
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        # Named before the fork, so the pair is never seen under the server's name.
        set_name(SPARE_NAME)
        pid = os.fork()
        if pid == 0:
            try:
                server_sock.close()
                mine.close()
                supervisor_main(theirs, warm_module, cgroup)
            finally:
                os._exit(1)  # never back into the server's loop
        set_name(SERVER_NAME)
        theirs.close()
        self.pid = pid
        self.sock = mine

    def take(self, message, fds):
        """Give this spare a run; ``False`` when it is gone."""
        try:
            send_json(self.sock, message, fds)
            return True
        except OSError:
            return False
        finally:
            self.sock.close()


def vm_size():
    """This process's address space and resident memory, bytes (/proc/self/statm)."""
    with open("/proc/self/statm") as f:
        size, resident = f.read().split()[:2]
    page = os.sysconf("SC_PAGE_SIZE")
    return int(size) * page, int(resident) * page


def serve(sock, config):
    """The server's loop: one hand-off per message, a new spare after each."""
    warm_module = config.get("warm")
    spare = Spare(sock, warm_module, config.get("cgroup")) if config.get("spare", True) else None
    while True:
        request, fds = receive(sock)
        if request is None:
            return
        if request.get("op") == "stat":
            size, resident = vm_size()
            send_json(sock, {"vm_size": size, "rss": resident})
            continue
        try:
            taken = spare is not None and spare.take(request, fds)
            if not taken:
                spare = Spare(sock, warm_module, request.get("cgroup"))
                taken = spare.take(request, fds)
            reply = {"pid": spare.pid} if taken else {"error": "the spare process could not be started"}
        except OSError as exc:
            reply = {"error": f"fork failed ({exc.strerror})"}
        finally:
            for fd in fds:
                os.close(fd)
        send_json(sock, reply)
        spare = Spare(sock, warm_module, request.get("next_cgroup")) if config.get("spare", True) else None


def main():
    config = json.loads(sys.argv[1])
    set_name(SERVER_NAME)
    sock = socket.socket(fileno=int(config.get("fd", 3)))
    global PREFETCHED
    loaded, failed, probed = preload(config.get("preload", []))
    PREFETCHED = prefetch(config.get("warm"))
    # Finished supervisors and spares are reaped by the kernel (sigaction(2), SA_NOCLDWAIT).
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    gc.collect()
    gc.freeze()
    size, resident = vm_size()
    ready = {"event": "ready", "pid": os.getpid(), "vm_size": size, "rss": resident, "loaded": loaded}
    send_json(sock, dict(ready, failed=failed, probed=len(probed)))
    serve(sock, config)


if __name__ == "__main__":
    main()
