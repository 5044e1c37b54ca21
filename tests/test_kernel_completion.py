"""Completion, inspection and is_complete on the cellbox kernel, from source only."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from jupyter_client.blocking.client import BlockingKernelClient

from kernelkit import execute, running_kernel


@pytest.fixture(scope="module")
def kc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BlockingKernelClient]:
    with running_kernel("cellbox", cwd=str(tmp_path_factory.mktemp("notebook"))) as (_km, client):
        execute(client, "import math\nstudent_scores = [90, 72]")
        execute(client, 'def average_score(scores):\n    """Mean of the scores."""\n    return sum(scores) / 2')
        execute(client, "never_defined = 1\nraise ValueError('this cell failed')")
        yield client


def _reply(kc: BlockingKernelClient, msg_id: str) -> dict[str, Any]:
    while True:
        msg = kc.get_shell_msg(timeout=30)
        if msg["parent_header"]["msg_id"] == msg_id:
            return msg["content"]


def complete(kc: BlockingKernelClient, code: str) -> dict[str, Any]:
    return _reply(kc, kc.complete(code, len(code)))


def test_names_from_earlier_cells_complete(kc: BlockingKernelClient) -> None:
    reply = complete(kc, "student_s")
    assert reply["matches"] == ["student_scores"]
    assert (reply["cursor_start"], reply["cursor_end"]) == (0, len("student_s"))


def test_module_attributes_complete(kc: BlockingKernelClient) -> None:
    code = "x = math.sq"
    reply = complete(kc, code)
    assert reply["matches"] == ["sqrt"]
    assert reply["cursor_start"] == len("x = math.")


def test_names_from_a_failed_cell_are_not_offered(kc: BlockingKernelClient) -> None:
    assert complete(kc, "never_def")["matches"] == []


def test_magics_complete(kc: BlockingKernelClient) -> None:
    reply = complete(kc, "%tim")
    assert reply["matches"] == ["%time", "%timeit"]
    assert complete(kc, "%%lim")["matches"] == ["%%limits"]


def test_inspect_shows_the_docstring_of_a_cells_function(kc: BlockingKernelClient) -> None:
    code = "average_score(student_scores)"
    reply = _reply(kc, kc.inspect(code, len("average_sc")))
    assert reply["found"] is True
    assert "Mean of the scores." in reply["data"]["text/plain"]
    assert "average_score(scores)" in reply["data"]["text/plain"]


def test_inspect_of_nothing_finds_nothing(kc: BlockingKernelClient) -> None:
    reply = _reply(kc, kc.inspect("   ", 1))
    assert (reply["status"], reply["found"], reply["data"]) == ("ok", False, {})


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
    reply = _reply(kc, kc.is_complete(code))
    assert reply == expected


def test_names_from_a_cell_with_a_limits_line_complete(kc: BlockingKernelClient) -> None:
    execute(kc, "%%limits wall=10\nlimited_value = 3")
    assert complete(kc, "limited_v")["matches"] == ["limited_value"]


def test_warm_up_runs_a_real_completion(tmp_path: Path) -> None:
    from cellbox.kernel.completion import warm_up

    matches = warm_up(str(tmp_path))
    assert "path" in matches and "pardir" in matches


def _complete(kc: BlockingKernelClient, code: str) -> list[str]:
    msg_id = kc.complete(code, len(code))
    while True:
        reply = kc.get_shell_msg(timeout=60)
        if reply["parent_header"].get("msg_id") == msg_id:
            return list(reply["content"]["matches"])


def test_completion_right_at_start_and_after_an_interrupt_still_answers(tmp_path: Path) -> None:
    # Requests racing the start-up warm-up once deadlocked the kernel with
    # jedi's helper process; an interrupt (sent to the kernel's whole process
    # group in signal mode) kills that helper, and the next Tab came back empty.
    import threading

    with running_kernel("cellbox", cwd=str(tmp_path), interrupt_mode="signal") as (km, kc):
        for _ in range(3):
            assert "path" in _complete(kc, "import os\nos.pa")
        code = "import time\nprint('started')\ntime.sleep(300)"

        def during(msg: dict[str, Any]) -> None:
            if msg["msg_type"] == "stream" and "started" in msg["content"]["text"]:
                threading.Timer(0.3, km.interrupt_kernel).start()

        assert execute(kc, code, during=during).content["ename"] == "KeyboardInterrupt"
        assert "path" in _complete(kc, "import os\nos.pa")
