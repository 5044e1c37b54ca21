"""Completion, inspection and ``is_complete`` for the kernel process, without running any cell.

The kernel process has no live namespace (the cells' values live only in
their children), so completion reads source: the cells that ran successfully,
turned into plain Python by IPython's text transforms (magics become calls),
followed by the cell being edited.  jedi analyses that text statically; nothing
a cell produced is executed or unpickled here (design rule 6).
"""

from __future__ import annotations

import functools
import threading
from typing import Any

__all__ = ["is_complete", "complete", "inspect", "magic_names", "warm_up"]

# jedi's caches are not made for two analyses at once: the warm-up and a
# request take turns.
_JEDI_LOCK = threading.Lock()


def is_complete(code: str) -> dict[str, Any]:
    """The ``is_complete_reply`` content for ``code``, by IPython's rules (as ipykernel answers).

    ``status`` is ``complete``, ``incomplete`` (with ``indent``, the spaces for
    the next line) or ``invalid``.
    """
    from IPython.core.inputtransformer2 import TransformerManager

    status, indent = TransformerManager().check_complete(code)
    reply: dict[str, Any] = {"status": status}
    if status == "incomplete":
        reply["indent"] = " " * (indent or 0)
    return reply


@functools.lru_cache(maxsize=1)
def magic_names() -> tuple[str, ...]:
    """Names of IPython's built-in magics and cellbox's own, with their ``%``/``%%`` prefix."""
    from IPython.core import magics

    names = {"%limits", "%%limits"}
    for attr in dir(magics):
        cls = getattr(magics, attr)
        table = getattr(cls, "magics", None)
        if isinstance(cls, type) and isinstance(table, dict):
            names.update("%" + name for name in table.get("line", {}))
            names.update("%%" + name for name in table.get("cell", {}))
    return tuple(sorted(names))


def _context(history: list[str]) -> str:
    from IPython.core.inputtransformer2 import TransformerManager

    manager = TransformerManager()
    parts = []
    for source in history:
        try:
            parts.append(manager.transform_cell(source))
        except Exception:  # noqa: BLE001 - a cell IPython cannot transform adds nothing to complete from
            continue
    return "".join(part if part.endswith("\n") else part + "\n" for part in parts)


def _script(history: list[str], code: str, cursor_pos: int, notebook_dir: str) -> tuple[Any, int, int]:
    """A jedi Script over the earlier cells and ``code``, and the cursor's (line, column) in it."""
    import jedi

    context = _context(history)
    before = code[:cursor_pos]
    line = context.count("\n") + before.count("\n") + 1
    column = len(before) - (before.rfind("\n") + 1)
    # smart_sys_path=False: nothing a cell wrote next to the notebook is imported for analysis.
    project = jedi.Project(notebook_dir, smart_sys_path=False)
    return jedi.Script(context + code, project=project), line, column


def _magic_matches(code: str, cursor_pos: int) -> tuple[list[str], int] | None:
    before = code[:cursor_pos]
    token = before[before.rfind("\n") + 1 :].lstrip()
    if not token.startswith("%") or " " in token:
        return None
    return [name for name in magic_names() if name.startswith(token)], cursor_pos - len(token)


def complete(history: list[str], code: str, cursor_pos: int, notebook_dir: str) -> dict[str, Any]:
    """The ``complete_reply`` content: jedi's completions at ``cursor_pos`` (code points)."""
    magics = _magic_matches(code, cursor_pos)
    if magics is not None:
        matches, start = magics
        return _reply(matches, start, cursor_pos, [])
    # Two tries: jedi's helper process dies when an interrupt signals the
    # kernel's process group, and jedi starts a new one on the next call.
    for _attempt in range(2):
        try:
            # Everything that touches jedi's objects stays under the lock: their
            # attributes are computed lazily, through jedi's one helper process.
            with _JEDI_LOCK:
                script, line, column = _script(history, code, cursor_pos, notebook_dir)
                completions = script.complete(line, column)
                if not completions:
                    return _reply([], cursor_pos, cursor_pos, [])
                typed = len(completions[0].name_with_symbols) - len(completions[0].complete)
                start = cursor_pos - typed
                found = [(c.name_with_symbols, c.type) for c in completions]
            break
        except Exception:  # noqa: BLE001 - jedi gives up on some code; no completions then
            continue
    else:
        return _reply([], cursor_pos, cursor_pos, [])
    matches = [name for name, _type in found]
    types = [{"start": start, "end": cursor_pos, "text": name, "type": kind} for name, kind in found]
    return _reply(matches, start, cursor_pos, types)


def _reply(matches: list[str], start: int, end: int, types: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "status": "ok",
        "matches": matches,
        "cursor_start": start,
        "cursor_end": end,
        "metadata": {"_jupyter_types_experimental": types} if types else {},
    }


def inspect(history: list[str], code: str, cursor_pos: int, notebook_dir: str, detail_level: int = 0) -> dict[str, Any]:
    """The ``inspect_reply`` content: signature and docstring of the name at (or called at) the cursor."""
    text = ""
    try:
        with _JEDI_LOCK:
            script, line, column = _script(history, code, cursor_pos, notebook_dir)
            names = script.infer(line, column) or script.help(line, column)
            if not names:
                names = [sig for sig in script.get_signatures(line, column)]
            if names:
                name = names[0]
                doc = name.docstring()
                header = f"{name.type}: {name.full_name or name.name}"
                text = f"{header}\n\n{doc}" if doc else header
    except Exception:  # noqa: BLE001 - jedi gives up on some code; nothing found then
        text = ""
    return {
        "status": "ok",
        "found": bool(text),
        "data": {"text/plain": text} if text else {},
        "metadata": {},
    }


def warm_up(notebook_dir: str) -> list[str]:
    """Do one throwaway completion, so the user's first Tab is answered quickly.

    The first jedi analysis of a session imports jedi and parses the standard
    library's stubs (seconds on a busy machine), and JupyterLab drops a
    completion reply that takes longer than its 1 s ``providerTimeout``.  The
    kernel runs this in a background thread when it starts.  Returns the
    matches, for tests.
    """
    magic_names()
    reply = complete([], "import os\nos.pa", len("import os\nos.pa"), notebook_dir)
    return list(reply["matches"])
