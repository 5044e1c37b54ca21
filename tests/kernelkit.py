"""Helpers for the kernel tests: start a real kernel through jupyter_client and run cells on it."""

from __future__ import annotations

import dataclasses
import os
import re
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from queue import Empty
from typing import Any

from jupyter_client.blocking.client import BlockingKernelClient
from jupyter_client.manager import KernelManager

from sandboxkit import alive, descendants, survivors  # noqa: F401 - the kernel tests find leftovers the same way

ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
TIMEOUT = 60.0


def without_notes(outputs: list[Any]) -> list[Any]:
    """A cell's outputs without cellbox's own notes (display_data of its note mimetype, which ipykernel has no
    counterpart of and graders do not score), as a comparison with ipykernel or an exact count of outputs wants."""
    from cellbox.kernel.kernel import NOTE_MIMETYPE

    return [o for o in outputs if NOTE_MIMETYPE not in (o.get("data") or {})]


def coalesced(outputs: list[Any]) -> list[dict[str, Any]]:
    """``outputs`` with each run of consecutive stream outputs of one name joined into one, as nbformat's
    readers and nbconvert's ``coalesce_streams`` show them.

    How a cell's text is cut into stream messages depends on when the kernel's reader woke up (a busy machine
    cuts one ``print`` in two); a test about what a cell printed compares the joined text.
    """
    joined: list[dict[str, Any]] = []
    for output in outputs:
        previous = joined[-1] if joined else None
        if (
            output.get("output_type") == "stream"
            and previous is not None
            and previous.get("output_type") == "stream"
            and previous.get("name") == output.get("name")
        ):
            previous["text"] += output["text"]
        else:
            joined.append(dict(output))
    return joined


def plain(text: str) -> str:
    """``text`` without ANSI colour codes."""
    return ANSI.sub("", text)


@dataclasses.dataclass
class Result:
    """What one execute_request produced: the reply and the iopub messages, in order."""

    reply: dict[str, Any]
    messages: list[dict[str, Any]]
    arrivals: list[float]

    @property
    def content(self) -> dict[str, Any]:
        return self.reply["content"]

    @property
    def status(self) -> str:
        return str(self.content["status"])

    @property
    def metadata(self) -> dict[str, Any]:
        return self.reply["metadata"]

    def of(self, msg_type: str) -> list[dict[str, Any]]:
        """The contents of the iopub messages of one type."""
        return [m["content"] for m in self.messages if m["msg_type"] == msg_type]

    def kinds(self) -> list[str]:
        """The iopub message types in order, each run of stream messages of one name counted once (see
        :func:`coalesced`: where a kernel cuts a text into messages is not the cell's output)."""
        kinds: list[str] = []
        previous: dict[str, Any] | None = None
        for message in self.messages:
            content = message["content"]
            same = message["msg_type"] == "stream" and previous is not None and previous.get("name") == content["name"]
            if not same:
                kinds.append(message["msg_type"])
            previous = content if message["msg_type"] == "stream" else None
        return kinds

    def stream(self, name: str = "stdout") -> str:
        return "".join(c["text"] for c in self.of("stream") if c["name"] == name)

    @property
    def notes(self) -> str:
        """cellbox's own notes shown beside the cell (display_data of its note mimetype), one a line."""
        from cellbox.kernel.kernel import NOTE_MIMETYPE

        shown = [c["data"]["text/plain"] for c in self.of("display_data") if NOTE_MIMETYPE in c["data"]]
        return "".join(f"{text}\n" for text in shown)

    @property
    def errors(self) -> list[dict[str, Any]]:
        return self.of("error")

    @property
    def traceback(self) -> str:
        return "\n".join(plain(line) for error in self.errors for line in error["traceback"])


def kernel_manager(name: str = "cellbox", **kwargs: Any) -> KernelManager:
    """A manager for kernel ``name`` whose channels are unix sockets in a folder of its own.

    jupyter_client's default, TCP on 127.0.0.1, picks five free ports and hands them to the kernel, which
    binds them a moment later; on a busy machine another test's kernel can take one in between and the
    kernel dies with "Address already in use" before its first reply. IPC sockets in a fresh private folder
    (mode 0700) cannot collide, and no cell sees the folder.
    """
    folder = tempfile.mkdtemp(prefix="cellbox-test-ipc-")
    return KernelManager(kernel_name=name, transport="ipc", ip=os.path.join(folder, "kernel"), **kwargs)


@contextmanager
def running_kernel(
    name: str = "cellbox",
    cwd: str | None = None,
    extra: list[str] | None = None,
    interrupt_mode: str | None = None,
    prefix: list[str] | None = None,
) -> Iterator[tuple[KernelManager, BlockingKernelClient]]:
    """Start kernel ``name`` (a kernelspec of this environment) and yield its manager and client.

    ``prefix`` runs the kernel under another program (a sandbox such as ``bwrap ... --``).
    """
    km = kernel_manager(name)
    if interrupt_mode:
        km.kernel_spec.interrupt_mode = interrupt_mode  # type: ignore[union-attr]
    if prefix:
        # jupyter_client puts this Python in place of "python" only at the front of argv.
        argv = km.kernel_spec.argv  # type: ignore[union-attr]
        km.kernel_spec.argv = [*prefix, *(sys.executable if a in ("python", "python3") else a for a in argv)]  # type: ignore[union-attr]
    km.start_kernel(cwd=cwd or os.getcwd(), extra_arguments=extra or [])
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=TIMEOUT)
        yield km, kc
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=False)


def execute(
    kc: BlockingKernelClient,
    code: str,
    *,
    allow_stdin: bool = False,
    answer: Callable[[dict[str, Any]], str | None] | None = None,
    during: Callable[[dict[str, Any]], None] | None = None,
    timeout: float = TIMEOUT,
    **options: Any,
) -> Result:
    """Run ``code``; collect iopub messages until the kernel is idle again, and the reply.

    ``answer`` replies to input requests (``allow_stdin`` is then on; ``None``: no reply); ``during``
    sees each iopub message as it arrives (to interrupt a running cell, say).
    """
    msg_id = kc.execute(code, allow_stdin=allow_stdin or answer is not None, **options)
    messages: list[dict[str, Any]] = []
    arrivals: list[float] = []
    deadline = time.monotonic() + timeout
    while True:
        if answer is not None:
            try:
                request = kc.get_stdin_msg(timeout=0.01)
                value = answer(request["content"])
                if value is not None:
                    kc.input(value)
            except Empty:
                pass
        try:
            msg = kc.get_iopub_msg(timeout=0.05)
        except Empty:
            if time.monotonic() > deadline:
                raise TimeoutError(f"no idle status after {timeout} s for {code!r}") from None
            continue
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if msg["msg_type"] == "execute_input":
            continue
        if msg["msg_type"] == "status":
            if msg["content"]["execution_state"] == "idle":
                break
            continue
        messages.append(msg)
        arrivals.append(time.monotonic())
        if during is not None:
            during(msg)
    reply = kc.get_shell_msg(timeout=timeout)
    while reply["parent_header"].get("msg_id") != msg_id:
        reply = kc.get_shell_msg(timeout=timeout)
    return Result(reply=reply, messages=messages, arrivals=arrivals)


def debug_request(kc: BlockingKernelClient, command: str, seq: int = 1, **arguments: Any) -> dict[str, Any]:
    """Send one DAP request as a ``debug_request`` on the control channel; the ``debug_reply``'s content.

    As JupyterLab's debugger service sends them (``{seq, type: "request", command, arguments}``).
    """
    content = {"seq": seq, "type": "request", "command": command, "arguments": arguments}
    return debug_request_content(kc, content)


def debug_request_content(kc: BlockingKernelClient, content: Any, timeout: float = TIMEOUT) -> dict[str, Any]:
    """Send ``content`` as a ``debug_request`` (any JSON, to try bad ones); the ``debug_reply``'s content."""
    msg = kc.session.msg("debug_request", content)
    kc.control_channel.send(msg)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            reply = kc.control_channel.get_msg(timeout=0.5)
        except Empty:
            continue
        if reply["parent_header"].get("msg_id") == msg["header"]["msg_id"]:
            assert reply["msg_type"] == "debug_reply"
            return dict(reply["content"])
    raise TimeoutError(f"no debug_reply after {timeout} s for {content!r}")
