"""Work a cell left running, met again in a later cell: it fails at once, naming its cell, instead of hanging.

Child side (imported by :mod:`cellbox.kernel.cellrunner` in the session's
shell, never by the kernel process).  A cell's state reaches the next cell as
a snapshot, a fork(2) of the cell's main thread: the threads it left running
are gone there, and the processes it started were killed with its process
tree (design rule 4).  Objects that stood for that work stay in the state, and
left alone they would wait for ever: a ``ProcessPoolExecutor`` or ``Pool``
whose workers are gone takes new work and never answers, a ``Future`` never
finishes, and ``Popen.poll()`` of a child that is not the next cell's returns
0 (``waitpid`` fails with ``ECHILD``, which :mod:`subprocess` reads as an exit).

So the session's shell keeps a weak list of the executors, pools and
processes cells make (:func:`install`), and between two cells:

* at the end of a cell (:func:`end_cell`, in that cell's process) each one
  with work still running is marked with the cell's number;
* at the start of the next (:func:`start_cell`) the marked ones are settled:
  a ``Future`` or pool result that was not done fails with
  :class:`CellWorkEndedError`; ``Popen`` and ``multiprocessing.Process``
  report the SIGKILL that ended their child (``returncode`` -9); a
  ``ThreadPoolExecutor`` starts new threads for new work, as it would under
  ipykernel; a ``ProcessPoolExecutor`` or ``Pool`` refuses new work with the
  same one-line error.

Nothing here reads anything of the kernel's; a cell may change all of it, and
only its own objects then behave differently.
"""

from __future__ import annotations

import functools
import os
import queue
import signal
import subprocess
import threading
import weakref
from collections.abc import Callable
from concurrent.futures import BrokenExecutor, Future, ProcessPoolExecutor, ThreadPoolExecutor
from multiprocessing import pool as mp_pool
from multiprocessing import process as mp_process
from typing import Any

__all__ = ["CellWorkEndedError", "install", "end_cell", "start_cell"]

# The attribute that marks an object whose work ended with a cell: the cell's execution count.
ENDED = "_cellbox_ended_with"
# How the sandbox ends the processes a cell leaves (its tree kill): what Popen.returncode then says.
KILLED_BY = signal.SIGKILL

_executors: weakref.WeakSet[Any] = weakref.WeakSet()
_pools: weakref.WeakSet[Any] = weakref.WeakSet()
_popens: weakref.WeakSet[subprocess.Popen[Any]] = weakref.WeakSet()
_ended_processes: weakref.WeakSet[Any] = weakref.WeakSet()  # multiprocessing.Process objects whose child ended
_installed = False


class CellWorkEndedError(BrokenExecutor):
    """Work an earlier cell left running was used in a later cell; it ended with its own cell.

    A :class:`concurrent.futures.BrokenExecutor` (a ``RuntimeError``), as a
    pool whose workers died raises, so code that handles a broken pool
    handles this one too.
    """


def ended_message(what: str, count: int) -> str:
    """The one line for ``what`` (``"this ProcessPoolExecutor's worker processes"``) that ended with cell ``count``."""
    return (
        f"{what} ended with cell [{count}]: under cellbox, work does not outlive the cell that started it; "
        "start it again in the cell that uses it"
    )


def install() -> None:
    """Keep a weak list of the executors, pools and ``Popen`` objects cells make, and guard their use; once.

    Called when the session's shell is built (:func:`cellbox.kernel.cellrunner._new_shell`).
    """
    global _installed
    if _installed:
        return
    _installed = True
    for cls in (ThreadPoolExecutor, ProcessPoolExecutor):
        _note_instances(cls, _executors)
        cls.submit = _refusing(cls.submit)  # type: ignore[method-assign]
    _note_instances(mp_pool.Pool, _pools)
    pool_class: Any = mp_pool.Pool
    pool_class._check_running = _refusing(pool_class._check_running)
    mp_pool.ApplyResult.get = _result_refusing(mp_pool.ApplyResult.get)  # type: ignore[method-assign]
    iterator: Any = mp_pool.IMapIterator
    iterator.next = iterator.__next__ = _iterator_refusing(iterator.next)
    _note_instances(subprocess.Popen, _popens)


def _note_instances(cls: Any, registry: weakref.WeakSet[Any]) -> None:
    original = cls.__init__

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        registry.add(self)

    cls.__init__ = __init__


def _refusing(method: Callable[..., Any]) -> Callable[..., Any]:
    """``method`` of an executor or pool, first refusing at once when the object's workers ended with a cell."""

    @functools.wraps(method)
    def guarded(self: Any, *args: Any, **kwargs: Any) -> Any:
        __tracebackhide__ = True  # noqa: F841
        count = self.__dict__.get(ENDED)
        if count is not None:
            raise CellWorkEndedError(ended_message(f"this {type(self).__name__}'s workers", count))
        result = method(self, *args, **kwargs)
        if isinstance(result, Future):
            self.__dict__.setdefault("_cellbox_futures", weakref.WeakSet()).add(result)
        return result

    return guarded


def _result_refusing(get: Callable[..., Any]) -> Callable[..., Any]:
    """``AsyncResult.get`` of a pool, failing at once when its job's workers ended with an earlier cell."""

    @functools.wraps(get)
    def guarded(self: Any, timeout: float | None = None) -> Any:
        __tracebackhide__ = True  # noqa: F841
        count = self.__dict__.get(ENDED)
        if count is not None and not self.ready():
            raise CellWorkEndedError(ended_message("the worker processes of this result", count))
        return get(self, timeout)

    return guarded


def _iterator_refusing(next_item: Callable[..., Any]) -> Callable[..., Any]:
    """``imap()``'s iterator of a pool: the items that came are given, then it fails at once instead of waiting."""

    @functools.wraps(next_item)
    def guarded(self: Any, timeout: float | None = None) -> Any:
        __tracebackhide__ = True  # noqa: F841
        count = self.__dict__.get(ENDED)
        if count is not None and not self._items and self._index != self._length:
            raise CellWorkEndedError(ended_message("the worker processes of this result", count))
        return next_item(self, timeout)

    return guarded


# --------------------------------------------------------------------------- between cells


def end_cell(count: int) -> set[threading.Thread]:
    """Mark what still works for the cell ``count`` as ending with it; in that cell's process, at its end.

    A child a ``Popen`` started that has ended already is reaped now, so its
    real exit status is kept; one still running gets the mark.

    Returns:
        the idle threads of thread pools, which the next cell replaces (nothing of the cell's is lost with them).
    """
    idle: set[threading.Thread] = set()
    for executor in _each(_executors):
        if ENDED not in executor.__dict__ and _executor_busy(executor):
            executor.__dict__[ENDED] = count
            unfinished = _unfinished(executor)
            for future in unfinished:
                future.__dict__[ENDED] = count
            if isinstance(executor, ThreadPoolExecutor) and not unfinished:
                idle.update(executor._threads)  # type: ignore[attr-defined]
    for pool in _each(_pools):
        if ENDED not in pool.__dict__ and pool._state == mp_pool.RUN:
            pool.__dict__[ENDED] = count
            for result in list(pool._cache.values()):
                result.__dict__.setdefault(ENDED, count)
    for popen in _each(_popens):
        if popen.returncode is None and popen.poll() is None:
            popen.__dict__[ENDED] = count
    for child in _each(mp_process._children):  # type: ignore[attr-defined]
        popen = getattr(child, "_popen", None)
        if popen is not None and popen.poll() is None:
            popen.__dict__[ENDED] = count
    return idle


def start_cell() -> None:
    """Settle what ended with an earlier cell (see the module's docstring); in the next cell's process, first."""
    for executor in _each(_executors):
        count = executor.__dict__.get(ENDED)
        if count is None:
            continue
        for future in _unfinished(executor):
            _fail(future, ended_message("this Future's work", future.__dict__.get(ENDED, count)))
        if isinstance(executor, ThreadPoolExecutor):
            _new_threads(executor)
    for popen in _each(_popens):
        if popen.__dict__.pop(ENDED, None) is not None and popen.returncode is None:
            popen.returncode = -KILLED_BY
    for child in _each(mp_process._children):  # type: ignore[attr-defined]
        popen = getattr(child, "_popen", None)
        if popen is not None and popen.__dict__.pop(ENDED, None) is not None and popen.returncode is None:
            popen.returncode = -KILLED_BY
            _ended_processes.add(child)
    for child in _each(_ended_processes):
        # Its parent was an earlier cell's process: is_alive() and join() ask for this one.
        child._parent_pid = os.getpid()


def _each(objects: Any) -> list[Any]:
    """The objects of a registry, each with the attributes this module reads (a cell may have changed any)."""
    return [item for item in list(objects) if isinstance(getattr(item, "__dict__", None), dict)]


def _executor_busy(executor: Any) -> bool:
    """Whether the executor has a thread or process alive, which the next cell will not have."""
    if isinstance(executor, ThreadPoolExecutor):
        return any(thread.is_alive() for thread in executor._threads)
    manager = executor._executor_manager_thread
    return bool(executor._processes) or (manager is not None and manager.is_alive())


def _unfinished(executor: Any) -> list[Future[Any]]:
    futures: set[Future[Any]] = set(executor.__dict__.get("_cellbox_futures", ()))
    for item in list(getattr(executor, "_pending_work_items", {}).values()):
        futures.add(item.future)
    return [future for future in futures if not future.done()]


def _fail(future: Future[Any], message: str) -> None:
    """End ``future`` with :class:`CellWorkEndedError`, so ``result()``, ``wait()`` and ``as_completed`` answer now."""
    # Its lock may have been held by a thread of the earlier cell when that cell's image was taken.
    future._condition = threading.Condition()  # type: ignore[attr-defined]
    future._waiters = []  # type: ignore[attr-defined]
    if future.cancelled() or future.done():
        return
    try:
        future.set_exception(CellWorkEndedError(message))
    except Exception:  # noqa: BLE001 - a future a callback of the cell's had already settled
        pass


def _new_threads(executor: ThreadPoolExecutor) -> None:
    """A ``ThreadPoolExecutor`` whose threads ended with a cell starts new ones for new work, as under ipykernel."""
    work = executor._work_queue  # type: ignore[attr-defined]
    while True:  # what the earlier cell queued ended with it (its futures failed above)
        try:
            work.get_nowait()
        except queue.Empty:
            break
    executor._threads.clear()  # type: ignore[attr-defined]
    executor._idle_semaphore = threading.Semaphore(0)  # type: ignore[attr-defined]
    executor._shutdown_lock = threading.Lock()  # type: ignore[attr-defined]
    executor.__dict__.pop(ENDED, None)
    executor.__dict__.pop("_cellbox_futures", None)
