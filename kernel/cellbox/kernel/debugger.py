"""The kernel's side of JupyterLab's debugger: the Debug Adapter Protocol in ``debug_request``/``debug_reply``.

The Jupyter messaging spec ("Debug request") carries DAP requests on the
control channel and DAP events as ``debug_event`` on IOPub.  JupyterLab's
debugger service sends, in this order: ``debugInfo`` (to restore its state),
``initialize``, ``attach``, ``configurationDone``, then ``dumpCell`` and
``setBreakpoints`` as breakpoints are toggled, ``inspectVariables`` between
cells; when a cell stops, ``stackTrace``, ``scopes``, ``variables``, and
``continue``/``next``/``stepIn``/``stepOut``; ``disconnect`` at the end.

No cell's process lives between cells, so :class:`Debugger` answers the
session's requests itself (``debugInfo``, ``dumpCell``, ``initialize``,
``attach``, ``configurationDone``, ``setBreakpoints``,
``setExceptionBreakpoints``, ``threads``, ``disconnect``) and keeps the
breakpoints.  A cell run while the debugger is started and has breakpoints
gets them in its spec and runs under pydevd (:mod:`cellbox.kernel.debugcell`);
while it runs, the requests about its frames are forwarded to it over the
cell's own channel and its responses and events come back: the kernel only
checks their JSON shape (:func:`checked`) and forwards them, in order, never
evaluating anything they hold.  ``inspectVariables`` between cells is a run
forked from the latest snapshot (:mod:`cellbox.kernel.beside`).  Every request
gets a reply: one not supported is ``success: false`` with a ``message``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import importlib.util
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .cellnames import HASH_SEED, SUFFIX, cell_file_name

__all__ = ["Debugger", "checked", "debugpy_available", "CAPABILITIES"]

# What cellbox's debugger can do (DAP Capabilities), the initialize response's body.
CAPABILITIES: dict[str, Any] = {
    "supportsConfigurationDoneRequest": True,
    "supportsConditionalBreakpoints": True,
    "supportsHitConditionalBreakpoints": True,
    "supportsLogPoints": True,
    "supportsEvaluateForHovers": True,
    "supportsExceptionInfoRequest": True,
    "exceptionBreakpointFilters": [
        {"filter": "raised", "label": "Raised Exceptions", "default": False},
        {"filter": "uncaught", "label": "Uncaught Exceptions", "default": True},
    ],
}
# Requests the kernel answers itself (each by its method of that name with a leading underscore).
ANSWERED = (
    "dumpCell",
    "initialize",
    "attach",
    "configurationDone",
    "setBreakpoints",
    "setExceptionBreakpoints",
    "threads",
    "inspectVariables",
    "disconnect",
)
# Requests about a stopped cell's frames, forwarded to its process.
FORWARDED = (
    "stackTrace",
    "scopes",
    "variables",
    "continue",
    "next",
    "stepIn",
    "stepOut",
    "pause",
    "evaluate",
    "source",
    "exceptionInfo",
    "threads",
)
# Seconds the kernel waits for a debugged cell's response before it answers the frontend with an error.
RESPONSE_TIMEOUT = 10.0
# The largest cell dumpCell writes, in characters.
MAX_CELL = 10 * 1024 * 1024
NOT_STOPPED = "no cell is stopped at a breakpoint now: {command} needs a running cell under the debugger"
NO_DEBUGPY = "the debugger needs debugpy in the kernel's Python environment: pip install debugpy, then restart"
REFUSED = {
    "richInspectVariables": "cellbox shows variables as text only (rich rendering would evaluate a name in the "
    "kernel); see the variables panel",
    "copyToGlobals": "cellbox does not copy a frame's variables into the notebook's globals",
    "modules": "cellbox does not list the cell's modules",
}
# The frames of cellbox's own code (the cell's runner) are not the user's: pydevd's justMyCode leaves them out.
PACKAGE_DIR = str(Path(__file__).resolve().parent.parent)


def debugpy_available() -> bool:
    """Whether debugpy is importable by the cells' Python (the kernel's own interpreter).

    Looked up with :func:`importlib.util.find_spec` on the kernel's own
    ``sys.path``, which holds no folder a cell can write: nothing is imported
    or run.
    """
    try:
        return importlib.util.find_spec("debugpy") is not None
    except (ImportError, ValueError):
        return False


def response(request: dict[str, Any], success: bool = True, body: Any = None, message: str = "") -> dict[str, Any]:
    """The DAP response to ``request``, as ipykernel shapes its own (``type``, ``request_seq``, ``success``,
    ``command``; no ``seq``, as ipykernel's ``debugInfo`` and ``dumpCell`` replies)."""
    reply: dict[str, Any] = {
        "type": "response",
        "request_seq": request.get("seq", 0),
        "success": success,
        "command": request.get("command", ""),
    }
    if body is not None:
        reply["body"] = body
    if message:
        reply["message"] = message
    return reply


def checked(message: Any) -> dict[str, Any] | None:
    """A debugged cell's DAP message if it has the protocol's shape (a response or an event), else ``None``.

    A response has an integer ``request_seq``, a boolean ``success`` and a
    text ``command``; an event a text ``event``; a ``body``, when there is one,
    is an object.  Nothing in it is evaluated.
    """
    if not isinstance(message, dict) or not isinstance(message.get("seq"), int):
        return None
    if "body" in message and not isinstance(message["body"], dict):
        return None
    fields: tuple[tuple[str, type], ...]
    if message.get("type") == "response":
        fields = (("request_seq", int), ("success", bool), ("command", str))
    elif message.get("type") == "event":
        fields = (("event", str),)
    else:
        return None
    if not all(isinstance(message.get(name), kind) for name, kind in fields):
        return None
    return message


class Debugger:
    """The session's debugger state and the answers the kernel gives itself.

    Args:
        folder: where cells are named (the cells' ``TMPDIR/cells``), as the
            kernel sees it.
        available: whether debugpy is there (:func:`debugpy_available`).
        publish: sends one DAP event to the frontend as ``debug_event``
            (called on the kernel's shell event loop).
        inspect: answers ``inspectVariables`` from the latest snapshot, or
            ``None`` when no run beside the state can be made now.
    """

    def __init__(
        self,
        folder: Path,
        available: bool,
        publish: Callable[[dict[str, Any]], None],
        inspect: Callable[[], Any],
    ) -> None:
        self.folder = folder
        self.available = available
        self.publish = publish
        self.inspect = inspect
        self.started = False
        self.breakpoints: dict[str, list[dict[str, Any]]] = {}
        self.exception_filters: list[str] = []
        self.stopped_threads: set[int] = set()
        self.send_to_cell: Callable[[dict[str, Any]], None] | None = None  # the debugged cell's channel, while it runs
        self._waiting: dict[int, concurrent.futures.Future[dict[str, Any]]] = {}

    # ------------------------------------------------------------------ requests

    async def handle(self, request: Any) -> dict[str, Any]:
        """The ``debug_reply`` content for one ``debug_request`` content (always a DAP response)."""
        if not isinstance(request, dict) or request.get("type") != "request":
            return response(
                {},
                False,
                message="a debug_request's content is a DAP request: seq, type 'request', command and arguments",
            )
        command = request.get("command")
        if not isinstance(command, str) or not isinstance(request.get("seq"), int):
            return response(request, False, message="a DAP request needs an integer seq and a text command")
        if not isinstance(request.get("arguments", {}), dict):
            return response(request, False, message=f"{command}: arguments must be an object")
        if command == "debugInfo":
            return self.debug_info(request)
        if not self.available:
            return response(request, False, message=NO_DEBUGPY)
        own = getattr(self, f"_{command}", None) if command in ANSWERED else None
        if own is not None:
            return await own(request) if asyncio.iscoroutinefunction(own) else own(request)
        if command in REFUSED:
            return response(request, False, message=REFUSED[command])
        if command in FORWARDED:
            return await self.forward(request)
        return response(request, False, message=f"cellbox's debugger does not support the request {command!r}")

    def debug_info(self, request: dict[str, Any]) -> dict[str, Any]:
        """``debugInfo``: the fields of ipykernel's reply, from which JupyterLab computes each cell's file name."""
        body = {
            "isStarted": self.started,
            "hashMethod": "Murmur2",
            "hashSeed": HASH_SEED,
            "tmpFilePrefix": str(self.folder) + os.sep,
            "tmpFileSuffix": SUFFIX,
            "breakpoints": [{"source": path, "breakpoints": lines} for path, lines in self.breakpoints.items()],
            "stoppedThreads": sorted(self.stopped_threads),
            "richRendering": False,
            "exceptionPaths": ["Python Exceptions"],
            "copyToGlobals": False,
        }
        return response(request, body=body)

    def _dumpCell(self, request: dict[str, Any]) -> dict[str, Any]:
        code = request.get("arguments", {}).get("code")
        if not isinstance(code, str) or len(code) > MAX_CELL:
            return response(
                request, False, message=f"dumpCell: arguments.code must be text of at most {MAX_CELL} characters"
            )
        path = cell_file_name(code, str(self.folder))
        try:
            write_cell(self.folder, os.path.basename(path), code)
        except OSError as exc:
            return response(request, False, message=f"dumpCell: the cell could not be written ({exc.strerror})")
        return response(request, body={"sourcePath": path})

    def _initialize(self, request: dict[str, Any]) -> dict[str, Any]:
        self.started = True
        return response(request, body=dict(CAPABILITIES))

    def _attach(self, request: dict[str, Any]) -> dict[str, Any]:
        return response(request)

    def _configurationDone(self, request: dict[str, Any]) -> dict[str, Any]:
        return response(request)

    async def _setBreakpoints(self, request: dict[str, Any]) -> dict[str, Any]:
        arguments = request.get("arguments", {})
        source = arguments.get("source")
        path = source.get("path") if isinstance(source, dict) else None
        wanted = arguments.get("breakpoints", [])
        if not isinstance(path, str) or not isinstance(wanted, list):
            return response(request, False, message="setBreakpoints: arguments need source.path and breakpoints")
        kept = [_breakpoint(b) for b in wanted if isinstance(b, dict) and isinstance(b.get("line"), int)]
        if kept:
            self.breakpoints[path] = kept
        else:
            self.breakpoints.pop(path, None)
        if self.send_to_cell is not None:
            return await self.forward(request)  # the running cell's pydevd sets them now, and says where
        verified = [{"verified": True, "line": b["line"], "source": {"path": path}} for b in kept]
        return response(request, body={"breakpoints": verified})

    async def _setExceptionBreakpoints(self, request: dict[str, Any]) -> dict[str, Any]:
        filters = request.get("arguments", {}).get("filters", [])
        known = {f["filter"] for f in CAPABILITIES["exceptionBreakpointFilters"]}
        self.exception_filters = [f for f in filters if f in known] if isinstance(filters, list) else []
        if self.send_to_cell is not None:
            return await self.forward(request)
        return response(request, body={"breakpoints": [{"verified": True} for _ in self.exception_filters]})

    async def _threads(self, request: dict[str, Any]) -> dict[str, Any]:
        if self.send_to_cell is not None:
            return await self.forward(request)
        return response(request, body={"threads": []})

    async def _inspectVariables(self, request: dict[str, Any]) -> dict[str, Any]:
        variables = await asyncio.to_thread(self.inspect)
        if variables is None:
            # With an empty list too: JupyterLab reads body.variables of the reply whatever its success.
            return response(
                request,
                False,
                body={"variables": []},
                message="inspectVariables: the session's state cannot be read now "
                "(a cell is running, or the session is not ready)",
            )
        return response(request, body={"variables": variables})

    def _disconnect(self, request: dict[str, Any]) -> dict[str, Any]:
        self.started = False
        self.breakpoints = {}
        self.exception_filters = []
        return response(request)

    # ------------------------------------------------------------------ a debugged cell

    def cell_config(self) -> dict[str, Any] | None:
        """What a cell's spec carries under ``debug``, or ``None``: the cell then runs without the debugger."""
        if not (self.available and self.started and (self.breakpoints or self.exception_filters)):
            return None
        return {
            "breakpoints": self.breakpoints,
            "exception_filters": self.exception_filters,
            "rules": [{"path": PACKAGE_DIR, "include": False}],
        }

    async def forward(self, request: dict[str, Any]) -> dict[str, Any]:
        """Send ``request`` to the debugged cell's pydevd; its response, or an error when there is none."""
        send = self.send_to_cell
        if send is None:
            return response(request, False, message=NOT_STOPPED.format(command=request["command"]))
        waiting: concurrent.futures.Future[dict[str, Any]] = concurrent.futures.Future()
        self._waiting[request["seq"]] = waiting
        try:
            send(request)
            reply = await asyncio.wait_for(asyncio.wrap_future(waiting), RESPONSE_TIMEOUT)
            if request["command"] == "variables" and isinstance(reply.get("body", {}).get("variables"), list):
                # As ipykernel's Debugger.variables: the shell's own names are not the student's variables.
                listed = reply["body"]["variables"]
                reply["body"]["variables"] = [v for v in listed if isinstance(v, dict) and shown(v.get("name"))]
            return reply
        except TimeoutError:
            return response(request, False, message=f"{request['command']}: the cell did not answer (it ended?)")
        finally:
            self._waiting.pop(request["seq"], None)

    def from_cell(self, message: Any) -> dict[str, Any] | None:
        """A DAP message of the debugged cell (any thread): a response goes to its request, an event is returned.

        Returns the event to publish (in the cell's order), or ``None``.
        """
        message = checked(message)
        if message is None:
            return None
        if message["type"] == "response":
            waiting = self._waiting.get(message["request_seq"])
            if waiting is not None and not waiting.done():
                waiting.set_result(message)
            return None
        body = message.get("body", {})
        thread = body.get("threadId")
        if message["event"] == "stopped" and isinstance(thread, int):
            self.stopped_threads.add(thread)
        elif message["event"] == "continued":
            self.stopped_threads.clear()
        return message

    def cell_ended(self) -> dict[str, Any] | None:
        """The cell under the debugger ended: nothing is stopped any more; the ``continued`` event to send, if any."""
        self.send_to_cell = None
        for waiting in self._waiting.values():
            if not waiting.done():
                waiting.set_result(
                    {
                        "seq": 0,
                        "type": "response",
                        "request_seq": 0,
                        "success": False,
                        "command": "",
                        "message": "the cell ended",
                    }
                )
        if not self.stopped_threads:
            return None
        self.stopped_threads.clear()
        return {"seq": 0, "type": "event", "event": "continued", "body": {"threadId": 1, "allThreadsContinued": True}}


def shown(name: Any) -> bool:
    """Whether the variables panel shows a variable of this name (ipykernel's ``Debugger.accept_variable``)."""
    from .besiderunner import HIDDEN_NAMES

    if not isinstance(name, str):
        return False
    return name not in HIDDEN_NAMES and not re.match(r"_\d|_i", name)


def _breakpoint(wanted: dict[str, Any]) -> dict[str, Any]:
    """A DAP SourceBreakpoint with only the fields pydevd reads, each of its type."""
    kept: dict[str, Any] = {"line": wanted["line"]}
    for name in ("condition", "hitCondition", "logMessage"):
        if isinstance(wanted.get(name), str):
            kept[name] = wanted[name]
    return kept


def write_cell(folder: Path, name: str, code: str) -> None:
    """Write ``code`` as ``folder/name`` (what ``dumpCell`` asks), never following a link a cell put there.

    ``folder``'s parent (the task's ``tmp/``) is opened with ``O_NOFOLLOW``,
    ``folder`` inside it by that descriptor (made when missing), and the file
    is replaced, not written through: unlinked, then created ``O_EXCL |
    O_NOFOLLOW`` (open(2), openat(2)).

    Raises:
        OSError: the folder cannot be made or opened, or the file written.
    """
    from .kernel import _open_folder

    parent = _open_folder(folder.parent)
    try:
        try:
            os.mkdir(folder.name, 0o755, dir_fd=parent)
        except FileExistsError:
            pass
        here = os.open(folder.name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
    finally:
        os.close(parent)
    try:
        try:
            os.unlink(name, dir_fd=here)
        except FileNotFoundError:
            pass
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=here)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(code)
    finally:
        os.close(here)
