"""The cellbox kernel runs cells and reports what happened: streams, rich output, errors, limits.

One real kernel (started through jupyter_client from this environment's
``cellbox`` kernelspec) serves the whole module.
"""

from __future__ import annotations

import asyncio
import base64
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq
from ipykernel.iostream import IOPubThread
from jupyter_client.blocking.client import BlockingKernelClient
from jupyter_client.session import Session

from cellbox.kernel.cellerrors import error_for_outcome
from cellbox.kernel.kernel import DISCARDED, KEPT_STATUSES, CellboxKernel, KernelStream
from cellbox.sandbox.limits import Limits
from cellbox.sandbox.outcome import Outcome, Status
from cellbox.sandbox.runs import SESSION_BOUND_NOTE
from kernelkit import execute, plain, running_kernel, survivors


@pytest.fixture(scope="module")
def notebook_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("notebook")


@pytest.fixture(scope="module")
def kc(notebook_dir: Path) -> Iterator[BlockingKernelClient]:
    with running_kernel("cellbox", cwd=str(notebook_dir)) as (_km, client):
        # The first cell's notes are the machine's (no memory cgroup for a normal user), not any test's.
        execute(client, "pass")
        yield client


# --------------------------------------------------------------------------- output


def test_print_is_a_stdout_stream(kc: BlockingKernelClient) -> None:
    result = execute(kc, "print('hello, world')")
    assert result.status == "ok"
    assert result.kinds() == ["stream"]
    assert {c["name"] for c in result.of("stream")} == {"stdout"}
    assert result.stream() == "hello, world\n"


def test_stderr_is_a_stderr_stream(kc: BlockingKernelClient) -> None:
    result = execute(kc, "import sys\nprint('careful', file=sys.stderr)")
    assert result.stream("stderr") == "careful\n"
    assert result.stream("stdout") == ""


def test_output_arrives_while_the_cell_runs(kc: BlockingKernelClient) -> None:
    result = execute(kc, "import time\nfor i in range(3):\n    print(i, flush=True)\n    time.sleep(1)")
    texts = [c["text"] for c in result.of("stream")]
    assert "".join(texts) == "0\n1\n2\n"
    # Each line is its own message, sent when printed: the first comes about two
    # seconds of sleeping before the last, not together with it at the end.
    first = next(
        t
        for m, t in zip(result.messages, result.arrivals, strict=False)
        if m["content"].get("text", "").startswith("0")
    )
    last = next(
        t for m, t in zip(result.messages, result.arrivals, strict=False) if "2" in m["content"].get("text", "")
    )
    assert last - first > 1.5


def test_last_expression_is_an_execute_result(kc: BlockingKernelClient) -> None:
    result = execute(kc, "6 * 7")
    [content] = result.of("execute_result")
    assert content["data"] == {"text/plain": "42"}
    assert content["execution_count"] == result.content["execution_count"]


def test_every_repr_method_reaches_the_frontend(kc: BlockingKernelClient) -> None:
    code = """
class Rich:
    def __repr__(self): return "Rich()"
    def _repr_html_(self): return "<b>rich</b>"
    def _repr_markdown_(self): return "**rich**"
    def _repr_latex_(self): return "$r$"
    def _repr_json_(self): return {"rich": True}
    def _repr_svg_(self): return '<svg xmlns="http://www.w3.org/2000/svg"></svg>'
    def _repr_png_(self): return b"\\x89PNG\\r\\n\\x1a\\nfake"
Rich()
"""
    [content] = execute(kc, code).of("execute_result")
    assert content["data"] == {
        "text/plain": "Rich()",
        "text/html": "<b>rich</b>",
        "text/markdown": "**rich**",
        "text/latex": "$r$",
        "application/json": {"rich": True},
        "image/svg+xml": '<svg xmlns="http://www.w3.org/2000/svg"></svg>',
        "image/png": base64.b64encode(b"\x89PNG\r\n\x1a\nfake").decode(),
    }


def test_repr_mimebundle_and_display_objects_are_display_data(kc: BlockingKernelClient) -> None:
    code = """
from IPython.display import HTML, Markdown, display
class Bundle:
    def _repr_mimebundle_(self, include=None, exclude=None):
        return {"text/plain": "bundle", "text/html": "<i>bundle</i>"}
display(Bundle())
display(HTML("<p>hi</p>"), Markdown("# title"))
"""
    result = execute(kc, code)
    assert [c["data"] for c in result.of("display_data")] == [
        {"text/plain": "bundle", "text/html": "<i>bundle</i>"},
        {"text/plain": "<IPython.core.display.HTML object>", "text/html": "<p>hi</p>"},
        {"text/plain": "<IPython.core.display.Markdown object>", "text/markdown": "# title"},
    ]


def test_dataframe_like_html_repr(kc: BlockingKernelClient) -> None:
    code = """
class Table:
    def __init__(self, rows): self.rows = rows
    def _repr_html_(self):
        return "<table>" + "".join(f"<tr><td>{a}</td><td>{b}</td></tr>" for a, b in self.rows) + "</table>"
    def __repr__(self): return f"Table({len(self.rows)} rows)"
Table([(1, "a"), (2, "b")])
"""
    [content] = execute(kc, code).of("execute_result")
    assert content["data"] == {
        "text/plain": "Table(2 rows)",
        "text/html": "<table><tr><td>1</td><td>a</td></tr><tr><td>2</td><td>b</td></tr></table>",
    }


def _png(content: dict) -> bytes:
    return base64.b64decode(content["data"]["image/png"])


def test_open_figure_becomes_a_png_at_the_end_of_the_cell(kc: BlockingKernelClient) -> None:
    result = execute(kc, "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [1, 4, 9]);")
    [figure] = result.of("display_data")
    assert _png(figure).startswith(b"\x89PNG\r\n\x1a\n")
    assert figure["data"]["text/plain"] == "<Figure size 640x480 with 1 Axes>"
    assert result.of("execute_result") == []


def test_plt_show_displays_the_figure_before_later_prints(kc: BlockingKernelClient) -> None:
    result = execute(kc, "import matplotlib.pyplot as plt\nplt.plot([1, 2])\nplt.show()\nprint('after the plot')")
    assert result.kinds() == ["display_data", "stream"]
    assert result.stream() == "after the plot\n"


def test_cells_run_in_the_notebook_directory(kc: BlockingKernelClient, notebook_dir: Path) -> None:
    (notebook_dir / "data.txt").write_text("from the notebook's folder\n")
    result = execute(kc, "import os\nprint(os.getcwd())\nprint(open('data.txt').read(), end='')")
    assert result.stream() == f"{notebook_dir}\nfrom the notebook's folder\n"


def test_the_kernels_connection_key_does_not_reach_a_cell(kc: BlockingKernelClient) -> None:
    key = kc.session.key.decode()
    result = execute(kc, f"import os\nprint(sorted(os.environ))\nprint(any({key!r} in v for v in os.environ.values()))")
    names, found = result.stream().splitlines()
    assert found == "False"
    assert "JPY_PARENT_PID" not in names and "JPY_SESSION_NAME" not in names


# --------------------------------------------------------------------------- errors


def test_exception_is_one_error_message_with_the_users_lines_only(kc: BlockingKernelClient) -> None:
    result = execute(kc, "def divide(a, b):\n    return a / b\n\ndivide(1, 0)")
    assert result.status == "error"
    [error] = result.errors
    assert (error["ename"], error["evalue"]) == ("ZeroDivisionError", "division by zero")
    assert (result.content["ename"], result.content["evalue"]) == ("ZeroDivisionError", "division by zero")
    text = result.traceback
    assert "----> 4 divide(1, 0)" in text
    assert "----> 2     return a / b" in text
    assert "cellbox" not in text and "cellrunner" not in text and "interactiveshell" not in text
    assert result.stream("stderr") == ""


def test_syntax_error_is_reported_like_ipython(kc: BlockingKernelClient) -> None:
    result = execute(kc, "x = (1,")
    [error] = result.errors
    assert error["ename"] == "SyntaxError"
    assert "cellbox" not in result.traceback


def test_bad_limits_line_is_an_error_and_the_cell_does_not_run(kc: BlockingKernelClient, notebook_dir: Path) -> None:
    marker = notebook_dir / "ran.txt"
    result = execute(kc, f"%%limits wall=5 memory=lots\nopen({str(marker)!r}, 'w').write('ran')")
    assert result.status == "error"
    [error] = result.errors
    assert error["ename"] == "LimitError"
    assert error["evalue"] == (
        "%%limits line (memory): 'lots' is not a size; write a number with an optional unit, such as 256M, 1.5G or 64K"
    )
    assert error["traceback"] == [f"LimitError: {error['evalue']}"]
    assert not marker.exists()


def test_limit_given_twice_on_the_line_is_an_error(kc: BlockingKernelClient) -> None:
    result = execute(kc, "%%limits wall=2 wall=3\nprint('ran')")
    assert result.content["evalue"] == "%%limits line: wall is given twice; keep one wall=..."
    assert result.stream() == ""


def test_unknown_limit_name_is_named_in_the_error(kc: BlockingKernelClient) -> None:
    result = execute(kc, "%%limits speed=fast\n1")
    assert result.content["evalue"].startswith("%%limits line: unknown limit 'speed'; known limits: wall_time,")


# --------------------------------------------------------------------------- limits


def test_infinite_loop_is_stopped_at_the_wall_limit_and_the_kernel_lives(kc: BlockingKernelClient) -> None:
    result = execute(kc, "%%limits wall=1\nimport time\nwhile True:\n    time.sleep(0.1)")
    assert result.status == "error"
    [error] = result.errors
    assert error["ename"] == "CellTimeoutError"
    assert error["evalue"] == (
        "the cell ran past its 1 s wall-clock limit; it was stopped. "
        "If it needs longer, put %%limits wall=2 on the cell's first line"
    )
    assert result.metadata["cellbox"]["status"] == "timed_out"
    assert execute(kc, "print('still here')").stream() == "still here\n"


def test_processes_a_timed_out_cell_started_are_counted_and_killed(kc: BlockingKernelClient) -> None:
    mark = f"cellbox-test-{uuid.uuid4().hex}"
    code = (
        "%%limits wall=3\nimport subprocess, time\n"
        f"procs = [subprocess.Popen(['sh', '-c', 'sleep 300; : {mark}']) for _ in range(3)]\n"
        "time.sleep(60)"
    )
    result = execute(kc, code)
    [error] = result.errors
    # The message counts what the sandbox reports as killed besides the cell itself.
    killed = result.metadata["cellbox"]["killed_processes"]
    started = "1 process" if killed == 1 else f"{killed} processes"
    stopped = f"it and the {started} it started were stopped" if killed else "it was stopped"
    assert error["evalue"].startswith(f"the cell ran past its 3 s wall-clock limit; {stopped}.")
    assert survivors(mark) == []


def test_timeout_message_counts_the_processes_it_killed() -> None:
    outcome = Outcome(Status.TIMED_OUT, None, "SIGKILL", 10.2, 0.1, 10**6, "", "", False, killed_processes=3)
    assert error_for_outcome(outcome, Limits(wall_time=10)) == (
        "CellTimeoutError",
        "the cell ran past its 10 s wall-clock limit; it and the 3 processes it started were stopped. "
        "If it needs longer, put %%limits wall=20 on the cell's first line",
    )


def test_a_cell_the_sessions_memory_bound_killed_is_told_that_bound_not_its_own_limit() -> None:
    note = f"{SESSION_BOUND_NOTE} of 4G (every cell, snapshot, /tmp and /dev/shm together, a memory cgroup) and ..."
    outcome = Outcome(Status.MEMORY_LIMIT, None, "SIGKILL", 1.0, 0.5, 2 * 1024**3, "", "", False, notes=(note,))
    ename, evalue = error_for_outcome(outcome, Limits(memory=4 * 1024**3)) or ("", "")
    assert ename == "CellMemoryLimitError"
    assert evalue.startswith("the cell was stopped: the session's memory reached its 4G bound and the system killed")
    assert "RLIMIT_AS" not in evalue and "%%limits memory=" not in evalue
    assert "CellboxKernel.session_memory" in evalue


def test_busy_loop_is_a_cpu_limit_error(kc: BlockingKernelClient) -> None:
    result = execute(kc, "%%limits cpu=1 wall=120\nwhile True:\n    pass", timeout=150)
    [error] = result.errors
    assert error["ename"] == "CellCPULimitError"
    assert error["evalue"] == (
        "the cell used up its 1 s of CPU time (RLIMIT_CPU) and was stopped. "
        "If the work is meant to be that long, put %%limits cpu=2 on the cell's first line"
    )
    assert result.metadata["cellbox"]["status"] == "cpu_limit"


def test_memory_bomb_is_a_memory_limit_error_that_explains_rlimit_as_and_keeps_the_names(
    kc: BlockingKernelClient,
) -> None:
    # The MemoryError ends the cell in its own process, so its state is the next cell's: the words say so,
    # and never that the cell was stopped.
    result = execute(kc, "%%limits memory=256M\nblocks = []\nwhile True:\n    blocks.append(bytearray(50 * 2**20))")
    [error] = result.errors
    assert error["ename"] == "CellMemoryLimitError"
    assert error["evalue"] == (
        "the cell asked for more memory than its 256M limit allows: the allocation failed with MemoryError, "
        "which ended the cell; what it defined before is kept, with the memory it holds. The limit caps the "
        "address space of each process (RLIMIT_AS). If the cell really needs more, put %%limits memory=512M on "
        "its first line"
    )
    assert "----> 3     blocks.append(bytearray(50 * 2**20))" in result.traceback
    assert DISCARDED not in result.traceback
    assert (result.metadata["cellbox"]["status"], result.metadata["cellbox"]["signal"]) == ("memory_limit", None)
    after = execute(kc, "print(len(blocks) > 0, sum(map(len, blocks)) % (50 * 2**20))\ndel blocks")
    assert after.stream() == "True 0\n"


@pytest.mark.slow  # it fills 1.5G of memory
def test_a_cell_killed_at_its_memory_limit_is_stopped_and_says_its_changes_are_gone(kc: BlockingKernelClient) -> None:
    # Code that cannot allocate may abort (as C libraries do) instead of raising: a signal at the cap.
    execute(kc, "before_the_kill = 1")
    result = execute(
        kc,
        "%%limits memory=1536M\nimport os\nhoard = [b'x']\ntry:\n    while True:\n"
        "        hoard.append(b'x' * 2**20)\nexcept MemoryError:\n    os.abort()",
    )
    [error] = result.errors
    assert (result.metadata["cellbox"]["status"], result.metadata["cellbox"]["signal"]) == ("memory_limit", "SIGABRT")
    assert (error["ename"], error["evalue"]) == (
        "CellMemoryLimitError",
        "the cell was stopped: its process was ended by SIGABRT at its 1.5G memory limit (RLIMIT_AS caps the "
        "address space of each process; code that cannot allocate may abort instead of raising MemoryError). "
        "If the cell really needs more, put %%limits memory=3G on its first line",
    )
    assert plain(error["traceback"][-1]) == DISCARDED
    assert execute(kc, "print('hoard' in globals(), before_the_kill)").stream() == "False 1\n"


@pytest.mark.parametrize("status", list(Status))
@pytest.mark.parametrize("signal", [None, "SIGKILL"])
def test_a_cell_whose_state_is_kept_is_never_said_to_be_stopped(status: Status, signal: str | None) -> None:
    # The kernel keeps a cell's state for these statuses when no signal ended it (kernel.KEPT_STATUSES).
    outcome = Outcome(status, None if signal else 1, signal, 1.0, 0.5, 10**8, "", "", False)
    for limits in (Limits(), Limits(memory=None)):
        kept = signal is None and status in KEPT_STATUSES
        ename, evalue = error_for_outcome(outcome, limits, kept=kept) or ("", "")
        if kept:
            assert "stopped" not in evalue, (status, evalue)
        elif status is Status.MEMORY_LIMIT:
            assert evalue.startswith("the cell was stopped: "), evalue


def test_too_much_output_is_an_output_limit_error(kc: BlockingKernelClient) -> None:
    result = execute(kc, "%%limits output=10K\nwhile True:\n    print('x' * 99)")
    [error] = result.errors
    assert error["ename"] == "CellOutputLimitError"
    assert error["evalue"] == (
        "the cell printed more than its 10K output limit; it was stopped. "
        "Print less (a summary, or the first lines), or put %%limits output=40K on the cell's first line"
    )
    assert len(result.stream().encode()) <= 10 * 1024


def test_a_crash_names_the_signal(kc: BlockingKernelClient) -> None:
    result = execute(kc, "import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)")
    [error] = result.errors
    assert error["ename"] == "CellCrashedError"
    assert error["evalue"] == (
        "the cell's process was ended by SIGSEGV (a segmentation fault: the process touched memory it does not own); "
        "the kernel is still alive"
    )


def test_hard_exit_is_reported_with_its_status(kc: BlockingKernelClient) -> None:
    result = execute(kc, "import os\nos._exit(3)")
    [error] = result.errors
    assert (error["ename"], error["evalue"]) == (
        "CellExitedError",
        "the cell's process ended with exit status 3 before the cell finished",
    )


def test_reply_metadata_carries_the_outcome(kc: BlockingKernelClient) -> None:
    result = execute(kc, "x = sum(range(10**6))")
    outcome = result.metadata["cellbox"]
    assert outcome["status"] == "ok"
    assert outcome["wall_time"] > 0 and outcome["cpu_time"] > 0 and outcome["peak_memory"] > 10**6
    assert outcome["limits"] == Limits().as_dict()
    assert "stdout" not in outcome and "stderr" not in outcome
    limited = execute(kc, "%%limits wall=7 memory=300M\npass").metadata["cellbox"]["limits"]
    assert (limited["wall_time"], limited["memory"]) == (7.0, 300 * 2**20)


def test_run_all_stops_at_the_first_error(kc: BlockingKernelClient) -> None:
    first = kc.execute("1 / 0")
    second = kc.execute("print('must not run')")
    replies = {}
    while len(replies) < 2:
        msg = kc.get_shell_msg(timeout=60)
        replies[msg["parent_header"]["msg_id"]] = msg["content"]["status"]
    assert replies == {first: "error", second: "aborted"}


def test_memory_error_without_a_memory_limit_says_the_machine_ran_out() -> None:
    outcome = Outcome(Status.MEMORY_LIMIT, 1, None, 1.0, 0.5, 10**9, "", "MemoryError\n", False)
    assert error_for_outcome(outcome, Limits(memory=None)) == (
        "CellMemoryLimitError",
        "the cell asked for more memory than the machine could give: a MemoryError ended it",
    )
    assert error_for_outcome(outcome, Limits(memory=None), kept=True) == (
        "CellMemoryLimitError",
        "the cell asked for more memory than the machine could give: a MemoryError ended it; what it defined "
        "before is kept, with the memory it holds",
    )


def test_memory_error_from_the_child_is_noted_in_the_waiting_thread_before_classification() -> None:
    # Handed to the event loop, the note could come after Run.wait had classified
    # the run (seen once in about 25 forked memory-limit cells: `error`, not `memory_limit`).
    from cellbox.kernel.kernel import _Cell

    noted: list[str] = []
    queued: list[object] = []

    class FakeRun:
        def note_memory_error(self) -> None:
            noted.append("memory_error")

    class FakeLoop:
        def call_soon_threadsafe(self, callback: object, *args: object) -> None:
            queued.append(args)

    cell = _Cell.__new__(_Cell)
    cell.run, cell.loop = FakeRun(), FakeLoop()  # type: ignore[assignment]
    cell.from_child({"type": "memory_error"})
    cell.from_child({"type": "display_data"})
    assert noted == ["memory_error"]
    assert queued == [({"type": "memory_error"},), ({"type": "display_data"},)]


def test_the_kernels_own_stream_waits_for_iopub_only_after_a_write() -> None:
    # ipykernel flushes the kernel process's stdout and stderr before every reply, each a round trip to IOPub's
    # thread; the kernel's own stream makes that trip only when something was written, and what is written goes out.
    context = zmq.Context()
    pub, sub = context.socket(zmq.PUB), context.socket(zmq.SUB)
    port = pub.bind_to_random_port("tcp://127.0.0.1")
    sub.connect(f"tcp://127.0.0.1:{port}")
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    thread = IOPubThread(pub)
    thread.start()
    trips = []
    schedule = thread.schedule
    thread.schedule = lambda f: (trips.append(f), schedule(f))[1]  # type: ignore[method-assign]
    session = Session(key=b"")
    stream = KernelStream(session, thread, "stdout", watchfd=False)
    try:
        time.sleep(0.3)  # the subscription reaches the publisher
        stream.flush()
        assert trips == []
        stream.write("from the kernel\n")
        stream.flush()
        assert len(trips) >= 2  # the flush, then the wait for it
        assert sub.poll(5000)
        _idents, message = session.feed_identities(sub.recv_multipart())
        assert session.deserialize(message)["content"] == {"name": "stdout", "text": "from the kernel\n"}
    finally:
        stream.close()
        stop_iopub(thread)
        sub.close(0)
        context.term()


def test_the_reply_waits_for_iopub_only_when_its_request_queued_something() -> None:
    # The barrier is a round trip to IOPub's thread (about 0.5 ms a cell on 2 cores): a request that queued
    # nothing there (a trivial cell) does not make it; one that queued a message still waits until it went out.
    context = zmq.Context()
    pub = context.socket(zmq.PUB)
    pub.bind_to_random_port("tcp://127.0.0.1")
    thread = IOPubThread(pub)
    thread.start()
    kernel = CellboxKernel.__new__(CellboxKernel)
    kernel.iopub_thread = thread
    kernel._count_iopub()
    trips: list[object] = []
    schedule = thread.schedule
    thread.schedule = lambda f: (trips.append(f), schedule(f))[1]  # type: ignore[method-assign]
    try:
        since = kernel._iopub_scheduled
        kernel._iopub_barrier(since=since)
        assert trips == []
        sent = []
        thread.schedule(lambda: (time.sleep(0.2), sent.append("output")))
        kernel._iopub_barrier(since=since)
        assert sent == ["output"]  # waited for what was queued before
        assert len(trips) == 2  # the output, then the barrier's own trip
        kernel._iopub_barrier()  # without a count to compare with, it always waits
        assert len(trips) == 3
    finally:
        stop_iopub(thread)
        context.term()


def stop_iopub(thread: IOPubThread) -> None:
    """Stop an IOPub thread with its event-pipe task ended inside its loop (stopped from outside, ipykernel
    cancels the task after the loop stopped, and the interpreter's exit prints "Task was destroyed")."""
    task = getattr(thread, "_event_pipe_gc_task", None)
    if task is not None:
        for step in (task.cancel, lambda: None):  # the cancel, then one more turn of the loop for it to land
            done = threading.Event()
            thread.io_loop.add_callback(lambda step=step, done=done: (step(), done.set()))
            done.wait(5)
    thread.stop()
    thread.close()


@pytest.mark.parametrize(
    ("code", "ename"),
    [("%%limits bogus=1\nprint(1)", "LimitError"), ("%undo", "UsageError"), ("%undo 0", "UsageError")],
    ids=["limits-line", "undo-without-a-session", "undo-zero"],
)
def test_every_execute_reply_waits_for_what_its_request_published(code: str, ename: str) -> None:
    # A reply that returns before its cell runs (a refused %%limits line, an %undo) waits for IOPub's thread too:
    # without the wait its error or its stream could reach the frontend after the reply.
    kernel = CellboxKernel.__new__(CellboxKernel)
    order: list[str] = []
    kernel._forkserver = None
    kernel._iopub_barrier = lambda timeout=10.0, since=None: order.append("barrier")  # type: ignore[method-assign]

    def published(name: str, _evalue: str, _traceback: list[str]) -> dict[str, Any]:
        order.append(name)
        return {"status": "error"}

    kernel._publish_error = published  # type: ignore[method-assign]
    reply = asyncio.run(kernel.do_execute(code, False, store_history=False))
    assert reply == {"status": "error"}
    assert order == [ename, "barrier"]
