"""The session's keeper: the trusted supervisor of a session's snapshot chain and of its one run.

Standard library only until the preload list is imported.  The parent
(:class:`cellbox.sandbox.session.ForkServer`) starts this module through the sandbox
core's launcher, ``python -m cellbox.sandbox.keeper CONFIG``, inside the
session's isolation (its namespaces, user and pids cgroup), so the whole
session runs with the scrubbed environment, under rlimits, in a tree the
launcher kills with everything in it.  Its fd 3 is one end of a
``SOCK_SEQPACKET`` socket pair that only the kernel holds.

Who is who (one session)::

    kernel ──socket──> keeper K (this module's main; trusted: never runs cell code)
                        ├── base snapshot S0  (forked once: warm shell, no cell has run in it)
                        ├── snapshots S1..Sn  (each a fork of a finished cell: its state)
                        ├── spare             (the next run's command, forked ahead from Sn or S0, stopped)
                        └── cell C            (forked from Sn, or from S0 for a pristine run)

* The **keeper** imports the preload list, forks ``S0``, and then only
  supervises: it is a child subreaper (every process of a run ends up its
  child), not dumpable (prctl(2) ``PR_SET_DUMPABLE``: no ptrace, no
  ``/proc/K/mem`` or ``environ`` for anyone of its user), and outside the
  Landlock domain its snapshots and cells are in, so none of them can signal
  or trace it (landlock(7), ``LANDLOCK_SCOPE_SIGNAL``).  Per run it obeys the
  control pipe (``interrupt``, ``kill``), reaps, kills every process of the run
  when its command ends, and writes the launcher's JSON exit record on the
  status pipe.  Between runs it keeps one **spare**: the next run's command,
  forked ahead (by the last cell's command beside its snapshot, or by the
  base), stopped until the run's request comes (a fork off the run's way).

Snapshots, the chain, and the commands forked from them are in :mod:`cellbox.sandbox.snapshots`.

Requests on the kernel's socket, one JSON message each (fds beside, as
SCM_RIGHTS, unix(7)), one reply each: ``run`` (the run's spec and pipes;
reply: the command's pid; with ``"beside"``, a run forked from the latest
snapshot that leaves none, which does not take the next cell's spare), ``settle`` (keep or drop the newest snapshot),
``undo`` (drop the last N kept snapshots), ``let_go`` (kill the N oldest kept snapshots, the session's memory being
short), ``stat`` (sizes).
"""

import gc
import json
import math
import os
import resource
import select
import signal
import socket
import sys
import time

from . import _launch, snapshots
from .importpath import trusted_sys_path
from .snapshots import (
    Chain,
    Snapshot,
    continue_process,
    own_child,
    prefetch,
    preload,
    process_state,
    queued_words,
    read_proc,
    receive,
    send_json,
    set_dumpable,
    set_name,
    start_base,
    status_field,
    stop_problem,
    stop_process,
    vm_size,
)

KEEPER_NAME = b"cellbox-keeper"
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
# Seconds between two looks at a run's CPU time, for a run that keeps soft limits only.
CPU_CHECK = 0.1
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
# Seconds ``let_go`` waits for the snapshot it killed to exit and give its memory back.
LET_GO_TIMEOUT = 5.0


# --------------------------------------------------------------------------- the processes of a run


def subtree(root, spared=frozenset()):
    """Live descendants of ``root`` but those in ``spared`` (whose own descendants count), from
    /proc/PID/task/TID/children (proc(5)).

    Reads only the subtree, not all of /proc; falls back to the launcher's scan
    of /proc where the kernel has no ``children`` files.  A spared process's
    state is not read (only a live one is returned, and it never is).
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
                children = [int(child) for child in read_proc(f"/proc/{pid}/task/{tid}/children").split()]
            except FileNotFoundError:
                if pid == root and tid == tasks[0]:
                    return [pid for pid in _launch.descendants(root) if pid not in spared]
                continue
            except (OSError, ValueError):
                continue
            for child in children:
                if child not in spared:
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
        return int(read_proc(f"/proc/{pid}/statm").split()[1]) * PAGE_SIZE
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


# Shared memory mappings named in one fact at most, and characters of each name (a cell chooses the names).
SHARED_NAMED, NAME_CHARS = 4, 80
# The most a count or a size in that fact may be: the kernel formats them as floats (limits.format_size).
SHARED_MAX = 2**63


def checked_shared(value):
    """A snapshot's word on its shared memory mappings (:func:`snapshots.shared_mappings`), as plain data.

    The command that forked the snapshot wrote it, so it is only checked and
    cut to size, never trusted for anything but the note it gives its own
    user: ``{"count": int, "bytes": int, "names": [up to SHARED_NAMED short str]}``.
    """
    none = {"count": 0, "bytes": 0, "names": []}
    if not isinstance(value, dict):
        return none
    count, size, names = value.get("count"), value.get("bytes"), value.get("names")
    if not (isinstance(count, int) and isinstance(size, int) and isinstance(names, list)):
        return none
    if not (0 <= count <= SHARED_MAX and 0 <= size <= SHARED_MAX):
        return none
    # Cut before each character is looked at: a name may be as long as a whole message.
    names = ["".join(c if c.isprintable() else "?" for c in n[:NAME_CHARS]) for n in names if isinstance(n, str)]
    return {"count": count, "bytes": size, "names": names[:SHARED_NAMED]}


def with_segments(shared):
    """``shared`` (:func:`checked_shared`'s form) and the session's System V segments no process maps, which a
    stop or an undo leaves as they are too (:func:`snapshots.detached_sysv_segments`, read by the keeper)."""
    segments = snapshots.detached_sysv_segments()
    if not segments:
        return shared
    names = sorted(segments, key=lambda name: -segments[name])
    return {
        "count": shared["count"] + len(segments),
        "bytes": shared["bytes"] + sum(segments.values()),
        "names": (names + shared["names"])[:SHARED_NAMED],
    }


class Run:
    """The one run the keeper supervises: its pipes, its command, its accounts."""

    def __init__(self, request, named, pid, following):
        self.spec = request
        self.status_fd = named["status"]
        self.control_fd = named["control"]
        self.pid = pid
        # The keeper's ends of the next snapshot's socket and of the next spare's (see snapshot_ends), or None.
        self.following, self.next_spare = following if following is not None else (None, None)
        self.status = None
        self.rusage = None
        self.peak_kib = 0
        self.killed = set()
        self.kill_requested = False
        self.cpu_before = self.children_cpu()
        # Only a run that becomes a snapshot keeps soft limits alone, and needs its hard CPU limit kept here.
        cpu = float(request["limits"]["cpu_time"])
        self.cpu_hard = math.ceil(cpu) + 1 if following is not None else None
        self.next_cpu_check = time.monotonic() + CPU_CHECK
        self.refusals_before = None
        self.snapshot_error = None  # why the finished command left no snapshot, in its own words
        # A command that stopped as its own snapshot (snapshots.become_own_snapshot): its word on the snapshot,
        # whether its stop failed the keeper's checks, and (CPU seconds, peak KiB) read from /proc at the stop.
        self.hello = None
        self.refused = False
        self.own_usage = None

    @staticmethod
    def children_cpu():
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        return usage.ru_utime + usage.ru_stime


class Spare:
    """The next run's command, forked ahead of its run from ``source``: stopped, waiting for the run on ``sock``."""

    def __init__(self, pid, sock, source):
        self.pid = pid
        self.sock = sock
        self.source = source

    def kill(self):
        try:
            os.kill(self.pid, signal.SIGKILL)
            Snapshot.dying.add(self.pid)
        except OSError:
            pass
        self.sock.close()


def snapshot_ends(request):
    """The sockets of a run that leaves a snapshot: ``(keeper's ends, {name: command's end})``.

    The keeper's ends are the new snapshot's socket and the next spare's
    (its command names both on the first, and the next run's request goes
    to the spare on the second); ``(None, {})`` for a run that leaves none.
    """
    if not request.get("snapshot"):
        return None, {}
    following, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    spare_mine, spare_theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    return (following, spare_mine), {"snapshot": theirs, "next_spare": spare_theirs}


class Keeper:
    """The session's trusted supervisor: the snapshot chain, the spare and the run now going."""

    def __init__(self, sock, config):
        self.sock = sock
        self.config = config
        self.chain = Chain(int(config.get("undo_depth", 0)))
        self.run = None
        self.wake_r = None
        self.spare = None
        self.making = None  # (snapshot, socket, deadline) while a spare is being forked
        self.spare_note = None  # why the last spare could not be made, for the next run's notes
        # Whether every held process passed check_held and none of the session's processes has run since: the
        # next run then need not look again (its spare is looked at as it is continued: continue_process).
        self.held_checked = False
        # The tasks (threads) of the keeper and of each snapshot as set_processes counted them, by pid, and the
        # pids.max it last wrote.
        self.tasks_of = {}
        self.pids_max = None

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
        self.chain.base = Snapshot(pid, mine)
        self.chain.base.stop()
        return hello

    # ---------------------------------------------------------------- loop

    def serve(self):
        wake_r, _wake_w = _launch.supervisor_signals()
        self.wake_r = wake_r
        while True:
            watched = [self.sock, wake_r]
            if self.run is not None:
                watched.append(self.run.control_fd)
            if self.making is not None:
                watched.append(self.making[0].sock)
            ready, _, _ = select.select(watched, [], [], self.wait_time())
            if self.making is not None and (self.making[0].sock in ready or time.monotonic() >= self.making[2]):
                self.finish_spare()
            if self.run is not None and self.run.cpu_hard is not None:
                self.enforce_cpu()
            if wake_r in ready:
                try:
                    os.read(wake_r, 4096)
                except OSError:
                    pass
                # SIGCHLD comes when a child of the keeper is continued too: a snapshot or the spare, which
                # only the keeper may continue.
                self.check_stopped()
            if self.run is not None and self.run.control_fd in ready:
                self.on_control()
            self.reap()
            if self.run is not None and self.run.status is None and self.run.following is not None:
                self.own_snapshot()
            if self.run is not None and self.run.status is not None:
                self.end_run()
            if self.sock in ready and not self.on_request():
                return

    def wait_time(self):
        """Seconds the loop may wait: a run that keeps its hard limits (a snapshot's) is held to RLIMIT_CPU's
        hard limit here, looked at every CPU_CHECK seconds; a spare's fork has its deadline."""
        times = []
        if self.run is not None and self.run.cpu_hard is not None:
            times.append(max(0.0, self.run.next_cpu_check - time.monotonic()))
        if self.making is not None:
            times.append(max(0.0, self.making[2] - time.monotonic()))
        return min(times) if times else None

    def on_request(self):
        """One request from the kernel; ``False`` when the kernel is gone."""
        try:
            request, fds = receive(self.sock)
        except OSError:
            return False
        if request is None:
            return False
        op = request.get("op", "run")
        while self.making is not None and not (op == "settle" and request.get("keep")):
            # Every other request needs the spare, or the snapshot forking it, settled first
            # (a snapshot that failed to fork it is dropped, and the one before it asked).
            self.finish_spare()
        if op == "run":
            reply = self.start_run(request, fds)
        elif op == "settle":
            reply = self.settle(bool(request.get("keep")), request.get("kind"))
        elif op == "undo":
            reply = self.undo(int(request.get("n", 1)))
        elif op == "let_go":
            reply = self.let_go(int(request.get("n", 1)))
        elif op == "stat":
            reply = self.stat()
        else:
            reply = {"error": f"unknown request {op!r}"}
        send_json(self.sock, reply)
        if op in ("settle", "undo"):
            self.make_spare()
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
        if self.run is not None or self.chain.empty():
            for fd in fds:
                os.close(fd)
            return {"error": "the session is busy with another run" if self.run else "the base snapshot is gone"}
        if self.chain.pending is not None:
            self.settle(False)  # never settled: the kernel moved on without it
        if not self.held_checked:
            self.check_held()
        self.held_checked = False  # the run's processes run from here on
        earlier, self.spare_note = self.spare_note, None
        # A run beside the state (completion, inspection) leaves the spare to the next cell.
        spare = None if request.get("beside") else self.take_spare(request)
        self.set_processes(request)
        pid = following = problem = None
        try:
            if spare is not None:
                pid, following = self.hand_to_spare(spare, request, named)
            for source in self.sources(request) if pid is None else []:
                pid, following, problem = self.fork_from(source, request, named)
                if pid is not None:
                    break
            if pid is not None:
                for note in filter(None, (earlier, problem)):
                    _launch.note(named["status"], note)
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

    def take_spare(self, request):
        """The spare, if it was forked from the snapshot this run comes from (else it is discarded); ``None``."""
        sources = self.sources(request)
        if self.spare is not None and not (sources and self.spare.source is sources[0]):
            self.discard_spare()
        spare, self.spare = self.spare, None
        return spare

    def hand_to_spare(self, spare, request, named):
        """Give the run to the spare: its request and pipes on its socket, then SIGCONT.  ``(pid, following)``.

        ``(None, None)`` when the spare is gone (killed from outside, or by the
        OOM killer): the run is then forked as usual.
        """
        state = process_state(spare.pid)
        if state is None or state[0] == "Z" or state[1] != os.getpid():
            spare.kill()
            return None, None
        # What the cell before sent on the spare's socket is read first: closed with unread messages, a
        # SOCK_SEQPACKET end makes its peer's next read fail (ECONNRESET, unix(7)), and the spare's read is the run's.
        # A cell that raised its socket's send buffer queues more than is read at once: that spare is not used.
        queued_words(spare.sock)
        if select.select([spare.sock], [], [], 0)[0]:
            spare.kill()
            return None, None
        following, theirs = snapshot_ends(request)
        names = [name for name in named if name != "control"] + list(theirs)
        carried = [named[name] for name in names if name not in theirs] + [end.fileno() for end in theirs.values()]
        try:
            send_json(spare.sock, dict(request, handoff=names), carried)
            continue_process(spare.pid)
        except OSError:
            spare.kill()
            for end in following or ():
                end.close()
            return None, None
        finally:
            for end in theirs.values():
                end.close()
        spare.sock.close()
        return spare.pid, following

    def make_spare(self):
        """Start forking the next run's command ahead of its run, when it comes from the base snapshot.

        Returns at once: :meth:`finish_spare` takes the snapshot's reply (in
        the loop, or when a request needs the spare).  Called when no run is
        going: after a run ends, and after the session is ready, a settle or an
        undo.  A snapshot a cell left is never continued between cells (what the
        cell left in it would run then): its spare comes from its command
        (:func:`~cellbox.sandbox.snapshots.make_snapshot`); a spare whose
        snapshot is no longer the next run's is killed here.
        """
        if self.run is not None or self.making is not None:
            return
        sources = self.chain.sources(carried=True)
        source = self.chain.pending or (sources[0] if sources else None)
        if self.spare is not None:
            if self.spare.source is source:
                return
            self.discard_spare()
        if source is None or source is not self.chain.base:
            # A snapshot a cell left would run between cells to fork it (an at-fork handler of the cell's
            # could hold it there): its spare comes from its command (make_snapshot), or the next run
            # is forked from it in its own time.
            return
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.held_checked = False  # the base runs to fork it
        try:
            source.ask_fork({"op": "spare", "handoff": ["spare"]}, [theirs.fileno()])
        except OSError as exc:
            mine.close()
            self.spare_failed(source, exc)
            return
        finally:
            theirs.close()
        self.making = (source, mine, time.monotonic() + snapshots.SNAPSHOT_TIMEOUT)

    def finish_spare(self):
        """Take the reply of the snapshot forking the spare (waiting up to its deadline); stop the spare.

        The reply is checked as a run's is (:meth:`Snapshot.forked`); a
        snapshot that fails it is dropped with what it started, and the next
        run's notes say so.  Whatever the fork started beside the spare (a
        cell's at-fork handler) is killed now: nothing of a cell runs between
        cells.
        """
        source, mine, deadline = self.making
        self.making = None
        try:
            pid = source.forked(self.chain.pids(), max(0.0, deadline - time.monotonic()))
        except OSError as exc:
            mine.close()
            self.spare_failed(source, exc)
            return
        problem = stop_process(pid)
        self.spare = Spare(pid, mine, source)
        if problem is not None:
            self.discard_spare()
            self.spare_note = f"session: the spare was killed: {problem}"
        self.kill_strays()

    def spare_failed(self, source, exc):
        """The snapshot did not fork the spare as asked: drop it, say so in the next run's notes, try the one before."""
        which = "base" if source is self.chain.base else "latest"
        self.spare_note = (
            f"session: the {which} snapshot did not fork the run ({exc.strerror or exc}); it was dropped, "
            "and the run was forked from the one before it"
        )
        self.drop(source)
        self.make_spare()

    def discard_spare(self):
        """Kill the spare (its snapshot is no longer the next run's) and reap it, so no run counts it as its own."""
        spare, self.spare = self.spare, None
        if spare is not None:
            spare.kill()
            try:
                os.waitpid(spare.pid, 0)
            except ChildProcessError:
                pass

    def check_stopped(self):
        """Kill every snapshot, and the spare, that someone other than the keeper continued.

        Snapshots and the spare share the cells' user and Landlock domain, so a
        cell may send them SIGCONT (kill(2)); what a cell left in them (a signal
        handler, a thread an at-fork handler started) would then run between
        cells.  The keeper is their parent, and each continuing of a stopped
        child is reported to it (waitid(2) ``WCONTINUED``; SIGCHLD wakes the
        loop); its own are consumed as it makes them
        (:func:`~cellbox.sandbox.snapshots.continue_process`).  Any other kills
        the process, which leaves the chain (the state it held is gone: the next
        run's notes say so), and, between runs, everything it started.
        """
        woken = set()
        # Only the reports of what the keeper holds: the running command's own stop is its end when it becomes
        # its own snapshot (own_snapshot), and is not this look's to take.
        held_pids = {snap.pid for snap in [*self.chain.snapshots(), self.chain.pending] if snap is not None}
        if self.spare is not None:
            held_pids.add(self.spare.pid)
        for pid in held_pids:
            for _ in range(4):  # a child has one report pending at a time; a few looks take them all
                try:
                    # A stop report of a process the keeper holds stopped: it was continued and stopped itself
                    # again (which clears the continued report), so it ran between cells (snapshots.HELD).
                    report = os.waitid(os.P_PID, pid, os.WCONTINUED | os.WSTOPPED | os.WNOHANG)
                except ChildProcessError:
                    break
                if report is None:
                    break
                if report.si_code == os.CLD_CONTINUED or pid in snapshots.HELD:
                    woken.add(pid)
        if not woken:
            return
        if self.spare is not None and self.spare.pid in woken:
            self.discard_spare()
            # Not over a snapshot's note of an earlier look: that one says the state is gone.
            self.spare_note = self.spare_note or (
                "session: the spare was continued from outside the session and was killed"
            )
        held = [snap for snap in [*self.chain.snapshots(), self.chain.pending] if snap is not None]
        for snap in held:
            if snap.pid not in woken:
                continue
            if snap is self.chain.pending:
                snap.kill()
                self.chain.pending = None
            else:
                self.chain.remove(snap)
            self.spare_note = (
                "session: a snapshot was continued from outside the session (SIGCONT) and was killed; "
                "the state it held is gone"
            )
        if self.run is None:
            self.kill_strays()

    def check_held(self):
        """Kill every snapshot, and the spare, that is not in a real group stop (:func:`stop_problem`); say so.

        Called after every run, once its processes are gone, and before the
        next run when a process of the session ran since (the base, forking a
        spare: :attr:`held_checked`): where no syscall filter refuses ptrace(2),
        a run's process may have traced a snapshot (so that the keeper's SIGSTOP
        became a ptrace stop) and resumed it with PTRACE_CONT, which makes no
        ``continued`` report for :meth:`check_stopped`.  The run's end detached
        it, stopped or running.  Between runs no process of the session runs
        (:meth:`kill_strays`), so what the end of a run found still holds at the
        next one's start.  Killing one may free another it traced, so it looks
        again until everything it holds is stopped and untraced.
        """
        while True:
            found = False
            held = [*self.chain.snapshots(), *([self.chain.pending] if self.chain.pending is not None else [])]
            for snap in held:
                problem = stop_problem(snap.pid)
                if problem is None:
                    continue
                found = True
                if snap is self.chain.pending and self.run is not None:
                    self.run.snapshot_error = f"its snapshot was killed: {problem}"  # said in this run's reply
                else:
                    self.spare_note = f"session: a snapshot was killed: {problem}; the state it held is gone"
                self.chain.remove(snap)
            if self.spare is not None:
                problem = stop_problem(self.spare.pid)
                if problem is not None:
                    found = True
                    self.discard_spare()
                    self.spare_note = f"session: the spare was killed: {problem}"
            if not found:
                self.held_checked = True
                return
            self.reap()

    def spared(self):
        """Pids the end of a run must not kill: the snapshots' and the spare's."""
        return self.chain.pids() | ({self.spare.pid} if self.spare is not None else set())

    def kill_strays(self):
        """SIGKILL every process of the session that is neither a snapshot nor the spare, until none is left."""
        while True:
            pids = subtree(os.getpid(), self.spared())
            if not pids:
                return
            _launch.kill_processes(None, pids)
            self.reap()
            select.select([], [], [], 0.001)

    def sources(self, request):
        """The snapshots to fork the run from, in order: the latest kept one, then older ones, then the base."""
        return self.chain.sources(carried=request.get("from") == "current")

    def fork_from(self, source, request, named):
        """One try: ``(pid, following socket, note)``, or ``(None, None, why)`` after dropping ``source``."""
        following, theirs = snapshot_ends(request)
        go_r, go_w = os.pipe()
        names = [name for name in named if name != "control"] + ["go"] + list(theirs)
        carried = [named[name] for name in names if name != "go" and name not in theirs] + [go_r]
        carried += [end.fileno() for end in theirs.values()]
        try:
            # Nor the spare: a process held for the next cell is never a run's command (its kill would wait for it).
            pid = source.fork(dict(request, handoff=names), carried, self.spared())
            os.write(go_w, b"x")
            return pid, following, None
        except OSError as exc:
            problem = exc.strerror or str(exc)
        finally:
            os.close(go_r)
            os.close(go_w)  # the command that was not told to go reads end of file, and leaves
            for end in theirs.values():
                end.close()
        for end in following or ():
            end.close()
        which = "base" if source is self.chain.base else "latest"
        self.drop(source)
        return (
            None,
            None,
            (
                f"session: the {which} snapshot did not fork the run ({problem}); it was dropped, and the run "
                "was forked from the one before it"
            ),
        )

    def drop(self, snapshot):
        """Kill a snapshot that misbehaved, and every process of the session that is not a kept snapshot."""
        if self.spare is not None and self.spare.source is snapshot:
            self.discard_spare()
        self.chain.remove(snapshot)
        spared = self.spared()
        _launch.kill_processes(None, subtree(os.getpid(), spared))
        self.reap()

    def set_processes(self, request):
        """The run's processes limit on the session's pids cgroup: the session's own tasks, plus the run's.

        Counted here (the keeper and its snapshots, threads included, from
        /proc/PID/stat), not read from ``pids.current``, which still counts the
        last run's unreaped zombies.  Between runs the session has no other
        processes (:meth:`kill_strays`); one it had would only lower the limit.
        The spare, which becomes the run's command, is the run's.  A process's
        tasks are counted once, when it first is in the chain (a stopped
        process starts no thread; a cell adds one snapshot and lets one go),
        and the file is written only when the limit changed.
        """
        cgroup = self.config.get("cgroup")
        if not cgroup:
            return
        counts = {}
        for pid in [os.getpid(), *self.chain.pids()]:
            counts[pid] = self.tasks_of.get(pid)
            if counts[pid] is None:
                state = process_state(pid)
                counts[pid] = state[2] if state is not None else 0
        self.tasks_of = counts
        try:
            # The limit counts the command itself. The snapshot and the spare it forks when its
            # cell has finished come out of the run's own processes (a spare that does not fit is
            # not made; a snapshot that does not fit is a state lost, as any fork refused).
            limit = sum(counts.values()) + 1 + int(request["limits"]["processes"])
            if limit != self.pids_max:
                with open(os.path.join(cgroup, "pids.max"), "w") as f:
                    f.write(str(limit))
                self.pids_max = limit
        except (OSError, ValueError):
            self.pids_max = None

    def pids_refusals(self):
        """How many forks the session's pids cgroup has refused so far (``max`` in ``pids.events``), or ``None``."""
        cgroup = self.config.get("cgroup")
        if not cgroup:
            return None
        try:
            words = read_proc(os.path.join(cgroup, "pids.events")).split()
        except OSError:
            return None
        counts = dict(zip(words[::2], words[1::2], strict=False))
        return int(counts.get(b"max", b"0"))

    def enforce_cpu(self):
        """SIGKILL each process of the run whose CPU time reached the run's hard limit (soft + 1 s, setrlimit(2)).

        Looked at every :data:`CPU_CHECK` seconds, not at every turn of the loop.
        """
        run, now = self.run, time.monotonic()
        if now < run.next_cpu_check:
            return
        run.next_cpu_check = now + CPU_CHECK
        spared = self.spared()
        spent = [pid for pid in subtree(os.getpid(), spared) if cpu_seconds(pid) >= run.cpu_hard]
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
            Snapshot.dying.discard(pid)
            snapshots.HELD.discard(pid)  # its pid may come again, for a process the keeper has not stopped
            run = self.run
            if run is not None:
                run.peak_kib = max(run.peak_kib, usage.ru_maxrss)
                if pid == run.pid and run.status is None:
                    run.status, run.rusage = status, usage
            if self.spare is not None and pid == self.spare.pid:
                self.spare.sock.close()
                self.spare = None
            self.chain.forget(pid)

    def kill_run(self):
        """SIGKILL every process of the run (every descendant but the snapshots) until none is left.

        Once the command is reaped, every process it left is in this
        process's subtree (its orphans were re-parented here before it could
        be reaped), so one scan that finds none of them is the end.
        """
        run = self.run
        while True:
            spared = self.spared()
            # Below a snapshot too: whatever cell code a snapshot ran (an at-fork handler's
            # child) is the run's, and dies with it.
            pids = subtree(os.getpid(), spared)
            run.killed.update(pid for pid in pids if pid != run.pid and pid not in Snapshot.dying)
            _launch.kill_processes(run.pid if run.status is None else None, pids)
            self.reap()
            if not pids and run.status is not None:
                return
            select.select([], [], [], 0.001)

    def end_run(self):
        """The command has ended: take its snapshot, kill the rest, report, ask the snapshot for the next spare."""
        run = self.run
        self.take_snapshot(run)
        self.kill_run()
        # Stopped (again, now that no other process of the run is left to continue them) before the report.
        if self.chain.pending is not None:
            problem = self.chain.pending.stop()
            if problem is not None:
                self.chain.remove(self.chain.pending)
                run.snapshot_error = f"its snapshot was killed: {problem}"
        if self.spare is not None:
            problem = stop_process(self.spare.pid)
            if problem is not None:
                self.discard_spare()
                self.spare_note = f"session: the spare was killed: {problem}"
        self.check_held()
        self.report(run)
        for fd in (run.status_fd, run.control_fd):
            try:
                os.close(fd)
            except OSError:
                pass
        self.run = None
        self.make_spare()  # from the base, for a run that left none

    def take_snapshot(self, run):
        """Accept the snapshot and the spare the finished command named, if they are children of ours; stop them.

        fork(2) copied the command's main thread only; a thread that an at-fork
        handler of the cell's starts in either is stopped with it (SIGSTOP stops
        the whole process), here and again before the run's report
        (:meth:`end_run`), so nothing of a cell runs after its reply.
        """
        following, run.following = run.following, None
        next_spare, run.next_spare = run.next_spare, None
        if following is None:
            if next_spare is not None:
                next_spare.close()
            return
        # The command's process is a cell's, and so are all it left: every word they queued is read, and what they
        # sent beside one is closed.  The command names its snapshot just before it exits, after any word a cell of
        # it sent: the last word is its own.  One that ended as a finished module (exit status 0 or 1) has sent it,
        # and it is waited for unless a word was read at a stop (own_snapshot).
        finished = os.WIFEXITED(run.status) and os.WEXITSTATUS(run.status) in (0, 1)
        words = queued_words(following, snapshots.SNAPSHOT_TIMEOUT if finished and run.hello is None else 0)
        if run.refused:
            hello = None
        elif names_itself(run.hello, run.pid):
            hello = run.hello  # the word it stopped on as its own snapshot is the one
        else:
            hello = words[-1] if words else run.hello
        pid = hello.get("pid") if isinstance(hello, dict) else None
        if isinstance(hello, dict) and isinstance(hello.get("error"), str):
            run.snapshot_error = hello["error"][:200]
        snapshot = Snapshot(pid, following)
        snapshot.shared = checked_shared(hello.get("shared") if isinstance(hello, dict) else None)
        if not own_child(pid) or not self.chain.offer(snapshot, stop=False):
            following.close()
            if next_spare is not None:
                next_spare.close()
            return
        if next_spare is not None and own_child(hello.get("spare"), self.chain.pids()):
            self.discard_spare()
            self.spare = Spare(hello["spare"], next_spare, self.chain.pending)
        elif next_spare is not None:
            next_spare.close()
        for held in (self.chain.pending, self.spare):
            if held is not None:
                try:
                    os.kill(held.pid, signal.SIGSTOP)
                except OSError:
                    pass

    def own_snapshot(self):
        """End the run whose command stopped as its own snapshot (:func:`snapshots.become_own_snapshot`).

        Its end is what the OS reports: a stop by SIGSTOP (waitid(2)
        ``WSTOPPED``), taken as exit status 0, and its word on its socket must
        name itself (else it is a stop of the cell's own, and the run goes on
        until its deadline).  The stop is checked as every stop the keeper
        keeps (:func:`stop_problem`: a real group stop, not traced), with one
        task and no children; a command that fails it is killed and leaves no
        snapshot (the run's reply says so).  Its CPU time and peak come from
        /proc at the stop (proc(5): ``schedstat``, ``VmHWM``), as wait4(2)
        would give them.
        """
        run = self.run
        try:
            report = os.waitid(os.P_PID, run.pid, os.WSTOPPED | os.WNOHANG)
        except ChildProcessError:
            return
        if report is None or report.si_code != os.CLD_STOPPED or report.si_status != signal.SIGSTOP:
            return
        # Every word queued: the cell may have sent words of its own before the one the command stopped on.
        words = queued_words(run.following)
        if not words:
            return
        own = [word for word in words if names_itself(word, run.pid)]
        run.hello = own[0] if own else words[-1]
        if not own:
            return  # a stop of the cell's; its last word may be the old way's, kept for when it ends (take_snapshot)
        try:
            status = read_proc(f"/proc/{run.pid}/status")  # one read for the three looks below
        except OSError:
            status = None
        run.own_usage = own_usage(run.pid, status)
        run.status = 0
        problem = stop_problem(run.pid, status) or alone_problem(run.pid, status)
        if problem is not None:
            run.refused = True
            run.snapshot_error = f"its snapshot was killed: {problem}"
            try:
                os.kill(run.pid, signal.SIGKILL)
            except OSError:
                pass
        else:
            # Its stop's report is taken: any later one is a stop the keeper did not make (check_stopped).
            snapshots.HELD.add(run.pid)

    def report(self, run):
        status = run.status
        record = {
            "event": "exit",
            "killed": len(run.killed),
            "kill_requested": run.kill_requested,
            "snapshot": self.chain.pending is not None,
        }
        if run.snapshot_error and self.chain.pending is None:
            record["snapshot_error"] = run.snapshot_error
        # What the settle will answer either way, so the kernel need not wait for it.
        record["settle"] = {"keep": self.chain_facts(True), "drop": self.chain_facts(False)}
        if os.WIFSIGNALED(status):
            record["signal"] = os.WTERMSIG(status)
        else:
            record["exit_code"] = os.WEXITSTATUS(status)
        if run.refusals_before is not None:
            record["pids_refused"] = (self.pids_refusals() or 0) > run.refusals_before
        mine = run.rusage
        command_cpu, command_peak = (mine.ru_utime + mine.ru_stime, mine.ru_maxrss) if mine else run.own_usage
        record["command_cpu"] = command_cpu
        record["cpu"] = max(record["command_cpu"], Run.children_cpu() - run.cpu_before)
        record["peak_kib"] = max(run.peak_kib, command_peak)
        _launch.emit(run.status_fd, record)

    # ---------------------------------------------------------------- the chain

    def settle(self, keep, kind="cell"):
        """Keep the newest snapshot as the state, or drop it (:meth:`Chain.settle`); ``kind``: what made it."""
        kept = self.chain.settle(keep, kind)
        self.reap()
        current = self.chain.current()
        return {"kept": kept, "depth": len(self.chain.kept), "rss": resident_of(current.pid if current else None)}

    def chain_facts(self, keep):
        """``{"depth", "rss"}`` that :meth:`settle` will answer for ``keep`` (no pending snapshot: as dropped).

        The depth is a cell's: a comm run's facts are not shown (it has no reply).
        """
        chain = self.chain
        if keep and chain.pending is not None:
            state, depth = chain.pending, chain.depth_if_kept()
        else:
            state, depth = chain.current(), len(chain.kept)
        facts = {"depth": depth, "rss": resident_of(state.pid if state else None)}
        if not keep and state is not None:
            # The dropped cell wrote what it liked into the state's shared memory: that stays.
            facts["shared"] = with_segments(state.shared)
        return facts

    def undo(self, count):
        """Drop the newest ``count`` kept snapshots (:meth:`Chain.undo`)."""
        undone = self.chain.undo(count)
        self.reap()
        current = self.chain.current() or self.chain.base
        # Later cells wrote what they liked into the restored state's shared memory: that stays.
        shared = with_segments(current.shared) if undone and current is not None else {"count": 0}
        return {"undone": undone, "depth": len(self.chain.kept), "shared": shared}

    def let_go(self, count):
        """Kill the ``count`` oldest kept snapshots (:meth:`Chain.let_go`); reply once they and every snapshot killed
        before (an evicted one, say) have exited, or after ``LET_GO_TIMEOUT`` seconds, so their memory is given back
        when the kernel reads its cgroup again.  ``count`` 0 only waits."""
        gone = 0
        while gone < count and self.chain.let_go() is not None:
            gone += 1
        deadline = time.monotonic() + LET_GO_TIMEOUT
        self.reap()
        while Snapshot.dying and time.monotonic() < deadline:
            time.sleep(0.002)
            self.reap()
        return {"let_go": gone, "depth": len(self.chain.kept)}

    def stat(self):
        size, resident = vm_size()
        snaps = self.chain.snapshots()
        return {
            "vm_size": size,
            "rss": resident,
            "snapshots": [{"pid": snap.pid, **memory_of(snap.pid)} for snap in snaps],
            "keeper": memory_of(os.getpid()),
        }


def names_itself(word, pid):
    """Whether ``word`` is the snapshot word of a command ``pid`` that stopped as its own snapshot."""
    return isinstance(word, dict) and word.get("event") == "snapshot" and word.get("pid") == pid


def own_usage(pid, status):
    """``(CPU seconds, peak resident KiB)`` of a stopped child ``pid``, from /proc (proc(5)), as wait4(2) gives them.

    CPU from ``schedstat`` (nanoseconds on the CPU), else ``stat``'s ticks;
    the peak is ``VmHWM`` of ``status``, its /proc/PID/status (bytes, ``None``
    when unreadable).  Zeros where unreadable.
    """
    try:
        cpu = int(read_proc(f"/proc/{pid}/schedstat").split()[0]) / 1e9
    except (OSError, ValueError, IndexError):
        cpu = cpu_seconds(pid)
    try:
        peak = int(status_field(status, b"VmHWM").split()[0]) if status is not None else 0
    except (ValueError, IndexError):
        peak = 0
    return cpu, peak


def alone_problem(pid, status):
    """Why stopped ``pid`` is not one task without children (a snapshot must be), or ``None``.

    ``status`` is its /proc/PID/status (bytes), ``None`` when it could not be read.
    """
    if status is None:
        return "it is gone"
    threads = status_field(status, b"Threads").decode("ascii", "replace").strip()
    if threads != "1":
        return f"it had {threads or 'an unknown number of'} threads"
    try:
        if read_proc(f"/proc/{pid}/task/{pid}/children").split():
            return "it had children"
    except OSError:
        return "its children could not be read"
    return None


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


def main():
    # Started with KEEPER_FLAGS; this also holds for a keeper started without them, before the preload.
    trusted_sys_path()
    config = json.loads(sys.argv[1])
    set_name(KEEPER_NAME)
    sock = socket.socket(fileno=int(config.get("fd", 3)))
    started = time.monotonic()
    loaded, failed = preload(config.get("preload", []), config.get("warm"))
    snapshots.PREFETCHED = prefetch(config.get("warm"))
    _launch.become_subreaper(2)
    gc.collect()
    gc.freeze()
    config.setdefault("cgroup", own_pids_cgroup())
    snapshots.find_tid_offset()  # before any fork: it starts and joins a thread
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
    keeper.make_spare()
    keeper.serve()


if __name__ == "__main__":
    main()
