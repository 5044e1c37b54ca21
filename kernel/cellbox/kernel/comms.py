"""Kernel side of comms (the Jupyter messaging spec's "Custom Messages"): widgets across the boundary.

A comm is an id, a target name and three messages (``comm_open``,
``comm_msg``, ``comm_close``), as in ipykernel's ``ipykernel/comm/`` and the
``comm`` package.  The comms themselves, and the widgets behind them, live in
the cells' processes (:mod:`cellbox.kernel.cellcomm`); the kernel only checks
the shape of their JSON, forwards it, and keeps its own record of which comms
each kept state holds:

* **Cell to frontend.**  A run's ``{"type": "comm", ...}`` messages are checked
  (:func:`from_cell`: ``comm_id`` and ``target_name`` short strings, ``data``
  and ``metadata`` dicts, at most :data:`MAX_BUFFERS` buffers of
  :data:`MAX_BUFFER_BYTES` in all) and published on IOPub with the run's
  request as parent, buffers as binary frames.  A malformed one is dropped
  with a note.
* **Frontend to kernel.**  ``comm_open``, ``comm_msg`` and ``comm_close`` each
  run as a short run forked from the session's latest snapshot, through the
  cell path (:meth:`CellboxKernel._run_cell` with the message as data in the
  spec), under the cell limits; a run that finished in its own process leaves
  the next snapshot, a stopped one is discarded, as a cell is.  Its outputs
  go out with the comm message as parent, as under ipykernel.  Messages that
  wait while a run is busy are queued; a widget's ``update`` superseded by a
  later one of the same widget and keys is dropped (:class:`CommQueue`).
* **The record.**  ``comm_info_request`` is answered from :class:`CommRecord`
  (nothing runs).  ``%undo`` counts cells, not widget events; the comms of the
  states it (or a lost session) took away are closed on the frontend
  (``comm_close``), and so is a comm a message names that no kept state holds.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextvars
import dataclasses
import logging
from typing import TYPE_CHECKING, Any

from ..sandbox.snapshots import keep_state

if TYPE_CHECKING:
    from .kernel import CellboxKernel, _Cell

__all__ = [
    "Comms",
    "CommQueue",
    "CommRecord",
    "Pending",
    "from_cell",
    "from_frontend",
    "MAX_BUFFERS",
    "MAX_BUFFER_BYTES",
    "MAX_COMMS",
]

log = logging.getLogger("cellbox.comms")

MSG_TYPES = ("comm_open", "comm_msg", "comm_close")
# Characters of a comm id and of a target name (ipywidgets' ids are 32 hex digits).
MAX_NAME = 256
# Binary buffers of one comm message, and their bytes in all (an ipympl frame is a PNG of the figure).
MAX_BUFFERS = 64
MAX_BUFFER_BYTES = 16 * 1024**2
# Comms the kernel records as open at once; a cell that opens more has the rest closed.
MAX_COMMS = 10_000
# Seconds a frontend comm message waits for the session to be ready (a first cell's wait).
SESSION_READY_TIMEOUT = 120.0
# Frontend comm messages waiting for their run at once; more are dropped (a flood, not a user).
MAX_QUEUED = 1_000


def _name(value: Any) -> bool:
    return isinstance(value, str) and 0 < len(value) <= MAX_NAME


def from_cell(message: dict[str, Any]) -> tuple[str, dict[str, Any], dict[str, Any], list[bytes]] | str:
    """A run's comm message as ``(msg_type, content, metadata, buffers)``, or why it is malformed (one line).

    The checks are the messaging spec's ("Custom Messages"): ``comm_id`` a
    string, ``data`` a dict, ``target_name`` a string (``comm_open``),
    ``metadata`` a dict; buffers are base64 text, bounded by
    :data:`MAX_BUFFERS` and :data:`MAX_BUFFER_BYTES`.  Only the spec's keys of
    the content are kept.
    """
    msg_type, content, metadata = message.get("msg_type"), message.get("content"), message.get("metadata", {})
    if msg_type not in MSG_TYPES:
        return f"its msg_type {str(msg_type)[:40]!r} is none of {', '.join(MSG_TYPES)}"
    kept = _content(msg_type, content, metadata, with_module=True)
    if isinstance(kept, str):
        return kept
    buffers = _buffers(message.get("buffers", []))
    if isinstance(buffers, str):
        return buffers
    return msg_type, kept, metadata, buffers


def _content(msg_type: str, content: Any, metadata: Any, with_module: bool) -> dict[str, Any] | str:
    """The spec's keys of a comm message's ``content`` (both ways), or why it is malformed (one line).

    ``with_module``: a cell's ``comm_open`` keeps its ``target_module`` (a string or null) for the frontend.
    """
    if not isinstance(content, dict) or not _name(content.get("comm_id")):
        return f"a {msg_type} needs a comm_id of 1 to {MAX_NAME} characters"
    if not isinstance(content.get("data", {}), dict) or not isinstance(metadata, dict):
        return f"the data and metadata of a {msg_type} must be dicts"
    kept = {"comm_id": content["comm_id"], "data": content.get("data", {})}
    if msg_type == "comm_open":
        if not _name(content.get("target_name")):
            return f"a comm_open needs a target_name of 1 to {MAX_NAME} characters"
        kept["target_name"] = content["target_name"]
        if with_module:
            module = content.get("target_module")
            if module is not None and not _name(module):
                return f"a comm_open's target_module is a string of 1 to {MAX_NAME} characters, or null"
            kept["target_module"] = module
    return kept


def _buffers(value: Any) -> list[bytes] | str:
    if not isinstance(value, list) or len(value) > MAX_BUFFERS:
        return f"buffers are a list of at most {MAX_BUFFERS}"
    try:
        buffers = [base64.b64decode(text, validate=True) for text in value if isinstance(text, str)]
    except (binascii.Error, ValueError):
        return "a buffer is not base64 text"
    if len(buffers) != len(value):
        return "a buffer is not base64 text"
    if sum(map(len, buffers)) > MAX_BUFFER_BYTES:
        return f"its buffers hold more than {MAX_BUFFER_BYTES // 1024**2} MiB"
    return buffers


@dataclasses.dataclass
class Pending:
    """A frontend comm message waiting for its run: its type, checked content, and the request it answers."""

    msg_type: str
    content: dict[str, Any]
    metadata: dict[str, Any]
    buffers: list[bytes]
    parent: dict[str, Any]
    ident: Any
    done: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)

    @property
    def comm_id(self) -> str:
        return str(self.content["comm_id"])

    def update_keys(self) -> set[str] | None:
        """The state keys of a widget ``update`` that may be superseded, or ``None`` (binary, or another method)."""
        data = self.content.get("data", {})
        state = data.get("state")
        if self.msg_type != "comm_msg" or data.get("method") != "update" or not isinstance(state, dict):
            return None
        if self.buffers or data.get("buffer_paths"):
            return None  # binary state: its buffers go by position, kept whole
        return set(state)

    def spec(self) -> dict[str, Any]:
        """The message as the run's spec carries it (JSON: the buffers as base64 text)."""
        return {
            "msg_type": self.msg_type,
            "content": self.content,
            "metadata": self.metadata,
            "header": _json_header(self.parent),
            "buffers": [base64.b64encode(buffer).decode("ascii") for buffer in self.buffers],
        }


def _json_header(parent: dict[str, Any]) -> dict[str, Any]:
    header = parent.get("header") if isinstance(parent, dict) else None
    if not isinstance(header, dict):
        return {}
    return {str(k): v.isoformat() if hasattr(v, "isoformat") else v for k, v in header.items()}


def from_frontend(parent: dict[str, Any], ident: Any) -> Pending | str:
    """The frontend's comm request as a :class:`Pending`, or why it is malformed (one line).

    The same checks as :func:`from_cell`; buffers arrive as binary frames.
    """
    header = parent.get("header") if isinstance(parent, dict) else None
    msg_type = header.get("msg_type") if isinstance(header, dict) else None
    content, metadata = parent.get("content"), parent.get("metadata") or {}
    if msg_type not in MSG_TYPES:
        return f"a {msg_type} needs a comm_id of 1 to {MAX_NAME} characters"
    kept = _content(msg_type, content, metadata, with_module=False)
    if isinstance(kept, str):
        return kept
    raw = parent.get("buffers") or []
    if not isinstance(raw, list) or len(raw) > MAX_BUFFERS:
        return f"buffers are a list of at most {MAX_BUFFERS}"
    buffers = [bytes(buffer) for buffer in raw]
    if sum(map(len, buffers)) > MAX_BUFFER_BYTES:
        return f"its buffers hold more than {MAX_BUFFER_BYTES // 1024**2} MiB"
    return Pending(msg_type, kept, dict(metadata), buffers, parent, ident)


class CommQueue:
    """Frontend comm messages waiting for their run, in order; superseded widget updates are dropped.

    A widget's ``update`` (``{"method": "update", "state": {...}}``) waiting
    behind a later update of the same comm loses the keys the later one sets;
    one left with no keys is dropped.  Every other message keeps its place.
    """

    def __init__(self) -> None:
        self.items: list[Pending] = []

    def __len__(self) -> int:
        return len(self.items)

    def add(self, item: Pending) -> None:
        keys = item.update_keys()
        if keys:
            for earlier in list(self.items):
                before = earlier.update_keys()
                if earlier.comm_id != item.comm_id or not before:
                    continue
                state = earlier.content["data"]["state"]
                for key in keys & before:
                    del state[key]
                if not state:
                    self.items.remove(earlier)
                    earlier.done.set()
        self.items.append(item)

    def take(self) -> Pending | None:
        """The next message to run, or ``None``."""
        return self.items.pop(0) if self.items else None


@dataclasses.dataclass
class _State:
    """One kept state of the session: what made it (a ``cell`` or a ``comm`` run) and the comms it holds."""

    kind: str
    comms: dict[str, str]


class CommRecord:
    """The comms (id to target name) that each kept state of the session holds, as the kernel saw them.

    It follows the keeper's chain (:class:`cellbox.sandbox.snapshots.Chain`)
    by the same rule (:func:`cellbox.sandbox.snapshots.keep_state`): the
    newest state is the session's; before any, the base, which holds none.
    """

    def __init__(self, undo_depth: int) -> None:
        self.undo_depth = undo_depth
        self.states: list[_State] = []
        self.evicted = False
        self.short_of_memory = False  # a state was let go to leave the session room in its memory bound
        self.running: dict[str, str] = {}  # opened by the run now going, until it is settled

    def current(self) -> dict[str, str]:
        """The comms of the session's state."""
        return self.states[-1].comms if self.states else {}

    def open_now(self) -> dict[str, str]:
        """The comms of the session's state and those the running run opened."""
        return {**self.current(), **self.running}

    def closed(self, comm_id: str) -> None:
        """A comm closed (by its cell or by the frontend): gone from every state, as the frontend forgot it."""
        self.running.pop(comm_id, None)
        for state in self.states:
            state.comms.pop(comm_id, None)

    def settled(self, kind: str, kept: bool) -> dict[str, str]:
        """The running run settled; the comms it opened that are gone with it (none when ``kept``)."""
        opened, self.running = self.running, {}
        if not kept:
            return opened
        _replaced, evicted = keep_state(self.states, _State(kind, {**self.current(), **opened}), self.undo_depth)
        self.evicted = self.evicted or bool(evicted)
        return {}

    def let_go(self, count: int) -> None:
        """The keeper let the ``count`` oldest states go, the session being short of memory (its ``let_go``).

        No comm goes with them: a comm a state holds is in every later one
        until it is closed, and a closed comm is gone from all (:meth:`closed`).
        """
        if count > 0:
            del self.states[: min(count, max(0, len(self.states) - 1))]
            self.evicted = self.short_of_memory = True

    def to_undo(self, cells: int) -> tuple[int, int]:
        """``(snapshots, cells)``: the newest states to drop to undo ``cells`` cells (and the widget events after
        them), as many whole cells as are kept; ``(0, 0)`` when no cell's state is."""
        floor = 1 if self.evicted else 0
        best, popped, found = (0, 0), 0, 0
        for state in reversed(self.states[floor:]):
            popped += 1
            if state.kind == "cell":
                found += 1
                best = (popped, found)
                if found == cells:
                    break
        return best

    def undone(self, count: int) -> dict[str, str]:
        """The keeper dropped the ``count`` newest states; the comms gone with them."""
        before = self.current()
        del self.states[len(self.states) - count :]
        after = self.current()
        return {comm_id: name for comm_id, name in before.items() if comm_id not in after}

    def lost(self) -> dict[str, str]:
        """The session's state was lost (a new session): every comm is gone."""
        gone = self.open_now()
        self.states, self.running, self.evicted, self.short_of_memory = [], {}, False, False
        return gone


class Comms:
    """A kernel's comms: publishes the cells', runs the frontend's, answers ``comm_info_request``.

    Called on the kernel's event loop only.
    """

    def __init__(self, kernel: CellboxKernel) -> None:
        self.kernel = kernel
        self.record = CommRecord(kernel.undo_depth)
        self.queue = CommQueue()
        self.notes: list[str] = []  # said at the next cell: what a widget's run could not keep
        self.last_kept = False  # whether the last run's state was kept
        self._drainer: asyncio.Task[None] | None = None

    # ------------------------------------------------------------------ cell to frontend

    def from_cell(self, cell: _Cell, message: dict[str, Any]) -> None:
        """Check and publish one comm message of the running cell (or comm run), with its request as parent."""
        checked = from_cell(message)
        if isinstance(checked, str):
            self.kernel._note(f"cellbox: a comm message from the cell was dropped: {checked}")
            return
        msg_type, content, metadata, buffers = checked
        comm_id = content["comm_id"]
        if msg_type == "comm_open":
            if len(self.record.open_now()) >= MAX_COMMS:
                self.kernel._note(f"cellbox: a comm was not opened: at most {MAX_COMMS} may be open at once")
                return
            self.record.running[comm_id] = content["target_name"]
        elif msg_type == "comm_close":
            self.record.closed(comm_id)
        self.publish(msg_type, content, metadata, buffers, cell.parent)

    def publish(
        self,
        msg_type: str,
        content: dict[str, Any],
        metadata: dict[str, Any],
        buffers: list[bytes],
        parent: Any,
    ) -> None:
        """One comm message on IOPub, as ipykernel's ``BaseComm.publish_msg`` sends it (its topic, its buffers)."""
        session = self.kernel.session
        if session is None:
            return
        topic = f"comm-{content['comm_id']}".encode()
        frames: list[Any] = list(buffers)
        session.send(
            self.kernel.iopub_socket, msg_type, content, parent, metadata=metadata, ident=topic, buffers=frames
        )

    def close_on_frontend(self, comms: dict[str, str], parent: Any) -> None:
        """Tell the frontend that ``comms`` are gone (their widgets then show nothing live)."""
        for comm_id in comms:
            self.publish("comm_close", {"comm_id": comm_id, "data": {}}, {}, [], parent)

    def settled(self, kind: str, kept: bool, parent: Any) -> None:
        """The run now ending was kept or not: record its comms, or close those it opened."""
        self.last_kept = kept
        self.close_on_frontend(self.record.settled(kind, kept), parent)

    def lost(self, parent: Any) -> None:
        """The session's state was lost: close every comm."""
        self.close_on_frontend(self.record.lost(), parent)

    def undone(self, count: int, parent: Any) -> int:
        """The keeper dropped ``count`` states; close their comms; how many of them were cells'."""
        cells = sum(1 for state in self.record.states[len(self.record.states) - count :] if state.kind == "cell")
        self.close_on_frontend(self.record.undone(count), parent)
        return cells

    # ------------------------------------------------------------------ frontend to kernel

    async def request(self, stream: Any, ident: Any, parent: dict[str, Any]) -> None:
        """A frontend's ``comm_open``, ``comm_msg`` or ``comm_close`` (a shell handler): queue it, run the queue.

        Dispatched on its own (the kernel was idle), it returns when its run (or the run of the update that
        superseded it) ended, so its idle status comes after the run's outputs, as under ipykernel; dispatched
        beside a running cell, it returns at once and runs after that cell.
        """
        item = from_frontend(parent, ident)
        if isinstance(item, str):
            log.warning("cellbox: a comm message from the frontend was dropped: %s", item)
            return
        known = self.record.open_now()
        if item.msg_type == "comm_close":
            if item.comm_id not in known:
                return
            self.record.closed(item.comm_id)
        elif item.msg_type == "comm_msg" and item.comm_id not in known:
            # A widget of a state that %undo, a stopped run or a new session took away: the frontend forgets it.
            self.close_on_frontend({item.comm_id: ""}, parent)
            return
        if len(self.queue) >= MAX_QUEUED:
            log.warning("cellbox: a comm message from the frontend was dropped: %d are waiting", MAX_QUEUED)
            return
        self.queue.add(item)
        if self.kernel._dispatched != item.parent.get("header", {}).get("msg_id"):
            # Dispatched beside a running request (ipykernel does so for comms, in a copy of its context,
            # and puts that request's parent back when this returns): it must return now, and the run waits.
            self._drain_later()
            return
        await self._drain()
        await item.done.wait()

    def _drain_later(self) -> None:
        """Run the queue in a task of its own (its own context: the parents it sets are its own)."""
        if self._drainer is None or self._drainer.done():
            self._drainer = asyncio.get_running_loop().create_task(self._drain(), context=contextvars.Context())

    async def _drain(self) -> None:
        """Run the queued messages one at a time, each in its turn of the session (cells take turns too)."""
        kernel = self.kernel
        async with kernel._turn:
            while (item := self.queue.take()) is not None:
                try:
                    await self._run(item)
                except Exception:  # noqa: BLE001 - one message's failure must not stop the kernel or the queue
                    log.exception("cellbox: a comm message's run failed")
                finally:
                    item.done.set()

    async def _run(self, item: Pending) -> None:
        """One message's run, through the cell path, with the message as its parent."""
        kernel = self.kernel
        server = kernel._forkserver
        if server is not None and kernel.carry_state:
            # A session that ended (or saw a package installed) is replaced now, at once; waited for only while it
            # is not ready, as before a cell (a frontend opens its comms as it connects, perhaps before the
            # session is ready), so a widget event pays no thread hop.  A replaced one holds none of the widgets:
            # they close now, and the next cell says why.
            server.start()
            if server.pid is None and server.broken is None:
                await asyncio.to_thread(server.wait_ready, SESSION_READY_TIMEOUT)
            self._session_replaced()
        if item.msg_type == "comm_msg" and item.comm_id not in self.record.current():
            self.close_on_frontend({item.comm_id: ""}, item.parent)  # its cell was not kept, or its session is gone
            return
        if server is None or not kernel.carry_state:
            # No state to run it in (carry_state off, or no session): the widget cannot answer.
            if item.msg_type != "comm_close":
                self.close_on_frontend({item.comm_id: ""}, item.parent)
            return
        if item.msg_type == "comm_open":
            self.record.running[item.comm_id] = str(item.content["target_name"])
        ident, parent = kernel._get_shell_context_var(kernel._shell_parent_ident), kernel.get_parent("shell")
        kernel.set_parent(item.ident, item.parent, "shell")
        try:
            reply = await kernel._run_cell(
                "", kernel.session_limits, True, False, {}, False, comm=item.spec(), kind="comm"
            )
        finally:
            kernel.set_parent(ident, parent, "shell")
        if self._session_replaced():
            return  # found gone at this run's start (it did not answer): its widgets closed, the next cell says why
        if not self.last_kept:
            self.notes.append(
                f"cellbox: a widget's callback ({item.msg_type}) was stopped, so what it changed is not kept: "
                f"{reply.get('ename')}: {reply.get('evalue')}"
            )

    def _session_replaced(self) -> bool:
        """Close every comm when the session was replaced since the last run, and say why at the next cell."""
        note = self.kernel._session_replaced()
        if note:
            self.notes.append(note)
        return note is not None

    def info(self, target_name: str | None) -> dict[str, Any]:
        """The ``comm_info_reply`` content, from the record (messaging spec, "Comm info")."""
        comms = {
            comm_id: {"target_name": name}
            for comm_id, name in self.record.open_now().items()
            if target_name is None or name == target_name
        }
        return {"status": "ok", "comms": comms}
