"""A whole notebook runs under nbclient on the cellbox kernel, as the lessons and graders run it."""

from __future__ import annotations

import base64
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

from kernelkit import coalesced, plain, without_notes

MIXED_CELLS = [
    ("print('one')\nprint('two')", []),
    ("import matplotlib.pyplot as plt\nplt.plot([0, 1, 2], [0, 1, 4])\nplt.title('squares');", []),
    (
        "class Frame:\n"
        "    def _repr_html_(self):\n"
        "        return '<table><tr><th>n</th></tr><tr><td>1</td></tr></table>'\n"
        "    def __repr__(self):\n"
        "        return 'Frame(1 row)'\n"
        "Frame()",
        [],
    ),
    ("def fail():\n    raise KeyError('missing')\nfail()", ["raises-exception"]),
    ("%%limits wall=2\nwhile True:\n    pass", ["raises-exception"]),
    ("%%limits memory=256M\nhoard = []\nwhile True:\n    hoard.append(bytearray(64 * 2**20))", ["raises-exception"]),
    ("print('kernel alive after', 6, 'cells')", []),
]


def _notebook(cells: list[tuple[str, list[str]]]) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "cellbox", "display_name": "Python 3 (cellbox)", "language": "python"}
    for source, tags in cells:
        cell = nbformat.v4.new_code_cell(source)
        if tags:
            cell.metadata["tags"] = tags
        nb.cells.append(cell)
    return nb


def test_mixed_notebook_gives_the_right_output_for_each_cell(tmp_path: Path) -> None:
    nb = _notebook(MIXED_CELLS)
    client = NotebookClient(nb, kernel_name="cellbox", timeout=120, resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    prints, plot, frame, exception, loop, bomb, alive = (coalesced(without_notes(cell.outputs)) for cell in nb.cells)

    assert [(o["output_type"], o["name"], o["text"]) for o in prints] == [("stream", "stdout", "one\ntwo\n")]

    [figure] = plot
    assert figure["output_type"] == "display_data"
    assert base64.b64decode(figure["data"]["image/png"]).startswith(b"\x89PNG\r\n\x1a\n")

    [table] = frame
    assert table["output_type"] == "execute_result"
    assert dict(table["data"]) == {
        "text/plain": "Frame(1 row)",
        "text/html": "<table><tr><th>n</th></tr><tr><td>1</td></tr></table>",
    }

    [error] = exception
    assert (error["output_type"], error["ename"], error["evalue"]) == ("error", "KeyError", "'missing'")
    assert "----> 3 fail()" in plain("\n".join(error["traceback"]))

    [timeout] = loop
    assert (timeout["ename"], timeout["evalue"]) == (
        "CellTimeoutError",
        "the cell ran past its 2 s wall-clock limit; it was stopped. "
        "If it needs longer, put %%limits wall=4 on the cell's first line",
    )

    [memory] = bomb
    assert memory["ename"] == "CellMemoryLimitError"
    assert memory["evalue"].startswith(
        "the cell asked for more memory than its 256M limit allows: the allocation failed"
    )

    assert [(o["output_type"], o["text"]) for o in alive] == [("stream", "kernel alive after 6 cells\n")]
    assert [cell.execution_count for cell in nb.cells] == [1, 2, 3, 4, 5, 6, 7]


def test_run_all_stops_at_the_first_error(tmp_path: Path) -> None:
    nb = _notebook([("x = 1", []), ("1 / 0", []), ("print('not reached')", [])])
    client = NotebookClient(nb, kernel_name="cellbox", timeout=60, resources={"metadata": {"path": str(tmp_path)}})
    with pytest.raises(CellExecutionError) as caught:
        client.execute()
    assert "ZeroDivisionError: division by zero" in plain(str(caught.value))
    assert nb.cells[2].outputs == [] and nb.cells[2].execution_count is None


def test_input_under_nbclient_fails_at_once_instead_of_hanging(tmp_path: Path) -> None:
    nb = _notebook([("answer = input('name: ')", ["raises-exception"]), ("print('next')", [])])
    NotebookClient(nb, kernel_name="cellbox", timeout=20, resources={"metadata": {"path": str(tmp_path)}}).execute()
    [error] = without_notes(nb.cells[0].outputs)
    assert (error.ename, error.evalue) == (
        "StdinNotImplementedError",
        "raw_input was called, but this frontend does not support input requests.",
    )
    assert [o["text"] for o in coalesced(without_notes(nb.cells[1].outputs))] == ["next\n"]
