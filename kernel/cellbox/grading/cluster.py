"""Grade submissions as tasks on an existing ``dask.distributed`` cluster (``--dask ADDRESS``).

Each submission is one task running :func:`grade_on_worker`: the same
:func:`~cellbox.grading.task.grade_safely` as local grading, in the worker's
process, with a base library built once per worker process.  Workers need
cellbox installed and must see the submissions and tests at the same paths
(a shared filesystem).  Arguments and results travel as JSON-ready dicts, so
the client never unpickles anything but plain data it sent out itself.

A task whose worker dies, or that the cluster fails, becomes that
submission's ``unverified`` row with the reason.
"""

from __future__ import annotations

import atexit
import threading
from collections.abc import Callable
from typing import Any

from ..verdict import Verdict
from .results import SubmissionResult
from .submissions import Submission
from .task import GradeSettings, Suite, grade_safely
from .venvs import BaseLibrary

__all__ = ["grade_on_cluster", "grade_on_worker", "ClusterError", "CONNECT_TIMEOUT"]

CONNECT_TIMEOUT = "10s"  # how long to try reaching the scheduler


class ClusterError(OSError):
    """The Dask scheduler could not be reached; the message is one line."""


_base_lock = threading.Lock()
_bases: list[BaseLibrary] = []  # at most one per worker process, removed at its exit


def _worker_base() -> BaseLibrary:
    with _base_lock:
        if not _bases:
            _bases.append(BaseLibrary.build())
            atexit.register(_bases[0].remove)
        return _bases[0]


def grade_on_worker(submission: dict[str, Any], suite: dict[str, Any], settings: dict[str, Any]) -> dict[str, Any]:
    """The Dask task: grade one submission on this worker; JSON in, JSON out."""
    result = grade_safely(
        Submission(**submission), Suite.from_json(suite), GradeSettings.from_json(settings), _worker_base()
    )
    return result.to_json()


def grade_on_cluster(
    address: str,
    todo: list[Submission],
    suite: Suite,
    settings: GradeSettings,
    record: Callable[[SubmissionResult], None],
) -> None:
    """Submit one task per submission to the scheduler at ``address``; ``record`` each row as it comes.

    Raises:
        ClusterError: the scheduler cannot be reached within :data:`CONNECT_TIMEOUT`.
    """
    from distributed import Client, as_completed

    try:
        client = Client(address, set_as_default=False, timeout=CONNECT_TIMEOUT)
    except (OSError, ValueError) as exc:
        first = (str(exc).splitlines() or [type(exc).__name__])[0]
        raise ClusterError(f"cannot reach the dask scheduler at {address} ({first})") from None
    with client:
        futures = {
            client.submit(
                grade_on_worker,
                {"id": sub.id, "path": sub.path, "kind": sub.kind},
                suite.to_json(),
                settings.to_json(),
                pure=False,
                key=f"cellbox-grade-{sub.id}-{index}",
            ): sub
            for index, sub in enumerate(todo)
        }
        for future in as_completed(futures, loop=client.loop):
            submission = futures[future]
            try:
                result = SubmissionResult.from_json(future.result())
            except Exception as exc:  # noqa: BLE001 - a lost task is that submission's row
                first = (str(exc).splitlines() or [""])[0]
                result = SubmissionResult(
                    id=submission.id,
                    path=submission.path,
                    kind=submission.kind,
                    verdict=Verdict.UNVERIFIED,
                    reason=f"grader error on the cluster: {type(exc).__name__}: {first}",
                )
                result.fill_tests(suite.expected)
            record(result)
