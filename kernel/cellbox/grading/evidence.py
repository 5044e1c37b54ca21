"""Read the grader's reporter messages into :class:`~cellbox.verdict.Evidence` and per-test results.

Grader side of the protocol in :mod:`cellbox.grading.reporter`.  The recorder is
fed each JSON message from the sandbox's channel (``on_message``, called in the
thread that waits for the run), checks it against the run's nonce and the
order of events, and keeps one :class:`TestResult` per test.  It never trusts a
message it cannot place: anything out of order becomes a *problem*, and any
problem keeps the run from being ``verified``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ..verdict import Evidence

__all__ = ["EvidenceRecorder", "TestResult", "PROBLEMS_KEPT"]

PROBLEMS_KEPT = 20
RUNS_KEPT = 50  # submission processes reported per run (one, plus one per restart)
OUTPUT_KEPT = 4000  # characters of failure message and output kept per test


@dataclasses.dataclass
class TestResult:
    """One instructor test in one submission's run.

    Attributes:
        nodeid: pytest's node id, relative to the tests folder (``test_fib.py::test_base``).
        outcome: ``passed``, ``failed``, ``error``, ``skipped``, ``xfailed``,
            ``xpassed``, or ``running``/``not run`` when it never finished.
        duration: seconds spent in setup, call and teardown together.
        message: the failure or skip message, cut to a limit.
        output: captured stdout/stderr/log of the test, cut to a limit.
    """

    nodeid: str
    outcome: str = "not run"
    duration: float = 0.0
    message: str = ""
    output: str = ""

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TestResult:
        return cls(**{field.name: data[field.name] for field in dataclasses.fields(cls) if field.name in data})


def _final_outcome(phases: dict[str, dict[str, Any]]) -> str:
    """One outcome per test from its setup, call and teardown reports, as pytest's summary names them.

    pytest counts reports, not tests: a test that passes and then fails in
    teardown is ``1 passed, 1 error`` in its summary line.  Here each test gets
    one outcome: ``error`` when a fixture failed in setup, ``failed`` when the
    call failed (a strict ``xpass`` included: pytest reports it as failed),
    ``error`` when only the teardown failed, ``xfailed``/``skipped`` for a skip
    (pytest marks an expected failure with ``wasxfail``, in any phase), and
    ``xpassed``/``passed`` for a call that passed.
    """
    setup, call, teardown = (phases.get(when, {}) for when in ("setup", "call", "teardown"))
    if setup.get("outcome") == "failed":
        return "error"
    if setup.get("outcome") == "skipped":
        return "xfailed" if setup.get("wasxfail") else "skipped"
    if not call:
        return "error"
    if call.get("outcome") == "failed":
        return "failed"
    if teardown.get("outcome") == "failed":
        return "error"
    if call.get("outcome") == "skipped":
        return "xfailed" if call.get("wasxfail") else "skipped"
    if call.get("outcome") == "passed":
        return "xpassed" if call.get("wasxfail") else "passed"
    return "error"


class EvidenceRecorder:
    """Collects one run's reporter messages; see :mod:`cellbox.grading.reporter` for the protocol.

    Args:
        nonce: the secret of this run, written to the run's stdin.
        expected: the node ids pytest collected from the instructor tests once,
            without a submission (:func:`cellbox.grading.task.collect_tests`);
            each must be collected, and nothing else may be.  ``None`` while
            that first collection runs.
    """

    def __init__(self, nonce: str, expected: tuple[str, ...] | None) -> None:
        self.nonce = nonce
        self.order = tuple(expected or ())
        self.expected = frozenset(expected) if expected is not None else None
        self.runs: list[dict[str, Any] | None] = []
        self.started = False
        self.finished = False
        self.exit_status: int | None = None
        self.collected: tuple[str, ...] | None = None
        self.collect_errors: list[str] = []
        self.phases: dict[str, dict[str, dict[str, Any]]] = {}
        self.done: list[str] = []
        self.running: str | None = None
        self.problems: list[str] = []
        self.imports: tuple[str, ...] = ()  # while collecting: top-level names the grader's Python lacks
        self.missing_modules: list[str] = []  # names a test imported that no one may serve

    def _problem(self, text: str) -> None:
        if len(self.problems) < PROBLEMS_KEPT:
            self.problems.append(text)

    def feed(self, message: Any) -> None:
        """Take one message from the channel (any JSON value; only well-formed ones count)."""
        if not isinstance(message, dict) or message.get("nonce") != self.nonce:
            self._problem("a message without this run's nonce arrived on the channel")
            return
        event = message.get("event")
        if event == "start":
            if self.started:
                self._problem("a second session start")
            self.started = True
            return
        if not self.started or self.finished:
            self._problem(f"a {event!r} message outside the session")
            return
        handler = getattr(self, f"_on_{event}", None)
        if handler is None:
            self._problem(f"an unknown event {event!r}")
            return
        handler(message)

    def _on_collect_error(self, message: dict[str, Any]) -> None:
        self.collect_errors.append(f"{message.get('nodeid')}: {message.get('message')}")

    def _on_collected(self, message: dict[str, Any]) -> None:
        nodeids = message.get("nodeids")
        if self.collected is not None or not isinstance(nodeids, list):
            self._problem("a second or malformed list of collected tests")
            return
        self.collected = tuple(str(nodeid) for nodeid in nodeids)
        if len(set(self.collected)) != len(self.collected):
            self._problem("the same test was collected twice")
        for nodeid in self.collected:
            if self.expected is not None and nodeid not in self.expected:
                self._problem(f"{nodeid} is not a test collected from the instructor's files")
                break

    def _known(self, message: dict[str, Any]) -> str | None:
        nodeid = message.get("nodeid")
        if self.collected is None or nodeid not in self.collected:
            self._problem(f"a report for {nodeid!r}, which was not collected")
            return None
        return str(nodeid)

    def _on_started(self, message: dict[str, Any]) -> None:
        nodeid = self._known(message)
        if nodeid is None:
            return
        if nodeid in self.phases or self.running is not None:
            self._problem(f"{nodeid} started twice or while another test was running")
        self.phases.setdefault(nodeid, {})
        self.running = nodeid

    def _on_report(self, message: dict[str, Any]) -> None:
        nodeid = self._known(message)
        when = message.get("when")
        if nodeid is None:
            return
        if nodeid != self.running or when not in ("setup", "call", "teardown") or when in self.phases[nodeid]:
            self._problem(f"an out-of-order {when!r} report for {nodeid}")
            return
        self.phases[nodeid][str(when)] = message

    def _on_finished(self, message: dict[str, Any]) -> None:
        nodeid = self._known(message)
        if nodeid is None:
            return
        if nodeid != self.running:
            self._problem(f"{nodeid} finished without starting")
            return
        self.running = None
        self.done.append(nodeid)

    def _on_imports(self, message: dict[str, Any]) -> None:
        names = message.get("names")
        if isinstance(names, list):
            self.imports = tuple(str(name) for name in names[:1000])

    def _on_missing_module(self, message: dict[str, Any]) -> None:
        name = str(message.get("name"))
        if name not in self.missing_modules and len(self.missing_modules) < PROBLEMS_KEPT:
            self.missing_modules.append(name)

    def _on_runs(self, message: dict[str, Any]) -> None:
        runs = message.get("runs")
        if isinstance(runs, list):
            self.runs = [run if isinstance(run, dict) else None for run in runs[:RUNS_KEPT]]

    def _on_finish(self, message: dict[str, Any]) -> None:
        status = message.get("exitstatus")
        self.exit_status = status if isinstance(status, int) else None
        self.finished = True

    # ------------------------------------------------------------------ results

    def check_files(self, before: dict[str, str], after: dict[str, str]) -> None:
        """Note every instructor file (path -> sha256) that changed, appeared or vanished during the run."""
        for name in sorted(set(before) | set(after)):
            if before.get(name) != after.get(name):
                self._problem(f"the instructor file {name} was changed during the run")

    def outcomes(self) -> dict[str, str]:
        """node id -> final outcome, for every test that finished."""
        return {nodeid: _final_outcome(self.phases[nodeid]) for nodeid in self.done}

    def evidence(self) -> Evidence:
        """The record so far, for :func:`cellbox.verdict.judge`."""
        collected = set(self.collected or ())
        missing = tuple(sorted((self.expected or frozenset()) - collected))
        return Evidence(
            started=self.started,
            collected=self.collected,
            outcomes=self.outcomes(),
            finished=self.finished,
            exit_status=self.exit_status,
            running=self.running,
            collect_errors=tuple(self.collect_errors),
            problems=tuple(self.problems),
            missing_tests=missing if self.collected is not None else (),
        )

    def tests(self) -> list[TestResult]:
        """One :class:`TestResult` per instructor test (in the order of the first collection), each once.

        A test this run did not collect or never finished is ``not run`` (or
        ``running``, the one it was in when the run ended).  During the first
        collection (no expected tests) it is one per collected test.
        """
        outcomes = self.outcomes()
        results = []
        for nodeid in self.order or self.collected or ():
            phases = self.phases.get(nodeid, {})
            outcome = outcomes.get(nodeid, "running" if nodeid == self.running else "not run")
            message = "\n".join(str(report.get("message") or "") for report in phases.values()).strip()
            output = "".join(str(report.get("output") or "") for report in phases.values())
            results.append(
                TestResult(
                    nodeid=nodeid,
                    outcome=outcome,
                    duration=round(sum(float(report.get("duration") or 0.0) for report in phases.values()), 6),
                    message=message[:OUTPUT_KEPT],
                    output=output[:OUTPUT_KEPT],
                )
            )
        return results
