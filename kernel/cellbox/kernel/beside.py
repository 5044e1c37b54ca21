"""Runs beside the session's state: frontend requests answered in a short run forked from the latest snapshot.

The kernel process holds no cell's values, and must never run what a cell
left (a property, a ``__dir__``): completion and inspection are each one run
forked from the latest kept snapshot inside the session, as a cell is, under
the cell limits (its wall-clock and CPU time at most :data:`BESIDE_TIME`),
and discarded when it ends.  The run answers with IPython's completer and
inspector on the live namespace (:mod:`cellbox.kernel.besiderunner`); this
side only checks the shape of the JSON it sends back (the Jupyter messaging
spec's ``complete_reply`` and ``inspect_reply``), bounds its sizes, and
forwards it.  Anything else (no session yet, a cell running, a run stopped at
a limit, a reply of the wrong shape) gives the empty reply.

:func:`run_beside` is the one path, for any request that a run from the
state answers and discards (the debugger's variables may take it too); comm
messages keep their run's state, so they take the cell path (:mod:`.comms`).
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

from ..sandbox.environment import TaskDirectory
from ..sandbox.isolation import Isolation
from ..sandbox.limits import Limits
from ..sandbox.outcome import Status
from ..sandbox.runs import SandboxError, start
from ..sandbox.session import ForkServer

__all__ = [
    "Beside",
    "run_beside",
    "complete_reply",
    "inspect_reply",
    "empty_complete_reply",
    "variables_reply",
    "BESIDE_RUNNER",
    "BESIDE_TIME",
]

# The module each run beside the state runs (its child side).
BESIDE_RUNNER = "cellbox.kernel.besiderunner"
# Seconds of wall-clock and CPU time a run beside the state may take at most (a frontend gives up on a
# completion after about 1 s; JupyterLab's providerTimeout).
BESIDE_TIME = 3.0
# Bytes of output a run beside the state may print (it is dropped): more is a flood, stopped.
BESIDE_OUTPUT = 64 * 1024
# Bounds on what is forwarded: completions, characters of one, and characters of an inspection's data.
MAX_MATCHES = 10_000
MAX_MATCH_CHARS = 1_000
MAX_INSPECT_CHARS = 1024**2
# Bounds on the debugger's variables between cells (the run's own bounds, checked again here).
MAX_VARIABLES = 1000
MAX_VALUE_CHARS = 1000
TYPE_KEYS = {"start": int, "end": int, "text": str, "type": str, "signature": str}


@dataclasses.dataclass(frozen=True)
class Beside:
    """Where runs beside the state go: the kernel's session and what its cells run with.

    Attributes:
        server: the session (:class:`~cellbox.sandbox.session.ForkServer`, started with ``beside=(BESIDE_RUNNER,)``).
        task: the session's task directory (the request's spec is written to its ``tmp/``).
        cwd: the cells' working directory (the notebook folder).
        isolation: the cells' isolation.
        limits: the cells' limits; the run gets them with times capped at :data:`BESIDE_TIME` seconds
            and output at :data:`BESIDE_OUTPUT` bytes.
    """

    server: ForkServer
    task: TaskDirectory
    cwd: str
    isolation: Isolation
    limits: Limits


def beside_limits(limits: Limits) -> Limits:
    """The cell ``limits`` with wall-clock and CPU time at most :data:`BESIDE_TIME`, output at :data:`BESIDE_OUTPUT`."""
    return dataclasses.replace(
        limits,
        wall_time=min(limits.wall_time, BESIDE_TIME),
        cpu_time=min(limits.cpu_time, BESIDE_TIME),
        output=min(limits.output, BESIDE_OUTPUT),
    )


def run_beside(place: Beside, request: dict[str, Any]) -> dict[str, Any] | None:
    """Answer ``request`` in a run forked from the session's latest snapshot; the reply's content, or ``None``.

    Blocks until the run ends (call it from a worker thread).  ``request`` is
    JSON (its ``op`` names the answer, see :data:`cellbox.kernel.besiderunner.OPS`).
    ``None`` when the session is not ready, the run could not be forked
    (a spawned process has no state: it is killed at once), or it did not end
    ``ok`` (a limit, an error): the caller then gives its empty reply.  The
    content is the run's, unchecked: see :func:`complete_reply` and
    :func:`inspect_reply`.
    """
    from .kernel import _SpecFile

    if place.server.pid is None:
        return None
    messages: list[Any] = []

    def first_only(message: Any) -> None:
        if not messages:  # the run sends one reply: more is not kept (the kernel's memory stays bounded)
            messages.append(message)

    try:
        spec = _SpecFile(place.task.tmp, request)
    except OSError:
        return None
    try:
        run = start(
            [sys.executable, "-m", BESIDE_RUNNER, str(spec.path)],
            limits=beside_limits(place.limits),
            task=place.task,
            cwd=place.cwd,
            channel=True,
            on_message=first_only,
            isolation=place.isolation,
            forkserver=place.server,
        )
        if run.start_method != "forkserver":
            run.kill()
            run.wait()
            return None
        outcome = run.wait()
    except (SandboxError, OSError):
        return None
    finally:
        spec.remove()
    reply = messages[0] if messages else None
    if outcome.status is not Status.OK or not isinstance(reply, dict) or reply.get("type") != "reply":
        return None
    content = reply.get("content")
    return dict(content) if isinstance(content, dict) else None


def empty_complete_reply(cursor_pos: int) -> dict[str, Any]:
    """The ``complete_reply`` content with no completions at ``cursor_pos``."""
    return {"status": "ok", "matches": [], "cursor_start": cursor_pos, "cursor_end": cursor_pos, "metadata": {}}


def complete_reply(content: dict[str, Any] | None, code: str, cursor_pos: int) -> dict[str, Any]:
    """``content`` as a ``complete_reply`` (messaging spec, "Completion"), or the empty reply when it is not one.

    ``matches`` is a list of at most :data:`MAX_MATCHES` strings of at most
    :data:`MAX_MATCH_CHARS` characters; ``cursor_start <= cursor_end`` are
    positions in ``code``; ``metadata`` keeps only
    ``_jupyter_types_experimental``, empty or one entry per match with exactly
    the keys and types of :data:`TYPE_KEYS`.
    """
    empty = empty_complete_reply(cursor_pos)
    if not isinstance(content, dict):
        return empty
    matches, start, end = content.get("matches"), content.get("cursor_start"), content.get("cursor_end")
    if not isinstance(matches, list) or len(matches) > MAX_MATCHES:
        return empty
    if not all(isinstance(m, str) and len(m) <= MAX_MATCH_CHARS for m in matches):
        return empty
    if not (isinstance(start, int) and isinstance(end, int)) or not 0 <= start <= end <= len(code):
        return empty
    if isinstance(start, bool) or isinstance(end, bool):
        return empty
    types = (content.get("metadata") or {}).get("_jupyter_types_experimental", [])
    if not isinstance(types, list) or (types and len(types) != len(matches)) or not all(map(_is_type_entry, types)):
        return empty
    metadata = {"_jupyter_types_experimental": [{key: t[key] for key in TYPE_KEYS} for t in types]} if types else {}
    return {"status": "ok", "matches": list(matches), "cursor_start": start, "cursor_end": end, "metadata": metadata}


def inspect_reply(content: dict[str, Any] | None) -> dict[str, Any]:
    """``content`` as an ``inspect_reply`` (messaging spec, "Introspection"), or "not found" when it is not one.

    ``data`` is a mime bundle of strings (keys ``type/subtype``) of at most
    :data:`MAX_INSPECT_CHARS` characters in all; ``found`` a bool; metadata
    is dropped (IPython's inspector gives none).
    """
    empty: dict[str, Any] = {"status": "ok", "found": False, "data": {}, "metadata": {}}
    if not isinstance(content, dict) or not isinstance(content.get("found"), bool):
        return empty
    data = content.get("data")
    if not isinstance(data, dict):
        return empty
    if not all(isinstance(k, str) and "/" in k and isinstance(v, str) for k, v in data.items()):
        return empty
    if sum(len(k) + len(v) for k, v in data.items()) > MAX_INSPECT_CHARS:
        return empty
    return {"status": "ok", "found": content["found"] and bool(data), "data": dict(data), "metadata": {}}


def variables_reply(content: dict[str, Any] | None) -> list[dict[str, Any]] | None:
    """The DAP Variables of a ``variables`` run (``inspectVariables``), or ``None`` when ``content`` is not that.

    Each is exactly ``name``, ``value``, ``type`` (text) and
    ``variablesReference`` 0 (nothing to expand: the run is gone), at most
    :data:`MAX_VARIABLES` of them and :data:`MAX_VALUE_CHARS` characters a text.
    """
    listed = content.get("variables") if isinstance(content, dict) else None
    if not isinstance(listed, list) or len(listed) > MAX_VARIABLES:
        return None
    kept = []
    for variable in listed:
        if not isinstance(variable, dict) or set(variable) != {"name", "value", "type", "variablesReference"}:
            return None
        texts = [variable[key] for key in ("name", "value", "type")]
        if not all(isinstance(t, str) and len(t) <= MAX_VALUE_CHARS for t in texts):
            return None
        if variable["variablesReference"] != 0 or isinstance(variable["variablesReference"], bool):
            return None
        kept.append({**variable, "variablesReference": 0})
    return kept


def _is_type_entry(entry: Any) -> bool:
    return (
        isinstance(entry, dict)
        and set(entry) == set(TYPE_KEYS)
        and all(isinstance(entry[key], kind) and not isinstance(entry[key], bool) for key, kind in TYPE_KEYS.items())
        and len(entry["text"]) <= MAX_MATCH_CHARS
        and len(entry["signature"]) <= MAX_MATCH_CHARS
    )
