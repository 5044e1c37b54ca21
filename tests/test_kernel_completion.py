"""Completion and inspection on the cellbox kernel: IPython's, on the live namespace, in a run beside the state.

Each request is a run forked from the session's latest snapshot and
discarded; the kernel process only checks the reply's shape.  ``is_complete``
stays in the kernel (it parses the frontend's code, nothing else).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from jupyter_client.blocking.client import BlockingKernelClient
from jupyter_client.manager import KernelManager

from cellbox.kernel.beside import MAX_MATCHES, complete_reply, inspect_reply
from kernelkit import execute, plain, running_kernel

TOUCHED = "touched-by-completion.txt"

SNEAKY = f"""
import os
class Sneaky:
    touched = 0
    def _note(self):
        Sneaky.touched += 1
        with open({TOUCHED!r}, "a") as f:
            f.write(f"{{os.getpid()}} {{bool(os.environ.get('CELLBOX_CHANNEL'))}}\\n")
    @property
    def boom(self):
        self._note()
        return self
    def __dir__(self):
        self._note()
        return [*super().__dir__(), "made_by_dir"]
sneaky = Sneaky()
"""

FRAME = """
class Frame:
    '''A table whose columns are attributes, as a DataFrame's are.'''
    def __init__(self, columns):
        self._columns = list(columns)
    def __dir__(self):
        return [*super().__dir__(), *self._columns]
    def __getattr__(self, name):
        if name in self.__dict__.get('_columns', []):
            return [1, 2, 3]
        raise AttributeError(name)
frame = Frame(['height_cm', 'weight_kg'])
"""


@pytest.fixture(scope="module")
def kernel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[KernelManager, BlockingKernelClient, Path]]:
    notebook = tmp_path_factory.mktemp("notebook")
    with running_kernel("cellbox", cwd=str(notebook)) as (km, client):
        for cell in (
            "import math\nstudent_scores = [90, 72]",
            'def average_score(scores):\n    """Mean of the scores."""\n    return sum(scores) / 2',
            "left_by_a_failed_cell = 1\nraise ValueError('this cell failed')",
            "exec('made_by_exec = 2')",
            FRAME,
            SNEAKY,
        ):
            execute(client, cell)
        yield km, client, notebook


@pytest.fixture(scope="module")
def kc(kernel: tuple[KernelManager, BlockingKernelClient, Path]) -> BlockingKernelClient:
    return kernel[1]


def _reply(kc: BlockingKernelClient, msg_id: str) -> dict[str, Any]:
    while True:
        msg = kc.get_shell_msg(timeout=60)
        if msg["parent_header"]["msg_id"] == msg_id:
            return dict(msg["content"])


def complete(kc: BlockingKernelClient, code: str) -> dict[str, Any]:
    return _reply(kc, kc.complete(code, len(code)))


def completed(kc: BlockingKernelClient, code: str) -> list[str]:
    """The code as each completion makes it (the frontend replaces cursor_start..cursor_end with the match)."""
    reply = complete(kc, code)
    start, end = reply["cursor_start"], reply["cursor_end"]
    return [code[:start] + match + code[end:] for match in reply["matches"]]


# --------------------------------------------------------------------------- what the live namespace gives


def test_names_from_earlier_cells_complete(kc: BlockingKernelClient) -> None:
    assert completed(kc, "student_s") == ["student_scores"]


def test_a_name_made_by_exec_completes(kc: BlockingKernelClient) -> None:
    assert completed(kc, "made_by_e") == ["made_by_exec"]


def test_names_left_by_a_cell_that_raised_complete(kc: BlockingKernelClient) -> None:
    assert completed(kc, "left_by_a_f") == ["left_by_a_failed_cell"]


def test_attributes_of_an_object_defined_in_a_cell_complete(kc: BlockingKernelClient) -> None:
    # Its columns exist only at run time (__dir__), as a DataFrame's.
    assert completed(kc, "frame.heig") == ["frame.height_cm"]
    assert "x = math.sqrt" in completed(kc, "x = math.sq")


def test_magics_complete(kc: BlockingKernelClient) -> None:
    assert {"%time", "%timeit"} <= set(completed(kc, "%tim"))
    assert completed(kc, "%%lim") == ["%%limits"]


def test_names_from_a_cell_with_a_limits_line_complete(kc: BlockingKernelClient) -> None:
    execute(kc, "%%limits wall=10\nlimited_value = 3")
    assert completed(kc, "limited_v") == ["limited_value"]


def test_inspect_shows_the_docstring_of_a_cells_function(kc: BlockingKernelClient) -> None:
    reply = _reply(kc, kc.inspect("average_score(student_scores)", len("average_sc")))
    assert reply["found"] is True
    text = plain(reply["data"]["text/plain"])
    assert "Mean of the scores." in text and "average_score(scores)" in text


def test_inspect_of_nothing_finds_nothing(kc: BlockingKernelClient) -> None:
    reply = _reply(kc, kc.inspect("   ", 1))
    assert (reply["status"], reply["found"], reply["data"]) == ("ok", False, {})


# --------------------------------------------------------------------------- what a request may not do


def test_a_request_that_runs_a_cells_code_changes_nothing_and_never_runs_in_the_kernel(
    kernel: tuple[KernelManager, BlockingKernelClient, Path],
) -> None:
    km, kc, notebook = kernel
    assert "sneaky.made_by_dir" in completed(kc, "sneaky.made")  # __dir__ ran, to answer
    assert "sneaky.made_by_dir" in completed(kc, "sneaky.made")
    _reply(kc, kc.inspect("sneaky.boom", len("sneaky.boom")))  # the inspector reads the property
    ran = [line.split() for line in (notebook / TOUCHED).read_text().splitlines()]
    kernel_pid = int(km.provisioner.process.pid)  # type: ignore[union-attr]
    # Each time in a run of the session (a cell's environment), none in the kernel process.
    assert ran and all(flag == "True" and int(pid) != kernel_pid for pid, flag in ran)
    assert len({pid for pid, _flag in ran}) >= 2  # one run per request
    # The run was discarded: the next cell sees the state as the cells left it.
    assert execute(kc, "print(Sneaky.touched)").stream() == "0\n"


def test_a_completer_that_hangs_is_stopped_and_the_kernel_answers(kc: BlockingKernelClient) -> None:
    execute(kc, "class Hangs:\n    def __dir__(self):\n        while True:\n            pass\nhangs = Hangs()")
    assert complete(kc, "hangs.x")["matches"] == []  # stopped at BESIDE_TIME seconds
    assert completed(kc, "student_s") == ["student_scores"]


def test_a_completer_that_floods_is_stopped_and_the_kernel_answers(kc: BlockingKernelClient) -> None:
    prints = "class Prints:\n    def __dir__(self):\n        print('x' * 10_000_000)\n        return ['a']\n"
    assert execute(kc, prints + "prints = Prints()").status == "ok"
    assert complete(kc, "prints.a")["matches"] == []  # its output limit
    # A cell may replace the completer itself: more matches than the kernel forwards are dropped.
    flood = (
        "from IPython.core.completer import Completion\n"
        "get_ipython().Completer.completions = lambda code, at: "
        f"(Completion(0, at, f'n{{i}}') for i in range({MAX_MATCHES + 1}))"
    )
    assert execute(kc, flood).status == "ok"
    try:
        assert complete(kc, "n")["matches"] == []
    finally:
        assert execute(kc, "del get_ipython().Completer.completions").status == "ok"
    assert completed(kc, "student_s") == ["student_scores"]


# A completer that leaves a process of its own, out of its session and its parent's reach (setsid, a
# double fork), writing a line every 0.1 s.
LEAVES_A_DAEMON = """
import os, time
BEAT = "daemon-beat.log"
class Daemonic:
    def __dir__(self):
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                fd = os.open(BEAT, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
                while True:
                    os.write(fd, b".")
                    time.sleep(0.1)
            os._exit(0)
        deadline = time.monotonic() + 2
        while not (os.path.exists(BEAT) and os.path.getsize(BEAT)) and time.monotonic() < deadline:
            time.sleep(0.01)  # until it has written (the run's own limit is 3 s)
        return ["by_dir"]
daemonic = Daemonic()
"""


def test_a_process_a_completer_leaves_ends_with_its_run(
    kernel: tuple[KernelManager, BlockingKernelClient, Path],
) -> None:
    # Promise (design.md): a run beside the state is discarded when it ends, "nothing outlives its run".
    _km, kc, notebook = kernel
    assert execute(kc, LEAVES_A_DAEMON).status == "ok"
    assert completed(kc, "daemonic.by") == ["daemonic.by_dir"]
    beat = notebook / "daemon-beat.log"
    written = beat.read_bytes()  # the run's processes were killed before the reply
    assert written
    time.sleep(1.0)
    assert beat.read_bytes() == written


def test_a_completion_sent_while_a_cell_runs_never_blocks_it(kc: BlockingKernelClient) -> None:
    cell = kc.execute("import time\ntime.sleep(1)\nwhile_running = 1")
    completion = kc.complete("student_s", len("student_s"))
    replies: dict[str, dict[str, Any]] = {}
    while len(replies) < 2:
        msg = kc.get_shell_msg(timeout=60)
        replies[msg["parent_header"]["msg_id"]] = msg["content"]
    assert replies[cell]["status"] == "ok"
    # Answered after the cell, from its state (as ipykernel's), or at once with nothing (a subshell's request).
    assert replies[completion]["matches"] in ([], ["student_scores"])
    assert completed(kc, "while_r") == ["while_running"]


# --------------------------------------------------------------------------- the kernel's checks


def test_a_reply_of_the_wrong_shape_becomes_the_empty_reply() -> None:
    empty = {"status": "ok", "matches": [], "cursor_start": 2, "cursor_end": 2, "metadata": {}}
    good = {"matches": ["abc"], "cursor_start": 0, "cursor_end": 2, "metadata": {}}
    assert complete_reply(good, "ab", 2) == {"status": "ok", **good}
    for bad in (
        None,
        {**good, "matches": "abc"},
        {**good, "matches": [1]},
        {**good, "cursor_end": 3},  # past the code
        {**good, "cursor_start": True},
        {**good, "matches": ["a" * 1001]},
        {**good, "metadata": {"_jupyter_types_experimental": [{"text": "abc"}]}},
    ):
        assert complete_reply(bad, "ab", 2) == empty, bad
    assert inspect_reply({"found": True, "data": {"text/plain": 1}}) == {
        "status": "ok",
        "found": False,
        "data": {},
        "metadata": {},
    }


# --------------------------------------------------------------------------- start and interrupts


def test_completion_right_at_start_and_after_an_interrupt_still_answers(tmp_path: Path) -> None:
    with running_kernel("cellbox", cwd=str(tmp_path), interrupt_mode="signal") as (km, kc):
        assert complete(kc, "pri")["status"] == "ok"  # the session may still be starting: empty or not
        execute(kc, "import os")
        code = "import time\nprint('started')\ntime.sleep(300)"

        def during(msg: dict[str, Any]) -> None:
            if msg["msg_type"] == "stream" and "started" in msg["content"]["text"]:
                threading.Timer(0.3, km.interrupt_kernel).start()

        assert execute(kc, code, during=during).content["ename"] == "KeyboardInterrupt"
        assert "os.path" in completed(kc, "os.pa")


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        ("x = 1", {"status": "complete"}),
        ("for i in range(3):", {"status": "incomplete", "indent": "    "}),
        ("if x:\n    for y in x:", {"status": "incomplete", "indent": "        "}),
        ("x = )", {"status": "invalid"}),
        ("%timeit x = 1", {"status": "complete"}),
        ("%%bash\necho hi", {"status": "incomplete", "indent": ""}),  # a cell magic waits for a blank line
    ],
)
def test_is_complete_follows_ipythons_rules(kc: BlockingKernelClient, code: str, expected: dict[str, str]) -> None:
    assert _reply(kc, kc.is_complete(code)) == expected
