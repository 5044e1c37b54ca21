"""The result of grading one submission, and its JSON form (a row of ``results.json``)."""

from __future__ import annotations

import dataclasses
from typing import Any

from ..verdict import Verdict
from .evidence import TestResult

__all__ = ["SubmissionResult", "OUTPUT_KEPT"]

OUTPUT_KEPT = 20_000  # characters of a run's stdout and of its stderr kept in results.json (the end)


def cut_outcome(outcome: dict[str, Any] | None) -> dict[str, Any] | None:
    """An Outcome's JSON with stdout and stderr cut to their last :data:`OUTPUT_KEPT` characters."""
    if outcome is None:
        return None
    data = dict(outcome)
    for name in ("stdout", "stderr"):
        text = str(data.get(name) or "")
        if len(text) > OUTPUT_KEPT:
            data[name] = "[... cut]\n" + text[-OUTPUT_KEPT:]
    return data


@dataclasses.dataclass
class SubmissionResult:
    """One submission's row in every report.

    Attributes:
        id: the submission's id (``alice``).
        path: where it was read from.
        kind: ``folder``, ``zip``, ``py`` or ``ipynb``.
        verdict: the :class:`~cellbox.verdict.Verdict`.
        reason: one line saying why.
        tests: one :class:`TestResult` per collected instructor test.
        running: the test that was running when the run ended, if any.
        install: the install's Outcome as JSON (``None`` when nothing was installed).
        run: the trusted test process's Outcome as JSON (``None`` when it never started).
        submission_runs: the Outcome (JSON) of each process the submission's
            code ran in: one, plus one more after each timeout or crash.
        duration: seconds spent grading this submission, all steps.
    """

    id: str
    path: str
    kind: str
    verdict: Verdict
    reason: str
    tests: list[TestResult] = dataclasses.field(default_factory=list)
    running: str | None = None
    install: dict[str, Any] | None = None
    run: dict[str, Any] | None = None
    submission_runs: list[dict[str, Any] | None] = dataclasses.field(default_factory=list)
    duration: float = 0.0

    def count(self, outcome: str) -> int:
        """How many tests ended with exactly ``outcome``."""
        return sum(1 for test in self.tests if test.outcome == outcome)

    def fill_tests(self, expected: tuple[str, ...]) -> None:
        """Give a row without test results (the run never started) one ``not run`` entry per instructor test."""
        if not self.tests:
            self.tests = [TestResult(nodeid=nodeid) for nodeid in expected]

    @property
    def passed(self) -> int:
        """Tests that passed, an unexpected pass (``xpassed``, not strict) included."""
        return self.count("passed") + self.count("xpassed")

    @property
    def failed(self) -> int:
        """Tests whose call failed (a strict ``xpass`` included, as pytest reports it)."""
        return self.count("failed")

    @property
    def errors(self) -> int:
        """Tests with an error in a fixture (setup or teardown), once each."""
        return self.count("error")

    @property
    def skipped(self) -> int:
        """Tests skipped or failing as expected (``xfailed``): pytest counts neither as a failure."""
        return self.count("skipped") + self.count("xfailed")

    @property
    def not_run(self) -> int:
        """Tests that never finished: running when the run ended, or never reached (not collected, never started)."""
        return self.count("running") + self.count("not run")

    @property
    def total(self) -> int:
        """The instructor tests, each once: ``passed + failed + errors + skipped + not_run``."""
        return len(self.tests)

    @property
    def verdict_entry(self) -> bool:
        """Whether ``junit.xml`` carries one ``grading.verdict`` test case for this row (an error).

        A run that is ``unverified`` or ``timed_out``, or has no test, gets it,
        so that Jenkins never shows such a suite as passing.  It is not an
        instructor test: no other count includes it.
        """
        return self.verdict in (Verdict.UNVERIFIED, Verdict.TIMED_OUT) or not self.tests

    @property
    def score(self) -> float:
        """Percent of the scored tests that passed, 0-100: ``passed / (total - skipped)``.

        Skipped and ``xfailed`` tests are not scored, as pytest does not count
        them against a run.  0 unless the verdict is ``verified`` or ``failed``:
        a run without complete evidence (``unverified``, ``timed_out``) earns
        nothing, its passes cannot be trusted.
        """
        scored = self.total - self.skipped
        if self.verdict not in (Verdict.VERIFIED, Verdict.FAILED) or scored <= 0:
            return 0.0
        return round(100.0 * self.passed / scored, 2)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict: the fields, the counts and the score."""
        return {
            "id": self.id,
            "path": self.path,
            "kind": self.kind,
            "verdict": self.verdict.value,
            "label": self.verdict.label,
            "reason": self.reason,
            "passed": self.passed,
            "failed": self.failed,
            "errors": self.errors,
            "skipped": self.skipped,
            "not_run": self.not_run,
            "total": self.total,
            "score": self.score,
            "running": self.running,
            "duration": round(self.duration, 4),
            "tests": [test.to_json() for test in self.tests],
            "install": cut_outcome(self.install),
            "run": cut_outcome(self.run),
            "submission_runs": [cut_outcome(run) for run in self.submission_runs],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SubmissionResult:
        """Read a row back (``--resume``).

        Raises:
            KeyError, ValueError: the row is not one this version wrote.
        """
        return cls(
            id=str(data["id"]),
            path=str(data["path"]),
            kind=str(data["kind"]),
            verdict=Verdict(data["verdict"]),
            reason=str(data["reason"]),
            tests=[TestResult.from_json(test) for test in data.get("tests", [])],
            running=data.get("running"),
            install=data.get("install"),
            run=data.get("run"),
            submission_runs=list(data.get("submission_runs") or []),
            duration=float(data.get("duration", 0.0)),
        )
