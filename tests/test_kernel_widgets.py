"""Comms and widgets through jupyter_client: cell to frontend on the cell's channel, frontend to kernel as runs.

One cellbox kernel serves the module (CPU time 4 s, so a callback that spins is stopped soon; each test uses
names of its own), and one ipykernel kernel for the differential cases.  The frontend's side is played by the
test: it sends ``comm_msg`` as JupyterLab's widget manager does (``{"method": "update", "state": ...}`` for a
slider, ``{"method": "custom", "content": {"event": "click"}}`` for a button).
"""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from queue import Empty
from typing import Any

import psutil
import pytest
from jupyter_client.blocking.client import BlockingKernelClient

from cellbox.kernel.comms import MAX_NAME, CommQueue, CommRecord, Pending
from cellbox.sandbox.snapshots import Chain
from kernelkit import TIMEOUT, Result, execute, plain, running_kernel

NO_WIDGETS = importlib.util.find_spec("ipywidgets") is None

CPU_TIME = 4


@pytest.fixture(scope="module")
def notebook_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return {name: tmp_path_factory.mktemp(f"notebook-{name}") for name in ("cellbox", "python3")}


@pytest.fixture(scope="module")
def kernels(notebook_dirs: dict[str, Path]) -> Iterator[dict[str, BlockingKernelClient]]:
    """{"cellbox": client, "python3": client}: each kernel in a notebook folder of its own."""
    if NO_WIDGETS:
        pytest.skip("ipywidgets is not installed (pip install ipywidgets)")
    with ExitStack() as stack:
        clients = {}
        for name, extra in (("cellbox", [f"--CellboxKernel.cpu_time={CPU_TIME}"]), ("python3", [])):
            folder = notebook_dirs[name]
            _km, kc = stack.enter_context(running_kernel(name, cwd=str(folder), extra=extra))
            clients[name] = kc
        yield clients


@pytest.fixture
def kc(kernels: dict[str, BlockingKernelClient]) -> BlockingKernelClient:
    return kernels["cellbox"]


def ok(kc: BlockingKernelClient, code: str) -> Result:
    result = execute(kc, code)
    assert result.status == "ok", (code, result.traceback)
    return result


def send_comm(
    kc: BlockingKernelClient,
    msg_type: str,
    content: dict[str, Any],
    buffers: list[bytes] | None = None,
    timeout: float = TIMEOUT,
) -> list[dict[str, Any]]:
    """Send one comm message as a frontend does; the IOPub messages it caused, until its idle status."""
    msg = kc.session.msg(msg_type, content)
    kc.session.send(kc.shell_channel.socket, msg, buffers=buffers or [])
    return _iopub_until_idle(kc, msg["header"]["msg_id"], timeout)


def _iopub_until_idle(kc: BlockingKernelClient, msg_id: str, timeout: float) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    while True:
        try:
            msg = kc.get_iopub_msg(timeout=0.05)
        except Empty:
            if time.monotonic() > deadline:
                raise TimeoutError(f"no idle status after {timeout} s") from None
            continue
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if msg["msg_type"] == "status":
            if msg["content"]["execution_state"] == "idle":
                return messages
            continue
        messages.append(msg)


def model_ids(result: Result | list[dict[str, Any]], model_name: str) -> list[str]:
    """The comm ids of the widgets of ``model_name`` that ``result`` opened."""
    messages = result.messages if isinstance(result, Result) else result
    return [
        m["content"]["comm_id"]
        for m in messages
        if m["msg_type"] == "comm_open" and m["content"]["data"]["state"].get("_model_name") == model_name
    ]


def streamed(messages: list[dict[str, Any]]) -> str:
    return "".join(m["content"]["text"] for m in messages if m["msg_type"] == "stream")


def update(comm_id: str, **state: Any) -> dict[str, Any]:
    return {"comm_id": comm_id, "data": {"method": "update", "state": state, "buffer_paths": []}}


def comm_info(kc: BlockingKernelClient, target_name: str | None = None) -> dict[str, Any]:
    msg_id = kc.comm_info(target_name)
    reply = kc.get_shell_msg(timeout=TIMEOUT)
    while reply["parent_header"].get("msg_id") != msg_id:
        reply = kc.get_shell_msg(timeout=TIMEOUT)
    return dict(reply["content"])


SLIDER = (
    "import ipywidgets as widgets\n"
    "moves = []\n"
    "slider = widgets.IntSlider(value=1, max=50)\n"
    "def moved(change):\n"
    "    print('moved to', change['new'])\n"
    "    moves.append(change['new'])\n"
    "slider.observe(moved, 'value')\n"
    "slider"
)


# --------------------------------------------------------------------------- the queue and the record


def pending(comm_id: str, data: dict[str, Any], buffers: list[bytes] | None = None) -> Pending:
    return Pending("comm_msg", {"comm_id": comm_id, "data": data}, {}, buffers or [], {}, None)


def test_a_queued_update_loses_the_keys_a_later_update_of_its_widget_sets() -> None:
    queue = CommQueue()
    first = pending("a", {"method": "update", "state": {"value": 1, "description": "x"}})
    click = pending("a", {"method": "custom", "content": {"event": "click"}})
    other = pending("b", {"method": "update", "state": {"value": 7}})
    binary = pending("a", {"method": "update", "state": {"value": 0}, "buffer_paths": [["data"]]}, [b"\0"])
    second = pending("a", {"method": "update", "state": {"value": 2}})
    third = pending("a", {"method": "update", "state": {"value": 3, "description": "y"}})
    for item in (first, click, other, binary, second, third):
        queue.add(item)
    # The binary update keeps its state whole (its buffers go by position); every other message keeps its place.
    assert queue.items == [click, other, binary, third]
    assert first.done.is_set() and second.done.is_set() and not third.done.is_set()
    assert third.content["data"]["state"] == {"value": 3, "description": "y"}


def test_undo_counts_cells_and_takes_the_widget_events_after_them() -> None:
    record = CommRecord(undo_depth=4)
    for kind, comm_id in (("cell", "c1"), ("cell", "c2"), ("comm", None), ("comm", None)):
        if comm_id:
            record.running[comm_id] = "jupyter.widget"
        record.settled(kind, kept=True)
    # The second widget event's state replaced the first's: no cell ran between them.
    assert [state.kind for state in record.states] == ["cell", "cell", "comm"]
    assert record.to_undo(1) == (2, 1)
    assert record.to_undo(2) == (3, 2)
    assert record.to_undo(5) == (3, 2)
    assert record.undone(2) == {"c2": "jupyter.widget"}
    assert record.current() == {"c1": "jupyter.widget"}


def test_widget_events_never_use_up_the_undo_depth() -> None:
    record = CommRecord(undo_depth=2)
    for _ in range(5):
        record.settled("cell", kept=True)
        for _ in range(7):
            record.settled("comm", kept=True)
    # Two cells above the oldest kept state (the floor, once one was let go), each with its last event after it.
    kinds = ["cell", "comm", "cell", "comm", "cell", "comm"]
    assert record.evicted and [state.kind for state in record.states] == kinds
    assert record.to_undo(1) == (2, 1) and record.to_undo(2) == (4, 2) and record.to_undo(3) == (4, 2)


def test_the_keepers_chain_keeps_what_the_kernels_record_keeps() -> None:
    class Handle:
        """A kept snapshot as the chain sees one: killed when let go."""

        def __init__(self, n: int) -> None:
            self.pid, self.killed = 10_000 + n, False

        def kill(self) -> None:
            self.killed = True

    chain, record = Chain(undo_depth=1), CommRecord(undo_depth=1)
    handles = []
    for n, kind in enumerate(["cell", "comm", "comm", "cell", "comm", "cell", "comm", "comm", "comm"]):
        handles.append(Handle(n))
        assert chain.offer(handles[-1], stop=False)
        chain.depth_if_kept()  # as the keeper's exit record asks, before the kind is known
        assert chain.settle(True, kind)
        record.settled(kind, kept=True)
        assert [snap.kind for snap in chain.kept] == [state.kind for state in record.states]
        assert chain.evicted == record.evicted
    # Every snapshot the chain let go was killed, and only those.
    assert [h.killed for h in handles] == [h not in chain.kept for h in handles]
    assert [handles.index(h) for h in chain.kept] == [3, 4, 5, 8]


def test_states_let_go_for_memory_go_from_the_oldest_in_chain_and_record_alike_and_never_the_current() -> None:
    class Handle:
        def __init__(self, n: int) -> None:
            self.pid, self.killed = 20_000 + n, False

        def kill(self) -> None:
            self.killed = True

    chain, record = Chain(undo_depth=3), CommRecord(undo_depth=3)
    handles = [Handle(n) for n in range(3)]
    for handle, kind in zip(handles, ["cell", "comm", "cell"], strict=True):
        chain.offer(handle, stop=False)
        chain.settle(True, kind)
        record.settled(kind, kept=True)
    assert not chain.evicted and record.to_undo(2) == (3, 2)  # back to the base, before every cell
    assert chain.let_go() is handles[0]
    record.let_go(1)
    assert handles[0].killed and not handles[1].killed
    assert [snap.kind for snap in chain.kept] == [state.kind for state in record.states] == ["comm", "cell"]
    assert chain.evicted and record.evicted and record.short_of_memory
    assert record.to_undo(2) == (1, 1)  # the oldest kept state is now the floor
    assert chain.let_go() is handles[1]
    record.let_go(1)
    assert chain.let_go() is None  # the session's state stays
    record.let_go(1)
    assert chain.kept == [handles[2]] and len(record.states) == 1 and not handles[2].killed
    assert chain.undo(1) == 0 and record.to_undo(1) == (0, 0)


def test_a_run_that_is_not_kept_gives_back_the_comms_it_opened() -> None:
    record = CommRecord(undo_depth=3)
    record.running["w"] = "jupyter.widget"
    assert record.settled("cell", kept=False) == {"w": "jupyter.widget"}
    assert record.open_now() == {}


# --------------------------------------------------------------------------- cell to frontend


def test_a_slider_opens_the_same_comm_as_under_ipykernel(kernels: dict[str, BlockingKernelClient]) -> None:
    def shape(kc: BlockingKernelClient) -> tuple[Any, ...]:
        result = ok(kc, "import ipywidgets\nipywidgets.IntSlider(value=3)")
        [opened] = [
            m
            for m in result.messages
            if m["msg_type"] == "comm_open" and m["content"]["data"]["state"].get("_model_name") == "IntSliderModel"
        ]
        content = opened["content"]
        [shown] = result.of("execute_result")
        view = shown["data"]["application/vnd.jupyter.widget-view+json"]
        return (
            content["target_name"],
            sorted(content["data"]),
            sorted(content["data"]["state"]),
            content["data"]["state"]["value"],
            opened["metadata"],
            view["model_id"] == content["comm_id"],
            opened["parent_header"]["msg_id"] == result.reply["parent_header"]["msg_id"],
        )

    assert shape(kernels["cellbox"]) == shape(kernels["python3"])


def test_interact_shows_its_functions_output_in_its_output_widget(kernels: dict[str, BlockingKernelClient]) -> None:
    code = "from ipywidgets import interact\ndef f(x):\n    print('x is', x)\n_ = interact(f, x=5)"
    seen = []
    for kc in kernels.values():
        result = ok(kc, code)
        [output] = model_ids(result, "OutputModel")
        # The Output widget captures what has the cell's request as parent, once it says that request's msg_id.
        captures = [
            m["content"]["data"]["state"]["msg_id"]
            for m in result.messages
            if m["msg_type"] == "comm_msg"
            and m["content"]["comm_id"] == output
            and "msg_id" in m["content"]["data"].get("state", {})
        ]
        seen.append(
            (
                result.stream(),
                captures[0] == result.reply["parent_header"]["msg_id"],
                len(model_ids(result, "IntSliderModel")),
            )
        )
    assert seen[0] == seen[1] == ("x is 5\n", True, 1)


def test_comm_buffers_reach_the_frontend_as_binary_frames(kc: BlockingKernelClient) -> None:
    result = ok(
        kc,
        "import comm\nbinary = comm.create_comm(target_name='cellbox.binary')\n"
        "binary.send({'kind': 'frame'}, buffers=[b'\\x00\\x01\\xff', memoryview(b'png')])",
    )
    [sent] = [m for m in result.messages if m["msg_type"] == "comm_msg"]
    assert sent["content"]["data"] == {"kind": "frame"}
    assert [bytes(b) for b in sent["buffers"]] == [b"\x00\x01\xff", b"png"]


MALFORMED = [
    {"msg_type": "comm_open", "content": {"comm_id": 5, "data": {}, "target_name": "t"}},
    {"msg_type": "comm_open", "content": {"comm_id": "bad-target", "data": {}, "target_name": ["t"]}},
    {"msg_type": "comm_msg", "content": {"comm_id": "x" * (MAX_NAME + 1), "data": {}}},
    {"msg_type": "comm_msg", "content": {"comm_id": "bad-data", "data": "not a dict"}},
    {"msg_type": "comm_msg", "content": {"comm_id": "bad-meta", "data": {}}, "metadata": []},
    {"msg_type": "comm_msg", "content": {"comm_id": "bad-buffer", "data": {}}, "buffers": ["not base64!"]},
    {"msg_type": "comm_msg", "content": {"comm_id": "many-buffers", "data": {}}, "buffers": ["AA=="] * 65},
    {"msg_type": "execute_reply", "content": {"comm_id": "bad-type", "data": {}}},
    {"msg_type": "comm_msg", "content": None},
]


def test_a_malformed_comm_message_from_a_cell_is_dropped_with_a_note_and_the_kernel_lives(
    kc: BlockingKernelClient,
) -> None:
    send = "get_ipython().channel.send({'type': 'comm', **message})"
    code = f"for message in {MALFORMED!r}:\n    {send}\nprint('sent')"
    result = ok(kc, code)
    assert result.stream() == "sent\n"
    assert not [m for m in result.messages if m["msg_type"].startswith("comm_")]
    dropped = [line for line in result.notes.splitlines() if "a comm message from the cell was dropped" in line]
    assert len(dropped) == len(MALFORMED)
    assert ok(kc, "print(1 + 1)").stream() == "2\n"


# --------------------------------------------------------------------------- frontend to kernel


def test_a_slider_update_runs_its_observer_and_the_next_cell_sees_it(kc: BlockingKernelClient) -> None:
    [slider] = model_ids(ok(kc, SLIDER), "IntSliderModel")
    sent = send_comm(kc, "comm_msg", update(slider, value=7))
    assert streamed(sent) == "moved to 7\n"
    echoes = [m["content"]["data"] for m in sent if m["msg_type"] == "comm_msg"]
    assert echoes == [{"method": "echo_update", "state": {"value": 7}, "buffer_paths": []}]
    assert ok(kc, "print(moves, slider.value)").stream() == "[7] 7\n"


def test_a_button_click_runs_on_click(kc: BlockingKernelClient) -> None:
    code = (
        "import ipywidgets as widgets\nclicks = 0\nbutton = widgets.Button(description='go')\n"
        "def clicked(b):\n    global clicks\n    clicks += 1\n    print('clicked', clicks)\n"
        "button.on_click(clicked)\nbutton"
    )
    [button] = model_ids(ok(kc, code), "ButtonModel")
    click = {"comm_id": button, "data": {"method": "custom", "content": {"event": "click"}}}
    assert streamed(send_comm(kc, "comm_msg", click)) == "clicked 1\n"
    assert streamed(send_comm(kc, "comm_msg", click)) == "clicked 2\n"
    assert ok(kc, "print(clicks)").stream() == "2\n"


def test_an_output_widget_captures_a_callbacks_print_under_the_comm_message(kc: BlockingKernelClient) -> None:
    code = (
        "import ipywidgets as widgets\nlog = widgets.Output()\nknob = widgets.IntSlider()\n"
        "def logged(change):\n    with log:\n        print('knob at', change['new'])\n"
        "knob.observe(logged, 'value')\ndisplay(knob, log)"
    )
    result = ok(kc, code)
    [knob], [log] = model_ids(result, "IntSliderModel"), model_ids(result, "OutputModel")
    msg = kc.session.msg("comm_msg", update(knob, value=3))
    kc.session.send(kc.shell_channel.socket, msg)
    sent = _iopub_until_idle(kc, msg["header"]["msg_id"], TIMEOUT)
    captures = [
        m["content"]["data"]["state"]["msg_id"]
        for m in sent
        if m["msg_type"] == "comm_msg" and m["content"]["comm_id"] == log
    ]
    # As under ipykernel: the Output widget names the comm message, whose parent the print then has.
    assert captures == [msg["header"]["msg_id"], ""]
    assert streamed(sent) == "knob at 3\n"


def test_superseded_updates_of_a_widget_waiting_behind_a_cell_run_once(
    kc: BlockingKernelClient, notebook_dirs: dict[str, Path]
) -> None:
    [dial] = model_ids(ok(kc, SLIDER.replace("slider", "dial").replace("moves", "turns")), "IntSliderModel")
    go = notebook_dirs["cellbox"] / "go"
    # The cell waits for the test (in the notebook folder, which it sees): the updates sent meanwhile queue.
    msg_id = kc.execute("import os, time\nwhile not os.path.exists('go'):\n    time.sleep(0.02)")
    time.sleep(0.5)
    for value in (10, 11, 12, 13):
        msg = kc.session.msg("comm_msg", update(dial, value=value))
        kc.session.send(kc.shell_channel.socket, msg)
    click = kc.session.msg("comm_msg", {"comm_id": dial, "data": {"method": "request_state"}})
    kc.session.send(kc.shell_channel.socket, click)
    time.sleep(0.5)
    go.write_text("")
    _iopub_until_idle(kc, msg_id, TIMEOUT)
    # Only the last value ran; the other message (a request for the state) kept its place and ran too.
    deadline = time.monotonic() + TIMEOUT
    while (text := ok(kc, "print(turns)").stream()) == "[]\n" and time.monotonic() < deadline:
        time.sleep(0.1)
    assert text == "[13]\n"


def test_a_frontend_comm_open_runs_its_target_and_comm_info_lists_it(kc: BlockingKernelClient) -> None:
    ok(
        kc,
        "import comm\nopened = {}\n"
        "def target(c, msg):\n    opened[c.comm_id] = msg['content']['data']\n"
        "    c.on_msg(lambda m: c.send({'echo': m['content']['data']}))\n"
        "comm.get_comm_manager().register_target('cellbox.echo', target)",
    )
    assert send_comm(kc, "comm_open", {"comm_id": "front-1", "target_name": "cellbox.echo", "data": {"a": 1}}) == []
    assert ok(kc, "print(opened)").stream() == "{'front-1': {'a': 1}}\n"
    assert comm_info(kc, "cellbox.echo") == {"status": "ok", "comms": {"front-1": {"target_name": "cellbox.echo"}}}
    echoed = send_comm(kc, "comm_msg", {"comm_id": "front-1", "data": {"b": 2}})
    assert [m["content"]["data"] for m in echoed if m["msg_type"] == "comm_msg"] == [{"echo": {"b": 2}}]
    # Malformed (the messaging spec's shapes): nothing runs, nothing echoes.
    for content in ({"comm_id": "front-1", "data": ["b"]}, {"comm_id": 1, "data": {}}, {"data": {"b": 3}}):
        assert send_comm(kc, "comm_msg", content) == []
    assert send_comm(kc, "comm_open", {"comm_id": "front-no-target", "data": {}}) == []
    send_comm(kc, "comm_close", {"comm_id": "front-1", "data": {}})
    assert comm_info(kc, "cellbox.echo") == {"status": "ok", "comms": {}}


def test_a_comm_open_to_a_target_no_cell_registered_is_closed(kc: BlockingKernelClient) -> None:
    sent = send_comm(kc, "comm_open", {"comm_id": "front-2", "target_name": "cellbox.nobody", "data": {}})
    assert [(m["msg_type"], m["content"]["comm_id"]) for m in sent] == [("comm_close", "front-2")]
    assert "front-2" not in comm_info(kc)["comms"]


def test_comm_info_lists_the_comms_cells_opened_and_not_those_they_closed(kc: BlockingKernelClient) -> None:
    result = ok(
        kc,
        "import comm\nkept = comm.create_comm(target_name='cellbox.listed')\n"
        "gone = comm.create_comm(target_name='cellbox.listed')\ngone.close()\nprint(kept.comm_id)",
    )
    assert comm_info(kc, "cellbox.listed")["comms"] == {result.stream().strip(): {"target_name": "cellbox.listed"}}
    ok(kc, "kept.close()")
    assert comm_info(kc, "cellbox.listed")["comms"] == {}


def test_a_callback_that_loops_for_ever_is_stopped_and_the_state_before_it_stays(kc: BlockingKernelClient) -> None:
    code = (
        "import ipywidgets as widgets\nspun = 'before'\nspinner = widgets.IntSlider()\n"
        "def spin(change):\n    global spun\n    spun = 'changed'\n    while True:\n        pass\n"
        "spinner.observe(spin, 'value')\nspinner"
    )
    [spinner] = model_ids(ok(kc, code), "IntSliderModel")
    sent = send_comm(kc, "comm_msg", update(spinner, value=9))
    [error] = [m["content"] for m in sent if m["msg_type"] == "error"]
    assert error["ename"] == "CellCPULimitError"
    result = ok(kc, "print(spun, spinner.value)")
    assert result.stream() == "before 0\n"
    assert "a widget's callback (comm_msg) was stopped, so what it changed is not kept" in result.notes
    assert spinner in comm_info(kc)["comms"]


def test_undo_counts_cells_and_closes_the_widgets_it_takes_away(kc: BlockingKernelClient) -> None:
    ok(kc, "before_undo = 'kept'")
    made = ok(kc, "import ipywidgets as widgets\ngauge = widgets.IntSlider()\ngauge")
    [gauge] = model_ids(made, "IntSliderModel")
    opened = {m["content"]["comm_id"] for m in made.messages if m["msg_type"] == "comm_open"}  # its layout, style
    send_comm(kc, "comm_msg", update(gauge, value=4))
    send_comm(kc, "comm_msg", update(gauge, value=5))
    result = execute(kc, "%undo")
    # Two widget events after the cell: one %undo still takes the cell away, and its widgets with it.
    assert result.stream().startswith("Undid 1 cell:")
    closed = [m["content"]["comm_id"] for m in result.messages if m["msg_type"] == "comm_close"]
    assert sorted(closed) == sorted(opened) and gauge in closed
    assert ok(kc, "print(before_undo, 'gauge' in dir())").stream() == "kept False\n"
    assert gauge not in comm_info(kc)["comms"]
    sent = send_comm(kc, "comm_msg", update(gauge, value=6))
    assert [(m["msg_type"], m["content"]["comm_id"]) for m in sent] == [("comm_close", gauge)]


def test_undo_after_more_widget_events_than_its_depth_still_takes_the_cell_away(tmp_path: Path) -> None:
    with running_kernel("cellbox", cwd=str(tmp_path), extra=["--CellboxKernel.undo_depth=2"]) as (_km, kc):
        ok(kc, "before_knob = 1")
        [knob] = model_ids(ok(kc, "import ipywidgets\nknob = ipywidgets.IntSlider()\nknob"), "IntSliderModel")
        for value in (1, 2, 3, 4):
            send_comm(kc, "comm_msg", update(knob, value=value))
        assert ok(kc, "print(knob.value)").stream() == "4\n"
        # Four events between two cells, two cells to undo: the print, then the knob and its events.
        result = execute(kc, "%undo 2")
        assert result.stream().startswith("Undid 2 cells:")
        assert knob in [m["content"]["comm_id"] for m in result.messages if m["msg_type"] == "comm_close"]
        assert ok(kc, "print(before_knob, 'knob' in dir())").stream() == "1 False\n"


def session_processes(km: Any) -> list[psutil.Process]:
    """The kernel's session: its keeper, the snapshots and the spare (every descendant named cellbox-...)."""
    kernel, found = psutil.Process(km.provisioner.process.pid), []
    for process in kernel.children(recursive=True):
        try:
            if process.name().startswith("cellbox-") and process.status() != psutil.STATUS_ZOMBIE:
                found.append(process)
        except psutil.NoSuchProcess:
            pass  # killed since the listing
    return found


def test_widget_events_replace_their_snapshots_and_a_new_session_closes_the_widgets_at_once(tmp_path: Path) -> None:
    with running_kernel("cellbox", cwd=str(tmp_path)) as (km, kc):
        code = (
            "import ipywidgets\ndial = ipywidgets.IntSlider()\ndial.observe(lambda c: print('to', c['new']), 'value')"
        )
        [dial] = model_ids(ok(kc, f"{code}\ndial"), "IntSliderModel")
        send_comm(kc, "comm_msg", update(dial, value=1))
        before = len(session_processes(km))
        for value in range(2, 12):
            assert streamed(send_comm(kc, "comm_msg", update(dial, value=value))) == f"to {value}\n"
        # Each event's snapshot replaced the one before it, killed (its end is not waited for): no stopped
        # process piles up in the session.
        deadline = time.monotonic() + TIMEOUT
        while len(session_processes(km)) > before and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(session_processes(km)) == before
        [keeper] = [p for p in session_processes(km) if p.name() == "cellbox-keeper"]
        keeper.kill()
        keeper.wait(TIMEOUT)
        # The next run starts a new session, which holds no widget: the frontend is told so at once, as after
        # an %undo, rather than the move running in a state without the slider and showing nothing.
        sent = send_comm(kc, "comm_msg", update(dial, value=12))
        assert dial in [m["content"]["comm_id"] for m in sent if m["msg_type"] == "comm_close"]
        assert dial not in comm_info(kc)["comms"]
        result = ok(kc, "print('dial' in dir())")
        assert result.stream() == "False\n"
        # One note, the session's (found ended, or not answering the move's run): not a callback stopped.
        [note] = result.notes.splitlines()
        assert note.startswith("cellbox: the session's state was lost (the session ")


# --------------------------------------------------------------------------- tqdm and ipympl


def test_tqdm_auto_gives_the_notebook_bar_and_later_bars_do_not_shift(
    kernels: dict[str, BlockingKernelClient],
) -> None:
    if importlib.util.find_spec("tqdm") is None:
        pytest.skip("tqdm is not installed (pip install tqdm)")
    code = (
        "import tqdm.auto\nprint(tqdm.auto.tqdm.__mro__[1].__module__)\n"
        "for _ in tqdm.auto.tqdm(range(3)):\n    pass\nfor _ in tqdm.auto.tqdm(range(3)):\n    pass"
    )
    seen = []
    for kc in kernels.values():
        result = ok(kc, code)
        text = result.stream() + result.stream("stderr")
        seen.append((result.stream(), len(model_ids(result, "FloatProgressModel")), "\x1b[A" in text))
    assert seen[0] == seen[1] == ("tqdm.notebook\n", 2, False)


def test_matplotlib_widget_draws_with_ipympl_as_under_ipykernel(kernels: dict[str, BlockingKernelClient]) -> None:
    if importlib.util.find_spec("ipympl") is None:
        pytest.skip("ipympl is not installed (pip install ipympl)")
    seen = []
    for kc in kernels.values():
        result = ok(kc, "%matplotlib widget\nimport matplotlib.pyplot as plt\nplt.figure()\nplt.plot([1, 3, 2])")
        backend = ok(kc, "print(plt.get_backend())").stream()
        back = ok(kc, "%matplotlib inline\nplt.figure()\nplt.plot([1, 2])\nplt.show()")
        seen.append(
            (
                len(model_ids(result, "MPLCanvasModel")),
                backend,
                ["image/png" in c["data"] for c in back.of("display_data")],
            )
        )
    assert seen[0] == seen[1]
    assert seen[0][0] == 1 and seen[0][2] and all(seen[0][2])  # inline again: its figures are images


def test_matplotlib_widget_without_ipympl_is_refused_on_its_line_and_inline_plots_still_work(
    kc: BlockingKernelClient,
) -> None:
    ok(
        kc,
        "import sys\nclass NoIpympl:\n    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'ipympl':\n            raise ModuleNotFoundError(name)\n"
        "sys.meta_path.insert(0, NoIpympl())\nsys.modules.pop('ipympl', None)",
    )
    refused = execute(kc, "%matplotlib widget")
    assert refused.status == "error"
    assert plain(refused.stream("stderr")).startswith("UsageError: %matplotlib widget needs the ipympl package")
    shown = ok(kc, "import matplotlib.pyplot as plt\nplt.figure()\nplt.plot([1, 2])\nplt.show()")
    assert ["image/png" in c["data"] for c in shown.of("display_data")] == [True]
    ok(kc, "sys.meta_path[:] = [f for f in sys.meta_path if type(f).__name__ != 'NoIpympl']")
