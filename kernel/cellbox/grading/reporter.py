"""The grader's pytest plugin: writes the evidence of one test run to the grader.

This file runs in the trusted test process (:mod:`cellbox.grading.trusted`),
which never imports or runs submission code: the submission runs in its own
sandboxed process, reached through :mod:`cellbox.grading.bridge`.  pytest loads
it explicitly (``-p cellbox.grading.reporter``, with plugin autoloading off).
It imports only the standard library and pytest.

Protocol: JSON lines on the sandbox's message channel (fd 3, named by
``CELLBOX_CHANNEL``); each line carries the run's nonce, which the grader
writes on the run's stdin and this plugin reads once, at import, before any
submission code is imported.  Events, in order::

    {"event": "start", "nonce": N, "pytest": "9.2.0"}
    {"event": "collect_error", "nonce": N, "nodeid": "...", "message": "..."}   (any number)
    {"event": "collected", "nonce": N, "nodeids": [...]}
    {"event": "started", "nonce": N, "nodeid": "..."}                            (per test)
    {"event": "report", "nonce": N, "nodeid": "...", "when": "call", "outcome": "passed",
     "duration": 0.01, "wasxfail": false, "message": "...", "output": "..."}    (per phase)
    {"event": "finished", "nonce": N, "nodeid": "..."}                           (per test)
    {"event": "imports", "nonce": N, "names": [...]}     (collection only: names the grader lacks)
    {"event": "missing_module", "nonce": N, "name": "numpy"}   (a test imported a module no one may serve)
    {"event": "runs", "nonce": N, "runs": [Outcome JSON of each submission process]}
    {"event": "finish", "nonce": N, "exitstatus": 0}

Paths below the tests' folder are written relative to it.  The grader's checks
(nonce, order, every collected test reported, exit status matching) catch a
crashed or killed test process and anything else writing on the channel.
"""

from __future__ import annotations

import json
import os
import re
import sys
from typing import Any

import pytest

MESSAGE_MAX = 4000  # characters of a failure message or of captured output sent per phase
NOTE_MARK = "in the submission's process:"  # begins the note carrying the submission's traceback (bridge.py)
RUN_OUTPUT_KEPT = 20_000  # characters of a submission process's stdout and stderr sent


def _read_nonce() -> str:
    # Read once, at import (before conftest and test modules are imported), then
    # stdin is left empty: the run's stdin carries nothing else.
    try:
        return sys.stdin.readline().strip()
    except (OSError, ValueError):
        return ""


def _channel_fd() -> int | None:
    spec = os.environ.get("CELLBOX_CHANNEL", "")
    try:
        return int(spec.split(",")[0])
    except ValueError:
        return None


_NONCE = _read_nonce()
_FD = _channel_fd()


def _send(event: str, **fields: Any) -> None:
    if _FD is None:
        return
    line = json.dumps({"event": event, "nonce": _NONCE, **fields}) + "\n"
    data = line.encode("utf-8", "replace")
    try:
        while data:
            written = os.write(_FD, data)
            data = data[written:]
    except OSError:
        pass  # the grader has stopped reading; the record stays incomplete


_ROOTS: list[str] = []  # folder prefixes taken out of messages (the tests' folder)


def _cut(text: str) -> str:
    for root in _ROOTS:
        text = text.replace(root, "")
    return text if len(text) <= MESSAGE_MAX else text[:MESSAGE_MAX] + "\n[... cut]"


def send_runs(runs: list[Any]) -> None:
    """Report the Outcome (JSON) of each submission process of this run; called once, before the session's end.

    Their stdout and stderr are cut to their last :data:`RUN_OUTPUT_KEPT` characters.
    """
    for run in runs:
        for name in ("stdout", "stderr"):
            if isinstance(run, dict) and len(str(run.get(name) or "")) > RUN_OUTPUT_KEPT:
                run[name] = "[... cut]\n" + str(run[name])[-RUN_OUTPUT_KEPT:]
    _send("runs", runs=runs)


def send_imports(names: list[str]) -> None:
    """Report the top-level names the tests imported that this Python lacks (only while collecting)."""
    _send("imports", names=names)


def send_missing_module(name: str) -> None:
    """Report that a test imported ``name``, which this Python lacks and the submission may not serve."""
    _send("missing_module", name=name)


def pytest_sessionstart(session: pytest.Session) -> None:
    _ROOTS[:] = [str(session.config.rootpath) + os.sep]
    _send("start", pytest=pytest.__version__)


def pytest_collectreport(report: pytest.CollectReport) -> None:
    if report.failed:
        text = str(report.longrepr) if report.longrepr else "collection failed"
        lines = [line for line in text.splitlines() if line.strip()]
        # The submission's own traceback is a note after the error line: the error line is the one to name.
        notes = [index for index, line in enumerate(lines) if NOTE_MARK in line]
        lines = lines[: notes[0]] if notes else lines
        last = re.sub(r"^E\s+", "", lines[-1]) if lines else text  # pytest's "E   " marks the error line
        _send("collect_error", nodeid=report.nodeid, message=_cut(last), detail=_cut(text))


def pytest_collection_finish(session: pytest.Session) -> None:
    _send("collected", nodeids=[item.nodeid for item in session.items])


def pytest_runtest_logstart(nodeid: str, location: Any) -> None:
    _send("started", nodeid=nodeid)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    message = report.longreprtext if report.failed or report.skipped else ""
    output = "".join(text for _name, text in report.sections if _name.startswith("Captured"))
    _send(
        "report",
        nodeid=report.nodeid,
        when=report.when,
        outcome=report.outcome,
        duration=round(float(report.duration), 6),
        wasxfail=hasattr(report, "wasxfail"),
        message=_cut(message),
        output=_cut(output),
    )


def pytest_runtest_logfinish(nodeid: str, location: Any) -> None:
    _send("finished", nodeid=nodeid)


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    _send("finish", exitstatus=int(exitstatus))
