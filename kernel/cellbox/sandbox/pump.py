"""Reading a run's pipes: its output under the output limit, its status, its channel, its stdin.

:class:`Pump` is the part of :class:`~cellbox.sandbox.runs.Run` that reads
until the run is over: stdout and stderr (kept up to the ``output`` limit;
one byte more stops the run), the launcher's status lines (notes, the
command's pid, its exit record), the JSON-lines channel of a run that has one,
and stdin, all on one selector, with the wall-clock deadline and the kill's
grace period as its timeouts.
"""

from __future__ import annotations

import json
import os
import selectors
import subprocess
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .limits import Limits
from .outcome import Status

if TYPE_CHECKING:
    from .runs import _Forked, _Stream

__all__ = ["Pump", "KILL_GRACE", "READ_SIZE", "CHANNEL_LINE_MAX", "CHANNEL_TOTAL_MAX"]

# Seconds the launcher gets to kill the tree and report before the parent
# kills the launcher itself and stops reading.
KILL_GRACE = 2.0
READ_SIZE = 65536
# Bytes of one message line on the channel, and of all of them in one run:
# rich output (a PNG plot) travels there, so it is larger than ``output``.
CHANNEL_LINE_MAX = 32 * 1024**2
CHANNEL_TOTAL_MAX = 128 * 1024**2


class Pump:
    """The reading of one :class:`~cellbox.sandbox.runs.Run` (a mixin: the run holds the state named below)."""

    limits: Limits
    proc: subprocess.Popen[bytes] | _Forked
    deadline: float
    truncated: bool
    _lock: threading.Lock
    _parent_action: Status | None
    _kill_at: float | None
    _swept: int | None
    _status_r: int
    _wake_r: int
    _channel_r: int | None
    _stdin_pending: bytes
    _streams: dict[str, _Stream]
    _notes: list[str]
    _isolation: list[str]
    _on_message: Callable[[Any], None] | None
    _command_pid: int | None

    if TYPE_CHECKING:

        def kill(self, reason: Status = Status.INTERRUPTED) -> None: ...

        def _control(self, word: str) -> None: ...

        def _force_kill(self) -> None: ...

        def _sweep(self) -> None: ...

    def _pump(self) -> tuple[dict[str, Any] | None, str | None]:
        assert self.proc.stdout is not None and self.proc.stderr is not None
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout.fileno(), selectors.EVENT_READ, "stdout")
        sel.register(self.proc.stderr.fileno(), selectors.EVENT_READ, "stderr")
        sel.register(self._status_r, selectors.EVENT_READ, "status")
        sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        if self._channel_r is not None:
            sel.register(self._channel_r, selectors.EVENT_READ, "channel")
        if self.proc.stdin is not None:
            sel.register(self.proc.stdin.fileno(), selectors.EVENT_WRITE, "stdin")
            os.set_blocking(self.proc.stdin.fileno(), False)
        status_buf, channel_buf = bytearray(), bytearray()
        self._kept = 0
        self._channel_total = 0
        record: dict[str, Any] | None = None
        exec_error: str | None = None
        open_count = len(sel.get_map()) - 1  # every source but the wake pipe
        give_up_at: float | None = None
        while open_count > 0:
            now = time.monotonic()
            with self._lock:
                kill_at = self._kill_at
            if give_up_at is not None and now >= give_up_at and (record is not None or self._swept is not None):
                break  # the tree is dead; what still holds the output left it and is not waited for
            if self._parent_action is None and now >= self.deadline:
                self.kill(Status.TIMED_OUT)
                continue
            if kill_at is not None and now >= kill_at:
                if give_up_at is None:
                    self._control("kill")
                    give_up_at = now + KILL_GRACE
                elif now >= give_up_at:
                    self._force_kill()
                    break
            timeout = min(t for t in (self.deadline, kill_at, give_up_at) if t is not None) - now
            for key, _ in sel.select(max(0.0, min(timeout, 1.0))):
                name = key.data
                if name == "wake":
                    os.read(self._wake_r, 4096)
                    continue
                if name == "stdin":
                    if not self._write_stdin(key.fd):
                        sel.unregister(key.fd)
                        self._close_stdin()
                        open_count -= 1
                    continue
                data = self._read(key.fd)
                if name in ("stdout", "stderr"):
                    self._on_output(name, data)
                elif name == "status":
                    status_buf += data
                    while b"\n" in status_buf:
                        line, _, rest = status_buf.partition(b"\n")
                        status_buf[:] = rest
                        record, exec_error = self._on_status(bytes(line), record, exec_error)
                    if record is not None and data:
                        # The exit record is the launcher's last word: its own exit is not
                        # waited for (a fork server's supervisor unmaps a large address space).
                        sel.unregister(key.fd)
                        open_count -= 1
                        continue
                elif name == "channel":
                    self._on_channel(data, channel_buf)
                if not data:
                    sel.unregister(key.fd)
                    open_count -= 1
                if not data and name == "status" and record is None and self._swept is None:
                    # The supervisor is gone without its report: nobody kills the tree but us.
                    self._sweep()
                    give_up_at = time.monotonic() + KILL_GRACE
            if record is not None and give_up_at is None:
                # The launcher has reported and killed what was left; output
                # still held by something outside its tree is not waited for.
                give_up_at = time.monotonic() + KILL_GRACE
        sel.close()
        for stream in self._streams.values():
            stream.feed(b"", final=True)
        return record, exec_error

    @staticmethod
    def _read(fd: int) -> bytes:
        try:
            return os.read(fd, READ_SIZE)
        except OSError:
            return b""

    def _write_stdin(self, fd: int) -> bool:
        if not self._stdin_pending:
            return False
        try:
            written = os.write(fd, self._stdin_pending[:READ_SIZE])
        except BlockingIOError:
            return True
        except OSError:
            return False
        self._stdin_pending = self._stdin_pending[written:]
        return bool(self._stdin_pending)

    def _close_stdin(self) -> None:
        if self.proc.stdin is not None:
            try:
                self.proc.stdin.close()
            except OSError:
                pass

    def _on_output(self, name: str, data: bytes) -> None:
        if not data:
            return
        room = self.limits.output - self._kept
        if len(data) > room:
            # One byte past the limit stops the run; what is past it is
            # drained and dropped while the tree is killed.
            data = data[: max(room, 0)]
            if not self.truncated:
                self.truncated = True
                self.kill(Status.OUTPUT_LIMIT)
        if data:
            self._kept += len(data)
            self._streams[name].feed(data)

    def _on_status(self, line: bytes, record: dict[str, Any] | None, exec_error: str | None):  # type: ignore[no-untyped-def]
        try:
            message = json.loads(line)
        except ValueError:
            return record, exec_error
        event = message.get("event")
        if event == "note":
            self._notes.append(str(message.get("text")))
            if str(message.get("text")).startswith("subreaper"):
                self._isolation.remove("subreaper")
            if str(message.get("text")).startswith("landlock:") and "landlock" in self._isolation:
                self._isolation.remove("landlock")
            if str(message.get("text")).startswith("signal-scope:") and "signal-scope" in self._isolation:
                self._isolation.remove("signal-scope")
        elif event == "command" and isinstance(message.get("pid"), int):
            self._command_pid = message["pid"]
        elif event == "exec_error":
            exec_error = str(message.get("text"))
        elif event == "exit":
            record = message
        return record, exec_error

    def _on_channel(self, data: bytes, buf: bytearray) -> None:
        self._channel_total += len(data)
        if self._channel_total > CHANNEL_TOTAL_MAX:
            self.truncated = True
            self.kill(Status.OUTPUT_LIMIT)
            return
        buf += data
        while b"\n" in buf:
            line, _, rest = buf.partition(b"\n")
            buf[:] = rest
            if self._on_message is None or not line.strip():
                continue
            try:
                message = json.loads(line)
            except ValueError:
                continue  # not ours to guess at; the child's runner speaks JSON lines only
            self._on_message(message)
        if len(buf) > CHANNEL_LINE_MAX:
            buf.clear()
            self.truncated = True
            self.kill(Status.OUTPUT_LIMIT)
