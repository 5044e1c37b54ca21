"""The submission's process as the trusted side holds it: a sandboxed run of the worker and an execnet channel.

Used by :mod:`cellbox.grading.bridge` in the trusted test process.
:class:`Connection` starts the worker (:mod:`cellbox.grading.worker`) through
:func:`cellbox.sandbox.start`, with the grading limits and isolation and a
socket at fd 3, and opens one execnet channel to it.  The IO under execnet
(:class:`_TrustedIO`) refuses a message longer than :data:`MESSAGE_MAX`, so a
submission cannot make this process hold more than that at once.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import threading
from pathlib import Path
from typing import Any

import execnet
from execnet import gateway_base

from ..sandbox.environment import TaskDirectory
from ..sandbox.isolation import Isolation
from ..sandbox.limits import Limits
from ..sandbox.outcome import Outcome
from ..sandbox.runs import Run, start

__all__ = ["Connection", "ProcessSpec", "offered_modules", "WORKER_BOOT", "MESSAGE_MAX", "ENDED_WAIT"]

# Run by the submission's interpreter with -I: the worker's library first, the
# submission's folder after the standard library (a student's json.py does not
# replace the json the worker and the standard library import), before site-packages.
WORKER_BOOT = (
    "import sys, site; lib, root = sys.argv[1], sys.argv[2]; packages = set(site.getsitepackages()); "
    "sys.path[:] = [lib] + [p for p in sys.path if p not in packages] + [root] "
    "+ [p for p in sys.path if p in packages]; import cellbox_worker; cellbox_worker.main(3, root)"
)
WORKER_FD = 3
MESSAGE_MAX = 256 * 1024**2  # bytes of one message from the submission; larger ends the connection
START_TIMEOUT = 60.0  # seconds the submission's process gets to answer its first request, without a deadline
ENDED_WAIT = 15.0  # seconds to wait for a killed process's outcome (the sandbox's kill grace is 2 s, twice)


@dataclasses.dataclass(frozen=True)
class ProcessSpec:
    """How to start the submission's process (written by the grader into the trusted process's config).

    Attributes:
        python: the task venv's interpreter.
        lib: the task's worker library (``cellbox_worker`` and what it imports).
        root: the submission's folder: working directory, on ``sys.path`` after the standard library.
        task: the task directory (``home``, ``work``, ``tmp``), made and removed by the grader.
        limits: the sandbox limits of each submission process.
        isolation: its isolation layers.
        env: names added to the allowlisted environment.
    """

    python: str
    lib: str
    root: str
    task: str
    limits: Limits
    isolation: Isolation
    env: dict[str, str]

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ProcessSpec:
        return cls(
            python=data["python"],
            lib=data["lib"],
            root=data["root"],
            task=data["task"],
            limits=Limits(**data["limits"]),
            isolation=Isolation.from_options(**data["isolation"]),
            env=dict(data["env"]),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "python": self.python,
            "lib": self.lib,
            "root": self.root,
            "task": self.task,
            "limits": self.limits.as_dict(),
            "isolation": dataclasses.asdict(self.isolation),
            "env": self.env,
        }


def offered_modules(root: Path, venv: Path | None = None) -> list[str]:
    """Top-level module names the submission offers: its folder's modules and packages, and what pip put in its venv.

    Read from the file names only; nothing is imported.
    """
    folders = [root, *(venv.glob("lib/python*/site-packages") if venv is not None else [])]
    names: set[str] = set()
    for folder in folders:
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            name = entry.name
            if entry.is_dir(follow_symlinks=False):
                stem = name
            elif name.endswith(".py") or name.endswith(".so"):
                stem = name.split(".", 1)[0]
            else:
                continue
            if stem.isidentifier() and not stem.startswith("__") and not stem.startswith("_distutils"):
                names.add(stem)
    return sorted(names)


class _TrustedIO:
    """execnet's IO over this side's socket; a message longer than :data:`MESSAGE_MAX` ends the connection."""

    def __init__(self, sock: socket.socket, execmodel: Any) -> None:
        self.sock = sock
        self.execmodel = execmodel

    def read(self, numbytes: int) -> bytes:
        if numbytes > MESSAGE_MAX:
            raise EOFError(f"a message of {numbytes} bytes from the submission (more than {MESSAGE_MAX})")
        chunks, got = [], 0
        while got < numbytes:
            data = self.sock.recv(min(numbytes - got, 1024**2))
            if not data:
                raise EOFError(f"expected {numbytes} bytes, got {got}")
            chunks.append(data)
            got += len(data)
        return b"".join(chunks)

    def write(self, data: bytes) -> None:
        self.sock.sendall(data)

    def close_read(self) -> None:
        self._shutdown(socket.SHUT_RD)

    def close_write(self) -> None:
        self._shutdown(socket.SHUT_WR)

    def _shutdown(self, how: int) -> None:
        try:
            self.sock.shutdown(how)
        except OSError:
            pass

    def wait(self) -> None:
        return None

    def kill(self) -> None:
        return None


class Connection:
    """One submission process: a sandboxed run of the worker, and the execnet channel to it.

    Args:
        spec: how to start it.
        numpy: whether this side can take numpy arrays as arrays.

    Raises:
        SandboxError: the run could not be started (a strict isolation layer missing).
    """

    def __init__(self, spec: ProcessSpec, numpy: bool) -> None:
        self.spec = spec
        self.numpy = numpy
        self.outcome: Outcome | None = None
        self.failure = ""
        self._ended = threading.Event()
        ours, theirs = socket.socketpair()
        self.sock = ours
        try:
            self.run: Run = start(
                [spec.python, "-I", "-B", "-u", "-c", WORKER_BOOT, spec.lib, spec.root],
                limits=spec.limits,
                cwd=spec.root,
                env=spec.env,
                task=_task(spec.task),
                isolation=spec.isolation,
                pass_fds={theirs.fileno(): WORKER_FD},
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        threading.Thread(target=self._wait, name="cellbox-submission-wait", daemon=True).start()
        self.channel: Any = None

    def _wait(self) -> None:
        try:
            self.outcome = self.run.wait()
        except Exception as exc:  # noqa: BLE001 - said in ended(); the sandbox has killed the run
            self.failure = f"{type(exc).__name__}: {exc}"
        finally:
            self._ended.set()
            # A descendant may still hold the other end: end the conversation from here.
            try:
                self.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def connect(self) -> None:
        """Start the worker's serving loop on a new execnet channel (once)."""
        if self.channel is not None:
            return
        execmodel = gateway_base.get_execmodel("thread")
        gateway = execnet.Gateway(_TrustedIO(self.sock, execmodel), execnet.XSpec("popen//id=submission"))
        self.channel = gateway.remote_exec("import cellbox_worker\ncellbox_worker.WORKER.serve(channel)")
        self.channel.send(("hello", (self.numpy,), []))
        self.channel.receive(START_TIMEOUT)

    def request(self, message: tuple[Any, ...], timeout: float | None) -> Any:
        """Send one request and wait up to ``timeout`` seconds (``None``: no limit) for its answer."""
        self.channel.send(message)
        return self.channel.receive(timeout)

    def kill(self) -> None:
        """Kill the process and everything it started; :attr:`outcome` is set once the sandbox has reported."""
        self.run.kill()

    def ended(self, wait: float = 5.0) -> str:
        """How the process ended, in words (``exit status 0``, ``SIGKILL``, ``memory_limit``)."""
        self._ended.wait(wait)
        outcome = self.outcome
        if outcome is None:
            return self.failure or "it stopped answering"
        if outcome.signal:
            return f"{outcome.status.value}, {outcome.signal}"
        if outcome.status.value not in ("ok", "error"):
            return outcome.status.value
        return f"exit status {outcome.exit_code}"

    def close(self) -> Outcome | None:
        """Kill the process and return its outcome (``None`` when the sandbox did not report in time)."""
        self.kill()
        self._ended.wait(ENDED_WAIT)
        self.sock.close()
        return self.outcome


def _task(path: str) -> TaskDirectory:
    root = Path(path)
    return TaskDirectory(path=root, home=root / "home", work=root / "work", tmp=root / "tmp")
