"""Child side of a run beside the session's state: one frontend request, answered from the live namespace.

The kernel starts ``python -m cellbox.kernel.besiderunner SPEC.json`` through
:func:`cellbox.kernel.beside.run_beside`, forked from the session's latest
snapshot (:mod:`cellbox.sandbox.session`, ``beside=``): this process holds
every name the cells left, in the session's IPython shell, and is discarded
when it ends (no snapshot of it is kept).  It answers the spec's ``op`` as
ipykernel answers the request of that name, with IPython's own machinery, and
sends the reply's content as one message on the channel (fd 3)::

    {"type": "reply", "content": {...}}

The kernel checks the content's shape and forwards it; nothing here is
trusted.  Whatever the request makes the cell's objects do (a property, a
``__dir__``) happens in this process only, under the cell limits.

Ops: ``complete`` (``code``, ``cursor_pos``) and ``inspect`` (``code``,
``cursor_pos``, ``detail_level``, ``omit_sections``).  A new op is a function
in :data:`OPS`.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from typing import Any

if __name__ == "__main__":
    from cellbox.kernel.besiderunner import main as _main

    sys.exit(_main())

__all__ = ["main", "complete", "inspect", "warm_up", "OPS"]


def complete(shell: Any, request: dict[str, Any]) -> dict[str, Any]:
    """The ``complete_reply`` content, as ipykernel's (``IPythonKernel._experimental_do_complete``).

    IPython's completer on the live namespace, without jedi: jedi's analysis
    starts cold in every forked run (seconds), where IPython's own matchers
    take milliseconds and see what the cells left (``dir()`` of the objects);
    a module the code imports is imported for it (IPython's
    ``allow_auto_import`` policy), as jedi would read it.  An attribute's
    completions start after its dot, as jedi's do (IPython's own matchers
    start at the dot).
    """
    from IPython.core.completer import provisionalcompleter, rectify_completions

    code, cursor_pos = str(request["code"]), int(request["cursor_pos"])
    with provisionalcompleter():
        completions = _after_the_dot(
            code, list(rectify_completions(code, shell.Completer.completions(code, cursor_pos)))
        )
    types = [
        {"start": c.start, "end": c.end, "text": c.text, "type": c.type, "signature": c.signature} for c in completions
    ]
    start, end = (completions[0].start, completions[0].end) if completions else (cursor_pos, cursor_pos)
    return {
        "status": "ok",
        "matches": [c.text for c in completions],
        "cursor_start": start,
        "cursor_end": end,
        "metadata": {"_jupyter_types_experimental": types},
    }


def _after_the_dot(code: str, completions: list[Any]) -> list[Any]:
    """``completions`` that all replace ``.name`` as replacing ``name`` (``math.sq`` gives ``sqrt``, not ``.sqrt``)."""
    from IPython.core.completer import Completion

    if not completions or not all(c.text.startswith(".") and code[c.start : c.start + 1] == "." for c in completions):
        return completions
    return [Completion(c.start + 1, c.end, c.text[1:], type=c.type, signature=c.signature) for c in completions]


def inspect(shell: Any, request: dict[str, Any]) -> dict[str, Any]:
    """The ``inspect_reply`` content, as ipykernel's (``IPythonKernel.do_inspect``): IPython's inspector."""
    from IPython.utils.tokenutil import token_at_cursor

    name = token_at_cursor(str(request["code"]), int(request["cursor_pos"]))
    reply: dict[str, Any] = {"status": "ok", "data": {}, "metadata": {}, "found": False}
    try:
        bundle = shell.object_inspect_mime(
            name, detail_level=int(request.get("detail_level", 0)), omit_sections=list(request.get("omit_sections", []))
        )
    except KeyError:
        return reply
    if not shell.enable_html_pager:
        bundle.pop("text/html", None)
    reply.update(data=bundle, found=True)
    return reply


# Names of the namespace the debugger's variables panel does not show (ipykernel's Debugger.accept_variable).
HIDDEN_NAMES = frozenset(
    "__name__ __doc__ __package__ __loader__ __spec__ __annotations__ __builtins__ __builtin__ __display__ "
    "get_ipython debugpy exit quit In Out _oh _dh _ __ ___".split()
)
# The most variables listed, and characters of one value's repr.
MAX_VARIABLES = 1000
MAX_VALUE_CHARS = 1000


def variables(shell: Any, request: dict[str, Any]) -> dict[str, Any]:
    """The namespace's variables as DAP Variables (``name``, ``value``, ``type``, ``variablesReference`` 0).

    What the debugger's ``inspectVariables`` shows between cells, as
    ipykernel's (its hidden names left out); a value is its ``repr``, cut to
    :data:`MAX_VALUE_CHARS` characters (a ``repr`` that raises says so).
    """
    import re

    hidden = set(shell.user_ns_hidden)
    listed = []
    for name, value in list(shell.user_ns.items()):
        if name in HIDDEN_NAMES or name in hidden or re.match(r"_\d|_i", name) or not isinstance(name, str):
            continue
        try:
            text = repr(value)
        except Exception as exc:  # noqa: BLE001 - the cell's own __repr__
            text = f"<repr raised {type(exc).__name__}>"
        listed.append(
            {"name": name, "value": text[:MAX_VALUE_CHARS], "type": type(value).__name__, "variablesReference": 0}
        )
        if len(listed) >= MAX_VARIABLES:
            break
    return {"variables": listed}


OPS: dict[str, Callable[[Any, dict[str, Any]], dict[str, Any]]] = {
    "complete": complete,
    "inspect": inspect,
    "variables": variables,
}


def warm_up(shell: Any) -> None:
    """One throwaway completion and inspection, in the session's base snapshot (by the cell runner's warm start).

    Their first call imports and sets up what every later one uses (about
    0.25 s); done once there, every run forked since inherits it.  Jedi is
    turned off here, for the same reason (see :func:`complete`).
    """
    shell.Completer.use_jedi = False
    shell.Completer.policy_overrides = {"allow_auto_import": True}
    complete(shell, {"code": "import os\nos.pa", "cursor_pos": len("import os\nos.pa")})
    inspect(shell, {"code": "len", "cursor_pos": 3})


def main(argv: list[str] | None = None) -> int:
    """``python -m cellbox.kernel.besiderunner SPEC.json``: answer the spec's request; the exit status.

    Spawned instead of forked (no session), there is no state to answer from:
    it says nothing and leaves.
    """
    from . import cellrunner

    args = sys.argv[1:] if argv is None else argv
    with open(args[0], encoding="utf-8") as f:
        request = json.load(f)
    shell = cellrunner._shell
    op = OPS.get(str(request.get("op")))
    if shell is None or op is None:
        return 1
    channel = cellrunner.Channel(os.environ.get("CELLBOX_CHANNEL"))
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, cellrunner.ChannelStream):
            stream.channel = None  # what the request prints goes to the pipes, counted and dropped
    content = op(shell, request)
    channel.send({"type": "reply", "content": content})
    return 0
