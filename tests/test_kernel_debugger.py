"""``%debug`` and ``%pdb`` under cellbox answer as under ipykernel, through the frontend's stdin channel.

The same cells run on ipykernel's ``python3`` and on ``cellbox`` through jupyter_client; an ``answer`` callback
types pdb commands at each ``ipdb>`` prompt (an ``input_request``).  Each cell's prompts, stdout (cell file names
normalised: ipykernel's ``/tmp/ipykernel_PID/N.py``, cellbox's ``TMPDIR/cells/HASH.py``) and reply must match,
and the values asserted below must be there.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kernelkit import execute, plain, running_kernel

INVERT = "def invert(x):\n    return 1 / x\n"

# (cell, pdb commands typed at its prompts)
CELLS: list[tuple[str, list[str]]] = [
    (INVERT + "invert(0)", []),
    ("%debug", ["p x", "q"]),
    ("%pdb on", []),
    ("call_pdb = get_ipython().call_pdb\ncall_pdb", []),
    ("invert(0)", ["p x + 41", "q"]),
    ("%pdb off", []),
    ("invert(0)", ["q"]),
]

_CELL_FILE = re.compile(r"\S*/(?:ipykernel_\d+|cells)/\w+\.py")


def _cell(kc: Any, code: str, commands: list[str]) -> dict[str, Any]:
    prompts: list[str] = []
    typed = iter(commands)

    def answer(request: dict[str, Any]) -> str:
        prompts.append(request["prompt"])
        return next(typed, "q")  # a prompt the test did not expect still ends, and the prompts say so

    result = execute(kc, code, answer=answer)
    return {
        "status": result.status,
        "ename": result.content.get("ename"),
        "prompts": prompts,
        "stdout": _CELL_FILE.sub("<cell>", plain(result.stream())),
        "results": [c["data"].get("text/plain") for c in result.of("execute_result")],
    }


def _session(kernel: str, directory: Path) -> list[dict[str, Any]]:
    directory.mkdir()
    with running_kernel(kernel, cwd=str(directory)) as (_km, kc):
        return [_cell(kc, code, commands) for code, commands in CELLS]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, list[dict[str, Any]]]]:
    folder = tmp_path_factory.mktemp("debugger")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("IPYTHONDIR", str(folder / "ipython"))  # ipykernel's: not the user's ~/.ipython
        yield {kernel: _session(kernel, folder / kernel) for kernel in ("python3", "cellbox")}


def test_every_cell_answers_as_under_ipykernel(runs: dict[str, list[dict[str, Any]]]) -> None:
    for (code, _commands), expected, got in zip(CELLS, runs["python3"], runs["cellbox"], strict=True):
        assert got == expected, f"cell {code!r} differs"


def test_debug_after_a_zero_division_shows_the_frame_and_its_local(runs: dict[str, list[dict[str, Any]]]) -> None:
    failed, debug = runs["cellbox"][0], runs["cellbox"][1]
    assert (failed["status"], failed["ename"]) == ("error", "ZeroDivisionError")
    assert debug["status"] == "ok"
    assert debug["prompts"] == ["ipdb> ", "ipdb> "]
    frame, _, after = debug["stdout"].partition("\n")
    assert frame == "> <cell>(2)invert()"
    assert "----> 2     return 1 / x" in after
    assert "\n0\n" in after  # p x: the local of the frame that raised


def test_pdb_on_persists_and_enters_post_mortem_at_the_next_failure(runs: dict[str, list[dict[str, Any]]]) -> None:
    on, state, failing = runs["cellbox"][2], runs["cellbox"][3], runs["cellbox"][4]
    assert on["stdout"] == "Automatic pdb calling has been turned ON\n"
    assert state["results"] == ["True"]  # the shell's state, carried in the snapshot to a later cell
    assert (failing["status"], failing["ename"]) == ("error", "ZeroDivisionError")
    assert failing["prompts"] == ["ipdb> ", "ipdb> "]
    assert failing["stdout"].startswith("> <cell>(2)invert()\n")
    assert "\n41\n" in failing["stdout"]


def test_pdb_off_leaves_failures_without_a_prompt(runs: dict[str, list[dict[str, Any]]]) -> None:
    off, failing = runs["cellbox"][5], runs["cellbox"][6]
    assert off["stdout"] == "Automatic pdb calling has been turned OFF\n"
    assert (failing["status"], failing["ename"], failing["prompts"]) == ("error", "ZeroDivisionError", [])
    assert failing["stdout"] == ""
