"""JupyterLab's visual debugger on cellbox: the Debug Adapter Protocol in debug_request/debug_reply and debug_event.

The requests are the ones JupyterLab's debugger service sends, in its order (``debugInfo``, ``initialize``,
``attach``, ``configurationDone``, ``dumpCell``, ``setBreakpoints``, then at a stop ``stackTrace``, ``scopes``,
``variables``, ``next``/``stepIn``/``stepOut``/``continue``; ``inspectVariables`` between cells). What the kernel
answers itself is compared with ipykernel's answer (``debugInfo``, ``dumpCell``, ``initialize``).
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from ipykernel.compiler import murmur2_x86

from cellbox.kernel.beside import variables_reply
from cellbox.kernel.cellnames import HASH_SEED, murmur2
from cellbox.kernel.debugger import NO_DEBUGPY, REFUSED, checked
from kernelkit import debug_request, debug_request_content, execute, running_kernel

INITIALIZE = {"clientID": "jupyterlab", "adapterID": "python", "pathFormat": "path", "linesStartAt1": True}
CELLS = ["x = 1\n", "def f(n):\n    return n * 2\n\nf(3)\n", "print('é ☃')", ""]


@pytest.fixture(scope="module")
def kernels(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """An ipykernel and a cellbox kernel, each with the debugger's first requests answered (read-only tests)."""
    folder = tmp_path_factory.mktemp("dap")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("IPYTHONDIR", str(folder / "ipython"))
        with (
            running_kernel("python3", cwd=str(folder)) as (_, ipy),
            running_kernel("cellbox", cwd=str(folder)) as (
                _,
                cbx,
            ),
        ):
            clients = {"python3": ipy, "cellbox": cbx}
            # As JupyterLab starts its debugger session (session.ts start(): initialize, then attach).
            started = {name: debug_request(kc, "initialize", 1, **INITIALIZE) for name, kc in clients.items()}
            for kc in clients.values():
                debug_request(kc, "attach", 3)
            yield {**clients, "initialize": started}


def _info(kc: Any) -> dict[str, Any]:
    kc.kernel_info()
    return dict(kc.get_shell_msg(timeout=60)["content"])


# ---------------------------------------------------------------------- names and shapes (no kernel)


def test_murmur2_is_ipykernels_for_any_text() -> None:
    rng = random.Random(27)
    texts = CELLS + ["".join(rng.choice("ab é☃\n\t") for _ in range(rng.randrange(64))) for _ in range(300)]
    assert [murmur2(t) for t in texts] == [murmur2_x86(t, HASH_SEED) for t in texts]


@pytest.mark.parametrize(
    "message",
    [
        None,
        [],
        {"type": "response", "request_seq": 1, "success": True, "command": "next"},  # no seq
        {"seq": 1, "type": "response", "request_seq": "1", "success": True, "command": "next"},
        {"seq": 1, "type": "response", "request_seq": 1, "success": "yes", "command": "next"},
        {"seq": 1, "type": "event", "event": "stopped", "body": ["not", "an", "object"]},
        {"seq": 1, "type": "event", "event": 5},
        {"seq": 1, "type": "request", "command": "evaluate"},  # a debuggee never sends requests to the kernel
    ],
)
def test_a_message_of_the_wrong_shape_from_a_cell_is_dropped(message: Any) -> None:
    assert checked(message) is None


def test_a_response_and_an_event_of_the_right_shape_pass_unchanged() -> None:
    event = {"seq": 4, "type": "event", "event": "stopped", "body": {"threadId": 1, "reason": "breakpoint"}}
    reply = {"seq": 5, "type": "response", "request_seq": 3, "success": True, "command": "next"}
    assert checked(event) == event
    assert checked(reply) == reply


@pytest.mark.parametrize(
    "content",
    [
        {"variables": [{"name": "x", "value": "1", "type": "int", "variablesReference": 7}]},  # expandable: no
        {"variables": [{"name": "x", "value": 1, "type": "int", "variablesReference": 0}]},
        {"variables": [{"name": "x", "value": "1" * 1001, "type": "int", "variablesReference": 0}]},
        {"variables": [{"name": "x", "value": "1", "type": "int", "variablesReference": 0, "evaluateName": "x"}]},
        {"variables": "x"},
        None,
    ],
)
def test_variables_of_the_wrong_shape_from_a_run_beside_are_refused(content: Any) -> None:
    assert variables_reply(content) is None


# ---------------------------------------------------------------------- what the kernel answers itself


def test_kernel_info_offers_the_debugger_as_ipykernel_does(kernels: dict[str, Any]) -> None:
    for name in ("python3", "cellbox"):
        assert "debugger" in _info(kernels[name])["supported_features"], name
    # The older field JupyterLab also reads (messaging spec 5.5's kernel_info "debugger").
    assert _info(kernels["cellbox"])["debugger"] is True


def test_debug_info_has_ipykernels_fields_and_hash(kernels: dict[str, Any]) -> None:
    replies = {name: debug_request(kernels[name], "debugInfo", 1) for name in ("python3", "cellbox")}
    ipy, cbx = replies["python3"], replies["cellbox"]
    assert cbx["success"] is True and cbx["command"] == "debugInfo" and cbx["request_seq"] == 1
    assert set(cbx) == set(ipy)
    assert set(cbx["body"]) == set(ipy["body"])
    for field in ("hashMethod", "hashSeed", "tmpFileSuffix", "exceptionPaths"):
        assert cbx["body"][field] == ipy["body"][field], field
    assert cbx["body"]["tmpFilePrefix"].endswith(os.sep)
    assert cbx["body"]["richRendering"] is False  # richInspectVariables is refused (see below)


def test_dump_cell_names_the_cell_as_ipykernel_and_writes_it(kernels: dict[str, Any]) -> None:
    prefix = debug_request(kernels["cellbox"], "debugInfo", 1)["body"]["tmpFilePrefix"]
    for seq, code in enumerate(CELLS, 3):
        ipy = debug_request(kernels["python3"], "dumpCell", seq, code=code)
        cbx = debug_request(kernels["cellbox"], "dumpCell", seq, code=code)
        assert (cbx["success"], cbx["command"], cbx["request_seq"]) == (True, "dumpCell", seq)
        assert set(cbx["body"]) == set(ipy["body"]) == {"sourcePath"}
        path = cbx["body"]["sourcePath"]
        assert os.path.basename(path) == os.path.basename(ipy["body"]["sourcePath"])
        assert path == f"{prefix}{murmur2(code)}.py"
        assert Path(path).read_text(encoding="utf-8") == code


def test_the_cell_runs_under_the_name_dump_cell_gave(kernels: dict[str, Any]) -> None:
    code = "import inspect\nprint(inspect.currentframe().f_code.co_filename)"
    path = debug_request(kernels["cellbox"], "dumpCell", 9, code=code)["body"]["sourcePath"]
    assert execute(kernels["cellbox"], code).stream() == path + "\n"


def test_initialize_answers_capabilities_ipykernel_also_has(kernels: dict[str, Any]) -> None:
    ipy, cbx = kernels["initialize"]["python3"], kernels["initialize"]["cellbox"]
    assert (cbx["success"], cbx["command"], cbx["type"]) == (ipy["success"], ipy["command"], ipy["type"])
    assert cbx["success"] is True
    offered = {key for key, value in cbx["body"].items() if value is True}
    assert offered and offered <= {key for key, value in ipy["body"].items() if value is True}
    filters = {f["filter"] for f in cbx["body"]["exceptionBreakpointFilters"]}
    assert filters <= {f["filter"] for f in ipy["body"]["exceptionBreakpointFilters"]}
    assert debug_request(kernels["cellbox"], "debugInfo", 2)["body"]["isStarted"] is True


@pytest.mark.parametrize(
    ("content", "words"),
    [
        ({"seq": 1, "type": "request", "command": "noSuchRequest", "arguments": {}}, "does not support"),
        # Names of the kernel's own attributes are requests like any other (none may call into the kernel).
        ({"seq": 1, "type": "request", "command": "waiting", "arguments": {}}, "does not support"),
        ({"seq": 1, "type": "request", "command": "_inspectVariables", "arguments": {}}, "does not support"),
        ({"seq": 1, "type": "request", "command": "cell_ended", "arguments": {}}, "does not support"),
        ({"seq": 1, "type": "event", "event": "stopped"}, "DAP request"),
        ({"type": "request", "command": "debugInfo"}, "integer seq"),
        ({"seq": 1, "type": "request", "command": "dumpCell", "arguments": []}, "arguments must be an object"),
        ({"seq": 1, "type": "request", "command": "dumpCell", "arguments": {"code": 5}}, "arguments.code"),
        ({"seq": 1, "type": "request", "command": "stackTrace", "arguments": {"threadId": 1}}, "no cell is stopped"),
        (
            {"seq": 1, "type": "request", "command": "richInspectVariables", "arguments": {"variableName": "x"}},
            REFUSED["richInspectVariables"],
        ),
        ({"seq": 1, "type": "request", "command": "copyToGlobals", "arguments": {}}, REFUSED["copyToGlobals"]),
    ],
)
def test_every_debug_request_gets_a_reply_saying_what_is_not_supported(
    kernels: dict[str, Any], content: Any, words: str
) -> None:
    reply = debug_request_content(kernels["cellbox"], content)
    assert reply["type"] == "response"
    assert reply["success"] is False
    assert words in reply["message"]


def test_without_debugpy_every_request_but_debug_info_says_how_to_get_it(tmp_path: Path) -> None:
    import asyncio

    from cellbox.kernel.debugger import Debugger

    debugger = Debugger(tmp_path, False, publish=lambda event: None, inspect=lambda: None)
    initialize = asyncio.run(debugger.handle({"seq": 1, "type": "request", "command": "initialize"}))
    info = asyncio.run(debugger.handle({"seq": 2, "type": "request", "command": "debugInfo"}))
    assert (initialize["success"], initialize["message"]) == (False, NO_DEBUGPY)
    assert info["success"] is True and info["body"]["isStarted"] is False


# ---------------------------------------------------------------------- a cell stopped at a breakpoint

STEPPED = "def double(n):\n    m = n * 2\n    return m\n\na = 20\nb = double(a)\nc = b + 2\n"
STEP_LINE = 6  # b = double(a)
# What the test does at each stop, in order (JupyterLab's step buttons).
ACTIONS = ["stepIn", "stepOut", "next", "continue"]
MODULES = "import sys\nprint('debugpy' in sys.modules, 'pydevd' in sys.modules)"
SOCKETS = (
    "import os\n"
    "print(sum(os.readlink(f'/proc/self/fd/{fd}').startswith('socket:') for fd in os.listdir('/proc/self/fd')))"
)
AFTER = (
    "import os, posix, sys, threading\n"
    "print(sys.gettrace() is None, os.fork is posix.fork, threading._trace_hook is None,\n"
    "      sys.breakpointhook is sys.__breakpointhook__, [t.name for t in threading.enumerate()], (a, b, c, kept))"
)


LIMITED = "%%limits wall=20\nx = 1\ny = x + 1\nprint(y)\n"


def _stopped_frame(kc: Any, event: dict[str, Any], seq: int) -> dict[str, Any]:
    """What JupyterLab asks at a stop (stackTrace, scopes, variables): the top frame and its local variables."""
    thread = event["body"]["threadId"]
    frames = debug_request(kc, "stackTrace", seq, threadId=thread)["body"]["stackFrames"]
    scopes = debug_request(kc, "scopes", seq + 1, frameId=frames[0]["id"])["body"]["scopes"]
    local = next(s for s in scopes if s["name"] == "Locals")
    listed = debug_request(kc, "variables", seq + 2, variablesReference=local["variablesReference"])
    return {
        "name": frames[0]["name"],
        "line": frames[0]["line"],
        "path": frames[0]["source"]["path"],
        "locals": {v["name"]: v["value"] for v in listed["body"]["variables"]},
        "thread": thread,
    }


def _run_stepping(kc: Any, code: str, actions: list[str]) -> dict[str, Any]:
    stops: list[dict[str, Any]] = []
    replies: list[dict[str, Any]] = []
    todo = iter(actions)

    def during(msg: dict[str, Any]) -> None:
        if msg["msg_type"] != "debug_event" or msg["content"]["event"] != "stopped":
            return
        seq = 100 + 10 * len(stops)
        stops.append(_stopped_frame(kc, msg["content"], seq))
        action = next(todo, "continue")
        replies.append(debug_request(kc, action, seq + 5, threadId=stops[-1]["thread"]))

    result = execute(kc, code, during=during)
    events = [c["event"] for c in result.of("debug_event") if c["event"] in ("stopped", "continued")]
    return {"result": result, "stops": stops, "replies": replies, "events": events}


@pytest.fixture(scope="module")
def stepping(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """One session as a JupyterLab user debugs a cell: breakpoint, step in, out, over, continue; then without it."""
    folder = tmp_path_factory.mktemp("dap-steps")
    with running_kernel("cellbox", cwd=str(folder)) as (_, kc):
        record: dict[str, Any] = {"before": execute(kc, "kept = 'state'\n" + MODULES).stream()}
        record["sockets before"] = execute(kc, SOCKETS).stream()
        for seq, command in enumerate(("initialize", "attach", "configurationDone"), 1):
            debug_request(kc, command, seq, **(INITIALIZE if command == "initialize" else {}))
        record["started, no breakpoints"] = execute(kc, MODULES).stream()
        path = debug_request(kc, "dumpCell", 10, code=STEPPED)["body"]["sourcePath"]
        record["path"] = path
        record["set"] = debug_request(kc, "setBreakpoints", 11, source={"path": path}, breakpoints=[{"line": 6}])
        record["info"] = debug_request(kc, "debugInfo", 12)["body"]
        record.update(_run_stepping(kc, STEPPED, ACTIONS))
        debug_request(kc, "setBreakpoints", 13, source={"path": path}, breakpoints=[])
        # A cell with a %%limits line: the breakpoint's line and file are those of the whole cell, as shown.
        limited = debug_request(kc, "dumpCell", 14, code=LIMITED)["body"]["sourcePath"]
        record["limited path"] = limited
        debug_request(kc, "setBreakpoints", 15, source={"path": limited}, breakpoints=[{"line": 3}])
        record["limited"] = _run_stepping(kc, LIMITED, ["continue"])
        debug_request(kc, "setBreakpoints", 16, source={"path": limited}, breakpoints=[])
        record["after"] = execute(kc, AFTER)
        record["sockets after"] = execute(kc, SOCKETS).stream()
        yield record


def test_a_cell_without_breakpoints_never_imports_debugpy(stepping: dict[str, Any]) -> None:
    assert stepping["before"] == "False False\n"
    assert stepping["started, no breakpoints"] == "False False\n"


def test_set_breakpoints_is_kept_and_shown_by_debug_info(stepping: dict[str, Any]) -> None:
    assert stepping["set"]["success"] is True
    assert [b["line"] for b in stepping["set"]["body"]["breakpoints"]] == [STEP_LINE]
    assert stepping["info"]["breakpoints"] == [{"source": stepping["path"], "breakpoints": [{"line": STEP_LINE}]}]


def test_the_cell_stops_at_the_breakpoint_with_its_frame_and_variables(stepping: dict[str, Any]) -> None:
    first = stepping["stops"][0]
    assert (first["name"], first["line"], first["path"]) == ("<module>", STEP_LINE, stepping["path"])
    assert first["locals"]["a"] == "20"
    assert "b" not in first["locals"]  # the breakpoint's line has not run yet


def test_a_cell_with_a_limits_line_stops_at_its_breakpoint_as_shown(stepping: dict[str, Any]) -> None:
    limited = stepping["limited"]
    assert [(s["line"], s["path"]) for s in limited["stops"]] == [(3, stepping["limited path"])]
    assert limited["stops"][0]["locals"]["x"] == "1" and "y" not in limited["stops"][0]["locals"]
    assert limited["result"].status == "ok" and limited["result"].stream() == "2\n"


def test_step_in_out_and_over_stop_where_pdb_would(stepping: dict[str, Any]) -> None:
    into, out, over = stepping["stops"][1:4]
    assert (into["name"], into["line"], into["locals"]) == ("double", 2, {"n": "20"})
    assert out["name"] == "<module>" and out["line"] == STEP_LINE
    assert (over["name"], over["line"]) == ("<module>", STEP_LINE + 1)
    assert over["locals"]["b"] == "40"
    assert len(stepping["stops"]) == len(ACTIONS)
    assert [r["success"] for r in stepping["replies"]] == [True] * len(ACTIONS)
    assert [r["command"] for r in stepping["replies"]] == ACTIONS


def test_debug_events_reach_the_frontend_in_order(stepping: dict[str, Any]) -> None:
    assert stepping["events"] == ["stopped", "continued"] * len(ACTIONS)


def test_the_debugged_cell_finishes_and_the_next_cell_keeps_its_state_without_a_trace(
    stepping: dict[str, Any],
) -> None:
    assert stepping["result"].status == "ok"
    after = stepping["after"]
    assert after.status == "ok", after.traceback
    assert after.stream() == "True True True True ['MainThread'] (20, 40, 42, 'state')\n"
    assert stepping["sockets after"] == stepping["sockets before"]  # pydevd's socketpair is closed


# ---------------------------------------------------------------------- wall clock, interrupt, restart at a stop

WALL = 5.0  # the session's wall_time, seconds
STOPPED_FOR = WALL + 2.0  # seconds the test keeps the cell stopped at its breakpoint
HALTING = "t = 1\nt = 2\nt = 3\nprint(t)\n"


@pytest.fixture(scope="module")
def short_wall(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Any, str]]:
    """A session whose cells have a wall-clock limit of WALL seconds, its debugger started, a breakpoint set."""
    folder = tmp_path_factory.mktemp("dap-wall")
    with running_kernel("cellbox", cwd=str(folder), extra=[f"--CellboxKernel.wall_time={WALL}"]) as (km, kc):
        debug_request(kc, "initialize", 1, **INITIALIZE)
        debug_request(kc, "attach", 2)
        path = debug_request(kc, "dumpCell", 3, code=HALTING)["body"]["sourcePath"]
        yield km, kc, path


def _break_at_line_2(kc: Any, path: str) -> None:
    reply = debug_request(kc, "setBreakpoints", 4, source={"path": path}, breakpoints=[{"line": 2}])
    assert reply["success"] is True


@pytest.mark.slow
def test_time_stopped_at_a_breakpoint_is_off_the_wall_clock(short_wall: tuple[Any, Any, str]) -> None:
    import time

    _km, kc, path = short_wall
    _break_at_line_2(kc, path)

    def during(msg: dict[str, Any]) -> None:
        if msg["msg_type"] == "debug_event" and msg["content"]["event"] == "stopped":
            time.sleep(STOPPED_FOR)  # the user reads the variables panel
            debug_request(kc, "continue", 5, threadId=msg["content"]["body"]["threadId"])

    result = execute(kc, HALTING, during=during)
    assert result.status == "ok", result.traceback
    assert result.stream() == "3\n"
    assert result.metadata["cellbox"]["wall_time"] > WALL  # it was stopped longer than its limit, and not stopped


def test_a_cell_stopped_at_a_breakpoint_can_be_interrupted(short_wall: tuple[Any, Any, str]) -> None:
    km, kc, path = short_wall
    _break_at_line_2(kc, path)
    stops: list[int] = []

    def during(msg: dict[str, Any]) -> None:
        if msg["msg_type"] == "debug_event" and msg["content"]["event"] == "stopped":
            stops.append(msg["content"]["body"]["threadId"])
            km.interrupt_kernel()

    result = execute(kc, HALTING, during=during)
    assert len(stops) == 1
    assert (result.status, result.content["ename"]) == ("error", "KeyboardInterrupt")
    assert debug_request(kc, "debugInfo", 6)["body"]["stoppedThreads"] == []
    debug_request(kc, "setBreakpoints", 7, source={"path": path}, breakpoints=[])
    after = execute(kc, "import sys\nprint(t, sys.gettrace() is None)")
    assert after.stream() == "1 True\n"  # line 1 ran before the stop, and its state is kept


@pytest.mark.slow
def test_a_kernel_with_a_cell_stopped_at_a_breakpoint_restarts(tmp_path: Path) -> None:
    from queue import Empty

    with running_kernel("cellbox", cwd=str(tmp_path)) as (km, kc):
        debug_request(kc, "initialize", 1, **INITIALIZE)
        path = debug_request(kc, "dumpCell", 2, code=HALTING)["body"]["sourcePath"]
        _break_at_line_2(kc, path)
        kc.execute(HALTING)
        stopped = False
        while not stopped:
            try:
                msg = kc.get_iopub_msg(timeout=60)
            except Empty:
                break
            stopped = msg["msg_type"] == "debug_event" and msg["content"]["event"] == "stopped"
        assert stopped
        km.restart_kernel(now=False)
        kc.wait_for_ready(timeout=60)
        assert debug_request(kc, "debugInfo", 3)["body"]["isStarted"] is False
        assert execute(kc, "print(6 * 7)").stream() == "42\n"


# ---------------------------------------------------------------------- the variables panel between cells

DEFINED = "answer = 41\nword = 'forty-one'\nitems = [1, 2, 3]\n"
ODD = "class Loud:\n    def __repr__(self):\n        raise RuntimeError('no')\nloud = Loud()\nlong = 'x' * 100_000\n"


def _variables(kc: Any, seq: int) -> dict[str, dict[str, Any]]:
    reply = debug_request(kc, "inspectVariables", seq)
    assert reply["success"] is True, reply
    return {v["name"]: v for v in reply["body"]["variables"]}


def test_inspect_variables_between_cells_lists_the_namespace_as_ipykernel(kernels: dict[str, Any]) -> None:
    seen = {}
    for name in ("python3", "cellbox"):
        assert execute(kernels[name], DEFINED).status == "ok"
        seen[name] = _variables(kernels[name], 20)
    for variable in ("answer", "word", "items"):
        ipy, cbx = seen["python3"][variable], seen["cellbox"][variable]
        assert (cbx["value"], cbx["type"]) == (ipy["value"], ipy["type"]), variable
        assert cbx == {"name": variable, "value": ipy["value"], "type": ipy["type"], "variablesReference": 0}
    assert not {"In", "Out", "get_ipython", "exit", "_", "__name__"} & set(seen["cellbox"])


def test_inspect_variables_bounds_a_value_and_survives_a_repr_that_raises(kernels: dict[str, Any]) -> None:
    assert execute(kernels["cellbox"], ODD).status == "ok"
    listed = _variables(kernels["cellbox"], 22)
    assert listed["loud"]["value"] == "<repr raised RuntimeError>"
    assert listed["long"]["value"] == repr("x" * 100_000)[:1000]
    assert listed["long"]["type"] == "str"


def test_a_raised_exception_breakpoint_stops_the_cell_where_it_raises(short_wall: tuple[Any, Any, str]) -> None:
    _km, kc, path = short_wall
    debug_request(kc, "setBreakpoints", 30, source={"path": path}, breakpoints=[])
    assert debug_request(kc, "setExceptionBreakpoints", 31, filters=["raised"])["success"] is True
    stops: list[dict[str, Any]] = []

    def during(msg: dict[str, Any]) -> None:
        if msg["msg_type"] == "debug_event" and msg["content"]["event"] == "stopped":
            stops.append(_stopped_frame(kc, msg["content"], 40))
            stops[-1]["reason"] = msg["content"]["body"]["reason"]
            debug_request(kc, "continue", 45, threadId=stops[-1]["thread"])

    try:
        result = execute(kc, "n = 0\nr = 1 / n\n", during=during)
    finally:
        debug_request(kc, "setExceptionBreakpoints", 32, filters=[])
    assert (result.status, result.content["ename"]) == ("error", "ZeroDivisionError")
    assert [(s["reason"], s["line"], s["locals"].get("n")) for s in stops] == [("exception", 2, "0")]
