"""Child side of comms (the Jupyter messaging spec's "Custom Messages"): widgets in a cell's process.

Imported only in a cell's process (by :mod:`cellbox.kernel.cellrunner`), never by
the kernel.  It installs the ``comm`` package's machinery as ipykernel does
(``ipykernel/ipkernel.py`` replaces ``comm.create_comm``): ipywidgets, tqdm's
notebook bar and ipympl make their comms with ``comm.create_comm``, and
register their targets with ``comm.get_comm_manager()``, the ``comm``
package's own :class:`~comm.base_comm.CommManager` (a dict of ids).  The
manager and its comms live in the session's snapshots like any other object,
so a widget a cell made is there in every later run forked from its state.

Cell to frontend: :class:`CellComm` sends each ``comm_open``, ``comm_msg`` and
``comm_close`` as one JSON line on the run's channel::

    {"type": "comm", "msg_type": "comm_msg", "content": {"comm_id": ..., "data": {...}},
     "metadata": {...}, "buffers": ["<base64>", ...]}

which the kernel checks for shape and publishes on IOPub with the run's
request as parent (:mod:`cellbox.kernel.comms`).

Frontend to kernel: the kernel runs each message as a short run forked from
the session's latest snapshot, with the message in the run's spec as JSON
(``spec["comm"]``); :func:`dispatch` hands it to the manager, as ipykernel's
shell handlers do.
"""

from __future__ import annotations

import base64
import logging
import sys
from typing import Any

import comm
from comm.base_comm import BaseComm, CommManager

__all__ = ["CellComm", "install", "dispatch", "lazy_kernel_shell_module"]

# The frontend's messages the manager handles (comm.base_comm.CommManager's handlers).
HANDLERS = ("comm_open", "comm_msg", "comm_close")


def _channel() -> Any:
    """The running cell's channel (the session's shell has the current run's), or ``None``."""
    from . import cellrunner

    shell = cellrunner._shell
    return getattr(shell, "channel", None)


class CellComm(BaseComm):
    """A comm whose messages go to the kernel on the running cell's channel (``comm.create_comm`` makes these)."""

    def publish_msg(
        self,
        msg_type: str,
        data: dict[str, Any] | None = None,
        metadata: dict[str, Any] | None = None,
        buffers: list[Any] | None = None,
        **keys: Any,
    ) -> None:
        """Send one comm message to the kernel, as ipykernel's ``BaseComm.publish_msg`` sends it on IOPub.

        Bytes in ``data`` become base64 text (ipykernel's ``json_clean`` does the
        same); ``buffers`` (bytes, bytearray, memoryview) travel beside as base64.
        """
        from .cellshell import json_ready

        channel = _channel()
        if channel is None:
            return
        content = json_ready({"data": data or {}, "comm_id": self.comm_id, **keys})
        message = {
            "type": "comm",
            "msg_type": msg_type,
            "content": content,
            "metadata": json_ready(metadata or {}),
            "buffers": [base64.b64encode(bytes(buffer)).decode("ascii") for buffer in buffers or []],
        }
        channel.send(message)


def _create_comm(*args: Any, **kwargs: Any) -> BaseComm:
    return CellComm(*args, **kwargs)


def install() -> None:
    """``comm.create_comm`` makes :class:`CellComm`; done in the session's shell, and checked at every run.

    The ``Comm`` logger's words (a message to a comm that is gone) stay out of
    the cell's stderr, as ipykernel's go to its log and not to the notebook.
    """
    if comm.create_comm is not _create_comm:
        comm.create_comm = _create_comm
    logger = logging.getLogger("Comm")
    if not logger.handlers:
        logger.addHandler(logging.NullHandler())
        logger.propagate = False


def dispatch(shell: Any, message: dict[str, Any]) -> int:
    """Hand one frontend ``message`` (``msg_type``, ``content``, ``metadata``, ``header``, base64 ``buffers``)
    to the comm manager, as ipykernel's shell handlers do; the exit status (0, or 1 when it raised).

    A handler's exception is shown as a cell's is (ipywidgets shows its callbacks' itself).
    """
    msg_type = str(message.get("msg_type"))
    if msg_type not in HANDLERS:
        return 1
    given = message.get("header")
    header: dict[str, Any] = given if isinstance(given, dict) else {}
    msg = {
        "header": header,
        "msg_id": header.get("msg_id", ""),
        "msg_type": msg_type,
        "parent_header": {},
        "metadata": message.get("metadata") or {},
        "content": message.get("content") or {},
        "buffers": [memoryview(base64.b64decode(text)) for text in message.get("buffers") or []],
    }
    manager: CommManager = comm.get_comm_manager()
    try:
        getattr(manager, msg_type)(None, "", msg)
    except BaseException:  # noqa: BLE001 - the callback's own error, shown as a cell's; SystemExit too
        shell.showtraceback()
        return 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
    return 0


def lazy_kernel_shell_module() -> None:
    """Put ``ipykernel.zmqshell`` in ``sys.modules`` as a lazy module (:class:`importlib.util.LazyLoader`).

    tqdm 4.70's ``tqdm.autonotebook`` takes ``"ipykernel.zmqshell" in
    sys.modules`` as the sign of a notebook's kernel, as it is under ipykernel;
    importing the module costs about 90 ms (jupyter_client, zmq), so it is
    loaded only when something reads from it.  Without ipykernel nothing is
    done.
    """
    import importlib.util

    name = "ipykernel.zmqshell"
    if name in sys.modules:
        return
    package = importlib.util.find_spec("ipykernel")  # finds, without importing ipykernel itself
    if package is None or not package.submodule_search_locations:
        return
    path = f"{list(package.submodule_search_locations)[0]}/zmqshell.py"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        return
    loader = importlib.util.LazyLoader(spec.loader)
    spec.loader = loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    loader.exec_module(module)
