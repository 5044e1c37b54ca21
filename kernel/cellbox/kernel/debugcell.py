"""Child side of the debugger: one debugged cell runs under debugpy's pydevd, which talks DAP to the kernel.

Only a cell whose spec carries ``debug`` (the kernel's debugger is started
and has breakpoints) imports this module; every other cell pays nothing.
For such a cell, in the cell's own process inside the session sandbox:

1. pydevd (debugpy's, in-process: no adapter process, no TCP port) gets one
   end of a socketpair made here; :class:`Bridge` carries its DAP messages
   (``Content-Length`` framed JSON) to the kernel as ``{"type": "dap",
   "message": ...}`` lines on the cell's channel (fd 3), and the kernel's
   ``{"dap": ...}`` lines (fd 4) back to it; any other line on fd 4 (an
   ``input()`` answer) goes to :attr:`Channel.replies`.
2. Before the cell runs, the bridge gives pydevd the session's debugger
   configuration (``initialize``, ``attach`` with ``justMyCode``,
   ``setBreakpoints`` for each file, ``setExceptionBreakpoints``,
   ``configurationDone``), whose responses the kernel answered already and
   are not forwarded.
3. When the cell ends, :meth:`Bridge.stop` stops pydevd (``stoptrace``: no
   trace function, threads unpatched), puts back ``sys.breakpointhook``,
   ends pydevd's and the bridge's threads and closes the sockets, so the
   snapshot this process leaves holds no trace of it.

pydevd is started with ``patch_multiprocessing=False``: ``os.fork`` stays the
session's own (``debugpy.listen()``'s patched fork loses the session's state).
"""

from __future__ import annotations

import importlib
import json
import os
import queue
import select
import socket
import sys
import threading
from typing import Any

__all__ = ["Bridge", "REPLAYED_SEQ"]

# The seq numbers of the requests the bridge replays to pydevd start here, beyond any frontend's.
REPLAYED_SEQ = 1 << 30
# Events of pydevd the frontend has had from the kernel already (its own debugger session's start).
NOT_FORWARDED = ("initialized", "process", "terminated")
# Seconds the bridge's reader of fd 4 waits between looks at whether it must stop.
POLL = 0.05


def _frame(message: dict[str, Any]) -> bytes:
    body = json.dumps(message).encode()
    return b"Content-Length: %d\r\n\r\n" % len(body) + body


class _Framed:
    """Reads ``Content-Length`` framed DAP messages from a socket (the DAP's base protocol)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = b""

    def read(self) -> dict[str, Any] | None:
        """The next message, or ``None`` when the socket closed."""
        while True:
            head, sep, rest = self.buffer.partition(b"\r\n\r\n")
            if sep:
                length = 0
                for line in head.split(b"\r\n"):
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value.strip())
                if len(rest) >= length:
                    self.buffer = rest[length:]
                    return dict(json.loads(rest[:length]))
            chunk = self.sock.recv(65536)
            if not chunk:
                return None
            self.buffer += chunk


class Bridge:
    """pydevd in this process, linked to the kernel through the cell's channel.

    Args:
        channel: the cell's :class:`cellbox.kernel.cellrunner.Channel`.
        config: the spec's ``debug`` object: ``breakpoints`` (``{path: [DAP
            SourceBreakpoint]}``), ``exception_filters`` (DAP filter ids),
            ``rules`` (pydevd's ``rules``: paths whose frames are not the user's).
    """

    def __init__(self, channel: Any, config: dict[str, Any]) -> None:
        self.channel = channel
        self.config = config
        self._stop = threading.Event()
        self._ours, self._theirs = socket.socketpair()
        self._threads: list[threading.Thread] = []
        self._seq = REPLAYED_SEQ
        self._replayed: set[int] = set()

    def start(self) -> None:
        """Start pydevd on this thread (the cell's main thread) with the session's breakpoints; returns at once."""
        # Its warning that frozen modules may hide breakpoints is about the standard library's, not the cell's.
        os.environ.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")
        # debugpy's own set-up of its vendored pydevd (the JSON protocol, debugpy's defaults), before pydevd.
        importlib.import_module("debugpy._vendored.force_pydevd")
        import pydevd

        self.channel.replies = queue.Queue()
        for target in (self._to_kernel, self._from_kernel):
            thread = threading.Thread(target=target, name="cellbox-debugger", daemon=True)
            # pydevd's own marks: never traced, never suspended (a stop of all threads would stop the bridge).
            thread.is_pydev_daemon_thread = True  # type: ignore[attr-defined]
            thread.pydev_do_not_trace = True  # type: ignore[attr-defined]
            thread.start()
            self._threads.append(thread)
        for command, arguments in self._configuration():
            self._replay(command, arguments)
        pydevd.start_client = lambda host, port: self._theirs  # the socketpair, never a port
        pydevd.settrace(
            host="cellbox",
            port=0,
            suspend=False,
            patch_multiprocessing=False,
            wait_for_ready_to_run=True,
        )

    def _configuration(self) -> list[tuple[str, dict[str, Any]]]:
        attach = {"justMyCode": True, "rules": list(self.config.get("rules") or [])}
        steps: list[tuple[str, dict[str, Any]]] = [
            ("initialize", {"adapterID": "cellbox", "linesStartAt1": True, "columnsStartAt1": True}),
            ("attach", attach),
        ]
        for path, breakpoints in dict(self.config.get("breakpoints") or {}).items():
            steps.append(("setBreakpoints", {"source": {"path": path}, "breakpoints": breakpoints}))
        filters = list(self.config.get("exception_filters") or [])
        steps.append(("setExceptionBreakpoints", {"filters": filters}))
        steps.append(("configurationDone", {}))
        return steps

    def _replay(self, command: str, arguments: dict[str, Any]) -> None:
        self._seq += 1
        self._replayed.add(self._seq)
        request = {"seq": self._seq, "type": "request", "command": command, "arguments": arguments}
        self._ours.sendall(_frame(request))

    def _to_kernel(self) -> None:
        """pydevd's messages to the kernel, in the order pydevd wrote them."""
        reader = _Framed(self._ours)
        while not self._stop.is_set():
            try:
                message = reader.read()
            except (OSError, ValueError):
                return
            if message is None:
                return
            if message.get("type") == "response" and message.get("request_seq") in self._replayed:
                continue  # the kernel answered the frontend's own request for it
            if message.get("type") == "event" and message.get("event") in NOT_FORWARDED:
                continue
            self.channel.send({"type": "dap", "message": message})

    def _from_kernel(self) -> None:
        """Lines of fd 4: the kernel's DAP requests to pydevd; anything else is a reply the cell waits for."""
        fd = self.channel.reply_fd
        pending = b""
        while not self._stop.is_set():
            readable, _, _ = select.select([fd], [], [], POLL)
            if not readable:
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                self.channel.replies.put({})
                return
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                self._route(line)

    def _route(self, line: bytes) -> None:
        if not line.strip():
            return
        try:
            message = json.loads(line)
        except ValueError:
            return
        if isinstance(message, dict) and isinstance(message.get("dap"), dict):
            try:
                self._ours.sendall(_frame(message["dap"]))
            except OSError:
                pass
        else:
            self.channel.replies.put(message)

    def stop(self) -> None:
        """Stop pydevd and the bridge: what the session's next snapshot forks from holds none of it."""
        pydevd = sys.modules.get("pydevd")
        try:
            if pydevd is not None:
                pydevd.stoptrace()
        finally:
            # stoptrace leaves the trace function of the frames it traced (this one's callers): cleared here.
            sys.settrace(None)
            threading.settrace(None)
            frame: Any = sys._getframe()
            while frame is not None:
                frame.f_trace = None
                frame = frame.f_back
            sys.breakpointhook = sys.__breakpointhook__
            # pydevd keeps a thread's stepping state on its Thread object: the next cell's thread starts afresh.
            main = threading.current_thread()
            for name in [name for name in vars(main) if "additional_info" in name or "pydevd" in name]:
                delattr(main, name)
            self._stop.set()
            for sock in (self._ours, self._theirs):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                sock.close()
            for thread in self._threads:
                thread.join(1.0)
            self.channel.replies = None
            if pydevd is not None:
                pydevd.start_client = _start_client()  # type: ignore[attr-defined]


def _start_client() -> Any:
    """pydevd's own ``start_client``, put back for code of the cell's that starts pydevd itself."""
    from _pydevd_bundle.pydevd_comm import start_client

    return start_client
