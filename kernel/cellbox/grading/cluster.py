"""Grade submissions as tasks on a ``dask.distributed`` cluster (``--dask ADDRESS`` or ``--dask local``).

Each submission is one task running :func:`grade_on_worker`: the same
:func:`~cellbox.grading.task.grade_safely` as local grading, in the worker's
process, with a base library built once per worker process.  Workers need
cellbox installed and must see the submissions and tests at the same paths
(a shared filesystem).  Arguments and results travel as JSON-ready dicts, so
the client never unpickles anything but plain data it sent out itself.

A Dask scheduler runs whatever a connected client submits, on every worker,
outside any sandbox.  So the cluster authenticates: only TLS with client
certificates (distributed's :class:`~distributed.security.Security`, mutual
TLS: ``ssl.CERT_REQUIRED`` on both sides) is accepted.

* ``--dask local`` starts a cluster of its own on 127.0.0.1 for this run
  (:func:`local_cluster`), with credentials made for the run in memory
  (``Security.temporary()``: a new key and self-signed certificate, never on
  disk), gone when it ends.
* ``--dask tls://HOST:PORT`` uses the client credentials of the dask
  configuration (``distributed.comm.tls.ca-file``, ``.client.cert``,
  ``.client.key``; a YAML file or ``DASK_DISTRIBUTED__COMM__TLS__...``
  variables, see :func:`cluster_security`).
* a ``tcp://`` (or any unauthenticated) address is refused with one line.

A task whose worker dies, or that the cluster fails, becomes that
submission's ``unverified`` row with the reason.
"""

from __future__ import annotations

import atexit
import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

from ..verdict import Verdict
from .results import SubmissionResult
from .submissions import Submission
from .task import GradeSettings, Suite, grade_safely
from .venvs import BaseLibrary

__all__ = [
    "grade_on_cluster",
    "grade_on_worker",
    "cluster_security",
    "local_cluster",
    "ClusterError",
    "CONNECT_TIMEOUT",
    "LOCAL",
]

CONNECT_TIMEOUT = "10s"  # how long to try reaching the scheduler
LOCAL = "local"  # --dask local: a cluster of this run's own


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


def cluster_security(address: str) -> Any:
    """The :class:`distributed.security.Security` a client of ``address`` authenticates with.

    Only ``tls://`` is accepted, with the client's credentials from the dask
    configuration (PEM file paths, or PEM text): ``distributed.comm.tls.ca-file``,
    ``distributed.comm.tls.client.cert`` and ``distributed.comm.tls.client.key``.

    Raises:
        ClusterError: an address of another scheme (``tcp://``: any process that
            reaches it may run code on the workers), or no client credentials.
    """
    from distributed.comm import parse_address
    from distributed.security import Security

    try:
        scheme, _ = parse_address(address)
    except ValueError as exc:
        raise ClusterError(f"--dask {address}: not a scheduler address ({exc})") from None
    if scheme != "tls":
        raise ClusterError(
            f"--dask {address}: a {scheme}:// scheduler runs code for anyone who reaches it; give a tls:// address "
            "with client credentials in the dask config (distributed.comm.tls.*), or --dask local"
        )
    security = Security(require_encryption=True)
    if not getattr(security, "tls_ca_file", None) or not getattr(security, "tls_client_cert", None):
        keys = ", ".join(f"distributed.comm.tls.{key}" for key in ("ca-file", "client.cert", "client.key"))
        raise ClusterError(f"--dask {address}: no TLS client credentials in the dask config; set {keys}")
    return security


@contextlib.contextmanager
def local_cluster(workers: int, processes: bool = True) -> Iterator[tuple[str, Any]]:
    """A cluster of this run's own on 127.0.0.1: yields ``(address, security)``, closed when the block ends.

    The scheduler and ``workers`` workers (one thread each; worker processes
    unless ``processes`` is false) listen on ``tls://`` and accept only peers
    holding the run's credentials, made in memory for it
    (``distributed.security.Security.temporary()``, needs ``cryptography``).

    Raises:
        ClusterError: ``cryptography`` is missing, or the cluster does not start.
    """
    import dask
    from distributed import LocalCluster
    from distributed.security import Security

    try:
        security = Security.temporary()
    except ImportError:
        raise ClusterError("--dask local needs cryptography beside cellbox: pip install 'cellbox[dask]'") from None
    # The scheduler and the workers always listen for HTTP too, unauthenticated (information pages, a proxy
    # to the workers): with no routes they serve nothing, on a port of their own of 127.0.0.1.
    no_pages: dict[str, list[str]] = {"distributed.scheduler.http.routes": [], "distributed.worker.http.routes": []}
    try:
        with dask.config.set(no_pages):
            cluster = LocalCluster(
                n_workers=workers,
                threads_per_worker=1,
                processes=processes,
                protocol="tls",
                host="127.0.0.1",
                security=security,
                dashboard_address="127.0.0.1:0",
            )
    except (OSError, RuntimeError) as exc:
        raise ClusterError(f"--dask local: the cluster did not start ({_first_line(exc)})") from None
    with cluster:
        yield cluster.scheduler_address, security


def _first_line(exc: BaseException) -> str:
    return (str(exc).splitlines() or [type(exc).__name__])[0]


@contextlib.contextmanager
def _client(address: str, workers: int) -> Iterator[Any]:
    """A client of the cluster at ``address`` (or of a new local one), authenticated; see :func:`cluster_security`."""
    from distributed import Client

    with contextlib.ExitStack() as stack:
        if address == LOCAL:
            address, security = stack.enter_context(local_cluster(workers))
        else:
            security = cluster_security(address)
        try:
            client = Client(address, security=security, set_as_default=False, timeout=CONNECT_TIMEOUT)
        except (OSError, ValueError) as exc:
            raise ClusterError(f"cannot reach the dask scheduler at {address} ({_first_line(exc)})") from None
        with client:
            yield client


def grade_on_cluster(
    address: str,
    todo: list[Submission],
    suite: Suite,
    settings: GradeSettings,
    record: Callable[[SubmissionResult], None],
    workers: int = 1,
) -> None:
    """Submit one task per submission to the scheduler at ``address``; ``record`` each row as it comes.

    ``address`` is a ``tls://`` scheduler, or :data:`LOCAL` for a cluster of
    ``workers`` worker processes started for this run (:func:`local_cluster`).

    Raises:
        ClusterError: an unauthenticated address, no credentials, or the
            scheduler cannot be reached within :data:`CONNECT_TIMEOUT`.
    """
    from distributed import as_completed

    with _client(address, workers) as client:
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
                result = SubmissionResult(
                    id=submission.id,
                    path=submission.path,
                    kind=submission.kind,
                    verdict=Verdict.UNVERIFIED,
                    reason=f"grader error on the cluster: {type(exc).__name__}: {_first_line(exc)}",
                )
                result.fill_tests(suite.expected)
            record(result)
