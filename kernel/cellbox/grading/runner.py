"""Grade many submissions: a thread pool here, or tasks on a Dask cluster; resume; progress.

Every submission gets exactly one :class:`SubmissionResult`, whatever happens to
it.  Finished rows are written to ``results.json`` as they arrive (atomically),
so an interrupted grading run loses nothing, and ``--resume`` grades only the
submissions that have no row yet.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import os
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from .. import __version__
from ..sandbox.isolation import describe
from .results import SubmissionResult
from .submissions import Submission
from .task import GradeSettings, StopSwitch, Suite, TrustedServers, grade_safely
from .venvs import BaseLibrary

__all__ = ["GradingRun", "ResumeError", "load_results", "save_results", "RESULTS_FILE"]

RESULTS_FILE = "results.json"
SAVE_EVERY = 1.0  # seconds between rewrites of results.json while grading
OnResult = Callable[[SubmissionResult], None]


class ResumeError(ValueError):
    """An earlier ``results.json`` was made against other tests; one line, for the command line."""


def load_results(
    out: Path, tests: str | None = None, digests: dict[str, str] | None = None
) -> dict[str, SubmissionResult]:
    """The rows of an earlier ``results.json`` in ``out``, by id (empty when there is none).

    Rows this version cannot read are dropped, so they are graded again.

    Raises:
        ResumeError: ``tests`` is given and the earlier file names other tests,
            or ``digests`` (path -> SHA-256 of each instructor file) is given
            and a file changed, appeared or vanished since the earlier run.
    """
    path = out / RESULTS_FILE
    try:
        data = json.loads(path.read_text())
        rows = data["submissions"]
    except (OSError, ValueError, KeyError, TypeError):
        return {}
    again = "give another --out, or leave out --resume to grade everything again"
    if tests is not None and isinstance(data, dict) and data.get("tests") not in (None, tests):
        raise ResumeError(f"{path} was made with the tests in {data.get('tests')}, not {tests}; {again}")
    if digests is not None:
        changed = _changed_file(data.get("test_digests") if isinstance(data, dict) else None, digests)
        if changed:
            raise ResumeError(f"{path}: the instructor file {changed} changed since that run; {again}")
    results = {}
    for row in rows if isinstance(rows, list) else []:
        try:
            result = SubmissionResult.from_json(row)
        except (KeyError, ValueError, TypeError):
            continue
        results[result.id] = result
    return results


def save_results(out: Path, results: Iterable[SubmissionResult], header: dict[str, Any]) -> Path:
    """Write ``results.json`` atomically (a temporary file, then a rename)."""
    path = out / RESULTS_FILE
    data = {**header, "submissions": [result.to_json() for result in sorted(results, key=lambda r: r.id)]}
    temporary = path.with_name(f".{RESULTS_FILE}.{os.getpid()}.tmp")
    temporary.write_text(json.dumps(data, indent=1))
    os.replace(temporary, path)
    return path


def _changed_file(before: Any, now: dict[str, str]) -> str | None:
    """The first instructor file whose digest differs between ``before`` (from results.json) and ``now``."""
    if not isinstance(before, dict):
        return "list (the earlier run kept no file digests)"
    for name in sorted(set(before) | set(now)):
        if before.get(name) != now.get(name):
            return name
    return None


@dataclasses.dataclass
class GradingRun:
    """One ``cellbox grade`` run.

    Attributes:
        submissions: what to grade.
        suite: the instructor tests.
        settings: limits and install options.
        out: the reports folder (``results.json`` is kept up to date there).
        jobs: submissions graded at once on this machine.
        dask: address of a ``dask.distributed`` scheduler (``tls://``), ``"local"`` for a cluster of
            ``jobs`` worker processes started for this run, or ``None`` for local threads.
        resume: keep rows of an earlier ``results.json`` and grade only the rest.
    """

    submissions: list[Submission]
    suite: Suite
    settings: GradeSettings
    out: Path
    jobs: int = os.cpu_count() or 1
    dask: str | None = None
    resume: bool = False

    def header(self) -> dict[str, Any]:
        return {
            "cellbox": __version__,
            "tests": str(self.suite.root),
            "test_files": list(self.suite.files),
            "test_digests": self.suite.digests,
            "limits": self.settings.limits.as_dict(),
            "isolation": describe(self.settings.isolation),
        }

    def pending(self, done: dict[str, SubmissionResult]) -> list[Submission]:
        """The submissions without a row in ``done``."""
        return [submission for submission in self.submissions if submission.id not in done]

    def grade(
        self, on_result: OnResult | None = None, on_start: Callable[[int], None] | None = None
    ) -> list[SubmissionResult]:
        """Grade what is pending and return every row, by id.

        ``results.json`` is rewritten as rows arrive (at most every
        :data:`SAVE_EVERY` seconds, so a large class does not rewrite it per
        row) and always at the end, also when interrupted.

        Args:
            on_result: called in this thread with each new row (progress display).
            on_start: called once with the number of submissions left to grade.
        """
        self.out.mkdir(parents=True, exist_ok=True)
        wanted = {submission.id for submission in self.submissions}
        earlier = load_results(self.out, str(self.suite.root), self.suite.digests) if self.resume else {}
        done = {key: row for key, row in earlier.items() if key in wanted}
        saved_at = time.monotonic()

        def record(result: SubmissionResult) -> None:
            nonlocal saved_at
            done[result.id] = result
            if time.monotonic() - saved_at >= SAVE_EVERY:
                save_results(self.out, done.values(), self.header())
                saved_at = time.monotonic()
            if on_result is not None:
                on_result(result)

        todo = self.pending(done)
        if on_start is not None:
            on_start(len(todo))
        try:
            if todo and self.dask:
                from .cluster import grade_on_cluster

                grade_on_cluster(self.dask, todo, self.suite, self.settings, record, workers=self.jobs)
            elif todo:
                self._grade_locally(todo, record)
        finally:
            save_results(self.out, done.values(), self.header())
        return [done[submission.id] for submission in sorted(self.submissions, key=lambda s: s.id)]

    def _grade_locally(self, todo: list[Submission], record: OnResult) -> None:
        """A thread pool of ``jobs`` workers; on Ctrl-C every run in progress is killed and nothing more recorded."""
        with BaseLibrary.build() as base, TrustedServers(self.jobs) as servers:
            switch = StopSwitch(servers)
            with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, self.jobs)) as pool:
                futures = [pool.submit(grade_safely, sub, self.suite, self.settings, base, switch) for sub in todo]
                try:
                    for future in concurrent.futures.as_completed(futures):
                        record(future.result())
                except BaseException:
                    # Rows of killed runs are never recorded: --resume grades them again.
                    switch.stop()
                    for future in futures:
                        future.cancel()
                    raise


def print_summary(results: list[SubmissionResult], stream: Any = None) -> None:
    """The verdict counts on one line, and on the next how the reports count tests (their columns say the rest)."""
    stream = stream or sys.stderr
    counts: dict[str, int] = {}
    for result in results:
        counts[result.verdict.label] = counts.get(result.verdict.label, 0) + 1
    print(", ".join(f"{label}: {n}" for label, n in sorted(counts.items())), file=stream)
    tests = max((result.total for result in results), default=0)
    noun = "test" if tests == 1 else "tests"
    print(
        f"counts: {tests} instructor {noun} per submission, each counted once as pytest reports it "
        "(what each column means: report.html, or docs/grading.md)",
        file=stream,
    )
