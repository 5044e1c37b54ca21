"""Many short Python and pytest runs from one warm process, each in a fork of its own.

The lesson tests feed dozens of wrong answers through a check cell (a Python script) and through the lesson's
hidden tests (a pytest run).  A new interpreter for each, importing pytest again every time, costs more than most
of the runs themselves; so the tests hand every run to one worker, this file run as a script, and wait only for
the result of their own run.

Who talks to whom (the shape of CPython's ``multiprocessing.forkserver``, with plain JSON lines):

* :class:`Runner` (the test side) starts ``python forkruns.py PARALLEL`` once, writes :class:`Job` lists to its
  stdin as JSON lines, and reads :class:`Result` lines from its stdout.  Closing stdin stops the worker.
* :func:`main` (the worker) imports pytest once, then forks one child per job, at most ``PARALLEL`` at a time, in
  the order the jobs came.  The worker has no threads, so forking it is safe.
* Each child starts a session of its own (setsid(2)), reads stdin from /dev/null, writes stdout and stderr to
  files in the job's folder, and runs the job as ``python -c SCRIPT`` would (a fresh ``__main__``, ``sys.path[0]``
  the empty string, atexit handlers at the end) or as ``python -m pytest ARGS`` would.  Whatever a job does to
  its process (setrlimit, os.nice, builtins, os._exit, a signal, a hang) stays in its own fork.
* A job still running at its deadline is killed with its whole session (SIGKILL to the group) and its result says
  ``late``; whatever a finished job left in its session is killed too, as ``_run_and_reap`` does for one run.
"""

from __future__ import annotations

import atexit
import builtins
import collections
import dataclasses
import json
import os
import select
import signal
import subprocess
import sys
import time
import traceback
import types
from pathlib import Path
from typing import Any

POLL = 0.02  # seconds between looks at the children and at stdin


@dataclasses.dataclass(frozen=True)
class Job:
    """One run for the worker.

    Args:
        key: names the run; the result carries it back (a test id and what ran, say).
        kind: ``"python"`` (``argv[0]`` is the script, as for ``python -c``) or ``"pytest"`` (``argv`` are pytest's
            arguments, as for ``python -m pytest``).
        argv: the script, or pytest's arguments.
        cwd: the working directory of the run.
        folder: where the worker writes the run's stdout and stderr (files ``stdout``, ``stderr``).
        deadline: seconds the run may take before its session is killed.
        env: variables set in the run's environment, over the worker's own.
        path: folders put first on ``sys.path`` (for ``pytest``, as PYTHONPATH would; ``python -c`` has ``""``).
    """

    key: str
    kind: str
    argv: list[str]
    cwd: str
    folder: str
    deadline: float
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    path: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(frozen=True)
class Result:
    """How one job ended: ``returncode`` as subprocess gives it (negative: the signal), its output, and whether it
    was killed at its deadline (``late``); ``seconds`` is its wall time."""

    key: str
    returncode: int
    stdout: str
    stderr: str
    late: bool
    seconds: float

    def completed(self) -> subprocess.CompletedProcess[str]:
        """The result as ``subprocess.run`` would give it (``args`` is the key)."""
        return subprocess.CompletedProcess(self.key, self.returncode, self.stdout, self.stderr)


# ------------------------------------------------------------------ the test side


class Runner:
    """The test side: one worker process for a whole test session.

    Args:
        parallel: how many jobs run at once (each a fork of the worker).
        folder: where the worker's own stderr goes (``worker.stderr``), for the message when it ends early.

    Use as a context manager: leaving it stops the worker, which kills the sessions of the jobs still running.
    """

    def __init__(self, parallel: int, folder: Path) -> None:
        self.log = folder / "worker.stderr"
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, __file__, str(parallel)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                start_new_session=True,
            )
        self.sent: dict[str, Job] = {}
        self.results: dict[str, Result] = {}
        self.buffer = b""

    def __enter__(self) -> Runner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def submit(self, jobs: list[Job]) -> None:
        """Queue ``jobs`` behind those already sent; a key already sent is not sent again."""
        fresh = [job for job in jobs if job.key not in self.sent]
        for job in fresh:
            self.sent[job.key] = job
        if fresh:
            assert self.proc.stdin is not None
            self.proc.stdin.write(json.dumps([dataclasses.asdict(job) for job in fresh]).encode() + b"\n")
            self.proc.stdin.flush()

    def result(self, job: Job) -> Result:
        """The result of ``job`` (sent now if it was not yet), waiting for it alone.

        Raises:
            RuntimeError: the worker ended, or said nothing for longer than every deadline sent could explain.
        """
        self.submit([job])
        # The worker starts jobs in order, so by the time a test asks, its job is running or next; it reports every
        # job by its deadline.  The margin covers the worker's polling and a loaded machine.
        patience = max(sent.deadline for sent in self.sent.values()) + 60
        while job.key not in self.results:
            self._read(patience)
        return self.results[job.key]

    def _read(self, patience: float) -> None:
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        ready, _, _ = select.select([fd], [], [], patience)
        chunk = os.read(fd, 1 << 16) if ready else b""
        if not chunk:
            said = self.log.read_text(errors="replace")[-2000:]
            what = "ended" if ready else f"said nothing for {patience:.0f} s"
            raise RuntimeError(f"the fork runner {what} (exit {self.proc.poll()}): {said}")
        self.buffer += chunk
        *lines, self.buffer = self.buffer.split(b"\n")
        for line in lines:
            said = json.loads(line)  # key, returncode, late, seconds: the output is in the job's files
            folder = Path(self.sent[said["key"]].folder)
            output = {name: (folder / name).read_bytes().decode(errors="replace") for name in ("stdout", "stderr")}
            self.results[said["key"]] = Result(**said, **output)

    def close(self) -> None:
        """Stop the worker (it kills the jobs still running); kill its group if it does not end within 30 s."""
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()


# ------------------------------------------------------------------ the worker


@dataclasses.dataclass
class _Running:
    job: Job
    pid: int
    started: float


def main(argv: list[str]) -> int:
    """The worker: read jobs from stdin until it closes, run each in a fork, print each result as one JSON line."""
    import pytest  # noqa: F401  (imported once here, so every pytest job's fork starts with it)

    parallel = int(argv[0])
    queue: collections.deque[Job] = collections.deque()
    running: dict[int, _Running] = {}
    reader = _Lines(sys.stdin.fileno())
    while not reader.ended or queue or running:
        for jobs in reader.poll(POLL):
            queue.extend(Job(**job) for job in jobs)
        if reader.ended:  # the test session is over: nothing still running is wanted
            queue.clear()
            for run in running.values():
                _kill_session(run.pid)
        while queue and len(running) < parallel:
            run = _start(queue.popleft())
            running[run.pid] = run
        for run, returncode in _finished(running):
            if not reader.ended:
                _report(run, returncode, late=False)
        now = time.monotonic()
        for run in list(running.values()):
            if now - run.started > run.job.deadline:
                _kill_session(run.pid)
                os.waitpid(run.pid, 0)
                del running[run.pid]
                _report(run, -signal.SIGKILL, late=True)
    return 0


class _Lines:
    """JSON lines from a file descriptor, read without blocking the worker's loop."""

    def __init__(self, fd: int) -> None:
        self.fd, self.buffer, self.ended = fd, b"", False

    def poll(self, timeout: float) -> list[Any]:
        if self.ended:
            time.sleep(timeout)
            return []
        ready, _, _ = select.select([self.fd], [], [], timeout)
        if not ready:
            return []
        chunk = os.read(self.fd, 1 << 16)
        self.ended = not chunk
        self.buffer += chunk
        *lines, self.buffer = self.buffer.split(b"\n")
        return [json.loads(line) for line in lines if line.strip()]


def _start(job: Job) -> _Running:
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        try:
            _child(job)
        finally:
            os._exit(70)  # only if _child itself failed; it always ends the process
    return _Running(job, pid, time.monotonic())


def _finished(running: dict[int, _Running]) -> list[tuple[_Running, int]]:
    done = []
    while running:
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            break
        run = running.pop(pid, None)
        if run is not None:
            done.append((run, os.waitstatus_to_exitcode(status)))
    return done


def _report(run: _Running, returncode: int, late: bool) -> None:
    _kill_session(run.pid)  # what the job left behind in its session ends with it
    # A short line only: the output stays in the job's files, so results never fill the pipe to the test side.
    said = {"key": run.job.key, "returncode": returncode, "late": late,
            "seconds": round(time.monotonic() - run.started, 3)}
    sys.stdout.write(json.dumps(said) + "\n")
    sys.stdout.flush()


def _kill_session(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _child(job: Job) -> None:
    """In the fork: a session of its own, the job's files as stdio, then the job; never returns."""
    os.setsid()
    folder = Path(job.folder)
    for fd, path, flags in (
        (0, os.devnull, os.O_RDONLY),
        (1, str(folder / "stdout"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
        (2, str(folder / "stderr"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
    ):
        opened = os.open(path, flags, 0o600)
        os.dup2(opened, fd)
        os.close(opened)
    sys.stdin = sys.__stdin__ = open(0, encoding="utf-8", closefd=False)
    sys.stdout = sys.__stdout__ = open(1, "w", encoding="utf-8", closefd=False)
    sys.stderr = sys.__stderr__ = open(2, "w", encoding="utf-8", errors="backslashreplace", closefd=False)
    os.chdir(job.cwd)
    os.environ.update(job.env)
    atexit._clear()  # the worker's own handlers are not the job's
    status = _exit_status(_run, job)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # a job may have closed or replaced them
            pass
    os._exit(status)


def _run(job: Job) -> int:
    if job.kind == "python":
        sys.argv, sys.path[0] = ["-c"], ""
        module = types.ModuleType("__main__")
        module.__dict__["__builtins__"] = builtins
        sys.modules["__main__"] = module
        exec(compile(job.argv[0], "<string>", "exec"), module.__dict__)
        return 0
    sys.argv, sys.path[0:1] = ["pytest", *job.argv], [job.cwd]
    sys.path[0:0] = job.path
    sys.dont_write_bytecode = True
    import pytest

    return int(pytest.main(job.argv))


def _exit_status(run: Any, job: Job) -> int:
    """The exit status ``python`` would end with after ``run(job)``: its value, a SystemExit's code, or 1."""
    try:
        return int(run(job))
    except SystemExit as stop:
        if stop.code is None or isinstance(stop.code, int):
            return (stop.code or 0) & 0xFF
        print(stop.code, file=sys.stderr)
        return 1
    except BaseException:
        traceback.print_exc()
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
