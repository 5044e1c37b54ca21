"""``is_complete`` for the kernel process: IPython's rules over the code the frontend sent, nothing run.

Completion and inspection need the cells' values, which live only in the
session: they are runs beside the state (:mod:`cellbox.kernel.beside`).
"""

from __future__ import annotations

from typing import Any

__all__ = ["is_complete"]


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
