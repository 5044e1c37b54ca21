"""The verdict of a test run: ``verified``, ``failed``, ``unverified`` or ``timed_out``.

pytest's exit status 0 is necessary and not sufficient (design.md, "Verdict").
A run is ``verified`` only with positive :class:`Evidence`, written by a
reporter the grader owns and tied to a per-run nonce, that every collected
instructor test ran in this run, none failed (pytest's count: ``xfail``, ``skip``
and a non-strict ``xpass`` do not fail a run) and one passed.  Exit 1 with complete evidence of
failures is ``failed``.  Exit 2 to 6 (pytest's ``ExitCode``: interrupted or a
collection error, internal error, usage error, nothing collected), missing or
inconsistent evidence, or an early exit are ``unverified``.  The wall deadline
is ``timed_out``.

Values and labels are the design's exact words; compare them by equality, and
choose colours by exact value (:data:`STYLES`, :data:`COLOURS`), never by a
substring test: ``"VERIFIED" in "TESTS UNVERIFIED"`` is true.

This module imports nothing from pytest: the grader's reporter
(:mod:`cellbox.grading.reporter`) writes the evidence, and
:mod:`cellbox.grading.evidence` reads it into an :class:`Evidence`.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from typing import NamedTuple

from .sandbox.limits import format_time
from .sandbox.outcome import Outcome, Status

__all__ = [
    "Verdict",
    "LABELS",
    "STYLES",
    "COLOURS",
    "PYTEST_EXIT_CODES",
    "Evidence",
    "Judgement",
    "judge",
    "verdict_for",
]


class Verdict(enum.StrEnum):
    """The verdict of one test run; the value is the exact string of JSON, CSV and reports."""

    VERIFIED = "verified"
    FAILED = "failed"
    UNVERIFIED = "unverified"
    TIMED_OUT = "timed_out"

    def __str__(self) -> str:
        return self.value

    @property
    def label(self) -> str:
        """The label for people, for example ``TESTS UNVERIFIED``."""
        return LABELS[self]

    @property
    def success(self) -> bool:
        """``True`` only for ``verified``: the one verdict ever shown as success."""
        return self is Verdict.VERIFIED


LABELS: dict[Verdict, str] = {
    Verdict.VERIFIED: "TESTS VERIFIED",
    Verdict.FAILED: "TESTS FAILED",
    Verdict.UNVERIFIED: "TESTS UNVERIFIED",
    Verdict.TIMED_OUT: "TESTS TIMED OUT",
}

# rich styles for terminals, keyed by the enum itself so that a lookup is an
# exact match; only ``verified`` is green.
STYLES: dict[Verdict, str] = {
    Verdict.VERIFIED: "bold green",
    Verdict.FAILED: "bold red",
    Verdict.UNVERIFIED: "bold yellow",
    Verdict.TIMED_OUT: "bold magenta",
}

# Colours for HTML reports (CSS hex), same rule.
COLOURS: dict[Verdict, str] = {
    Verdict.VERIFIED: "#1a7f37",
    Verdict.FAILED: "#cf222e",
    Verdict.UNVERIFIED: "#9a6700",
    Verdict.TIMED_OUT: "#8250df",
}

# pytest's exit codes (``pytest.ExitCode``, docs: "Exit codes").
PYTEST_EXIT_CODES: dict[int, str] = {
    0: "all tests passed",
    1: "some tests failed",
    2: "test run interrupted or a collection error",
    3: "internal pytest error",
    4: "pytest usage error",
    5: "no tests were collected",
    6: "no tests ran",
}


@dataclasses.dataclass(frozen=True)
class Evidence:
    """What the grader's reporter said about one pytest run, read over the grader's channel.

    Only messages that carried this run's nonce count.  Built by
    :class:`cellbox.grading.evidence.EvidenceRecorder`.

    Attributes:
        started: a session-start message with this run's nonce arrived first.
        collected: node ids of the collected tests, or ``None`` when collection
            never finished.
        outcomes: node id -> final outcome (``passed``, ``failed``, ``error``,
            ``skipped``, ``xfailed``, ``xpassed``) for every test that finished.
        finished: a session-finish message arrived.
        exit_status: the exit status the reporter saw at session finish.
        running: the node id of a test that started and never finished, if any.
        collect_errors: one line per file that failed to collect.
        problems: inconsistencies (a foreign nonce, a duplicate, an unknown node
            id); any problem means the record cannot be trusted.
        missing_tests: instructor tests (``file::name``, as written in the
            test files) that were not collected.
    """

    started: bool = False
    collected: tuple[str, ...] | None = None
    outcomes: Mapping[str, str] = dataclasses.field(default_factory=dict)
    finished: bool = False
    exit_status: int | None = None
    running: str | None = None
    collect_errors: tuple[str, ...] = ()
    problems: tuple[str, ...] = ()
    missing_tests: tuple[str, ...] = ()

    def count(self, outcome: str) -> int:
        """How many tests finished with ``outcome`` (exact string)."""
        return sum(1 for value in self.outcomes.values() if value == outcome)

    def gap(self, exit_code: int | None) -> str | None:
        """Why this record is not a complete, consistent account of a run, or ``None``.

        Args:
            exit_code: the exit status of the pytest process.
        """
        if not self.started:
            return "the grader's reporter never started: the run ended before pytest was configured"
        if self.problems:
            return f"the test record is inconsistent: {self.problems[0]}"
        if self.collected is None:
            return "pytest never finished collecting the tests"
        if not self.collected:
            return "no instructor test was collected"
        if self.missing_tests:
            return f"{len(self.missing_tests)} instructor tests were not collected (first: {self.missing_tests[0]})"
        missing = [nodeid for nodeid in self.collected if nodeid not in self.outcomes]
        if missing:
            return f"{len(missing)} of {len(self.collected)} tests never reported a result (first: {missing[0]})"
        if not self.finished:
            return "pytest never finished the session (an early exit)"
        if self.exit_status != exit_code:
            return f"pytest exited with {exit_code}, but its session finished with {self.exit_status}"
        return None


class Judgement(NamedTuple):
    """A verdict and the one-line reason for it."""

    verdict: Verdict
    reason: str


def judge(exit_code: int | None, evidence: Evidence, outcome: Outcome) -> Judgement:
    """Decide the verdict of one pytest run, with a one-line reason.

    Args:
        exit_code: pytest's exit status (``outcome.exit_code``; ``None`` when a
            signal ended it).
        evidence: what the grader's reporter wrote during the run.
        outcome: the sandbox's :class:`~cellbox.sandbox.outcome.Outcome` of the run.

    Order: the wall deadline first (``timed_out``, naming the running test),
    then any other way the sandbox stopped the run, then pytest's exit status,
    then the evidence.  Only exit 0 with complete evidence that no collected
    test failed or errored, and one passed, is ``verified`` (pytest's own
    rule: ``skipped``, ``xfailed`` and ``xpassed`` keep a run green).
    """
    if outcome.status is Status.TIMED_OUT:
        where = f" while running {evidence.running}" if evidence.running else ""
        wall = outcome.limits.get("wall_time")
        limit = f" of {format_time(float(wall))}" if isinstance(wall, (int, float)) else ""
        return Judgement(Verdict.TIMED_OUT, f"wall time limit{limit} reached{where}")
    if outcome.status not in (Status.OK, Status.ERROR):
        ended = f" ({outcome.signal})" if outcome.signal else ""
        return Judgement(Verdict.UNVERIFIED, f"the test run ended with status {outcome.status.value}{ended}")
    if exit_code not in (0, 1):
        meaning = PYTEST_EXIT_CODES.get(exit_code, "not an exit status of pytest") if exit_code is not None else ""
        detail = f": {evidence.collect_errors[0]}" if evidence.collect_errors else ""
        return Judgement(Verdict.UNVERIFIED, f"pytest exit {exit_code} ({meaning}){detail}")
    gap = evidence.gap(exit_code)
    if gap is not None:
        return Judgement(Verdict.UNVERIFIED, gap)
    return _judge_outcomes(exit_code, evidence)


# Outcomes pytest does not count as a failure of the run (exit status 0), and those it does (exit status 1).
GREEN_OUTCOMES = ("passed", "xpassed", "skipped", "xfailed")
RED_OUTCOMES = ("failed", "error")


def _judge_outcomes(exit_code: int | None, evidence: Evidence) -> Judgement:
    """The verdict of a complete record: pytest's own rule (a run is red only for a failure or an error).

    ``xfail``, ``skip`` and a non-strict ``xpass`` keep a run green, as in
    pytest; a strict ``xpass`` arrives as ``failed``.  ``verified`` also needs
    one test that passed: a run of skips alone is no evidence.
    """
    total = len(evidence.outcomes)
    passed = evidence.count("passed") + evidence.count("xpassed")
    failing = sum(evidence.count(name) for name in RED_OUTCOMES)
    summary = ", ".join(
        f"{evidence.count(name)} {name}"
        for name in ("failed", "error", "skipped", "xfailed", "xpassed")
        if evidence.count(name)
    )
    counted = f" ({summary})" if summary else ""
    if failing:
        if exit_code == 0:
            return Judgement(Verdict.UNVERIFIED, f"pytest exited with 0, yet {failing} tests reported failed")
        return Judgement(Verdict.FAILED, f"{passed} of {total} tests passed{counted}")
    if exit_code != 0:
        return Judgement(Verdict.UNVERIFIED, f"pytest exited with {exit_code}, yet no test reported a failure")
    if not passed:
        return Judgement(Verdict.UNVERIFIED, f"no instructor test passed{counted}")
    if passed == total:
        return Judgement(Verdict.VERIFIED, f"all {total} tests passed")
    return Judgement(Verdict.VERIFIED, f"{passed} of {total} tests passed, none failed{counted}")


def verdict_for(exit_code: int | None, evidence: Evidence, outcome: Outcome) -> Verdict:
    """The :class:`Verdict` of :func:`judge`, without the reason."""
    return judge(exit_code, evidence, outcome).verdict
