"""At-fork cache clears along the snapshot chain: a library's cache outlives the chain's forks, as in one process.

Standard library only.  Runs in the keeper (installed before its preload) and
so in every snapshot and run of the session.

A notebook's state crosses cells as a process image: each cell runs in a
fork of the last one's image (:mod:`cellbox.sandbox.snapshots`), and every
``os.fork()`` runs the after-fork handlers libraries registered with
:func:`os.register_at_fork`.  A library that registers a cache's
``cache_clear`` there (matplotlib's font cache, ``importlib_metadata``'s)
means "a child must not share what this cache holds with its running
parent".  Along the chain nothing is shared that way (the parent of a chain
fork is a finished cell's command that only forks and ends, or a snapshot that
stays stopped while its child runs), but the clear still runs once per cell,
so each cell rebuilds the cache: while other references (another cache, a
notebook variable) keep the old entries alive, their files and maps pile up
with the number of cells, until the open-files limit stops every cell.  Under
ipykernel the notebook is one process and the handler never runs.

So a handler that is a ``functools`` cache's ``cache_clear`` waits during the
chain's own forks (:func:`chain_fork`) and runs at every other fork, the ones a
notebook makes itself (``multiprocessing``, ``os.fork``).  Every other handler
(threading's, logging's, random's, a library's that resets a thread the fork
did not copy) runs at every fork, as before: threads do not survive the
chain's forks either.
"""

import os

# os.register_at_fork itself, before install() replaced it.
_register_at_fork = os.register_at_fork
# True while the chain forks (chain_fork): a registered cache clear waits.
chain_forking = False
# Handlers registered through register_at_fork other than cache clears, and how many of them the session's
# base snapshot had: a cell that registered more keeps its snapshot a fork (snapshots.own_snapshot_problem).
registered = 0
at_base = 0


def is_cache_clear(handler):
    """Whether ``handler`` is the ``cache_clear`` of a ``functools.lru_cache`` or ``functools.cache`` wrapper."""
    owner = getattr(handler, "__self__", None)
    return getattr(handler, "__name__", None) == "cache_clear" and callable(getattr(owner, "cache_info", None))


def register_at_fork(**handlers):
    """:func:`os.register_at_fork`, with a cache clear as ``after_in_child`` left out of the chain's forks.

    Same arguments and errors as :func:`os.register_at_fork` (keyword-only
    ``before``, ``after_in_child``, ``after_in_parent``; ``TypeError`` when none
    is given or one is not callable).
    """
    global registered
    clear = handlers.get("after_in_child")
    if not (clear is not None and is_cache_clear(clear) and len(handlers) == 1):
        registered += 1
    if clear is not None and is_cache_clear(clear):

        def after_in_child():
            if not chain_forking:
                clear()

        after_in_child.__wrapped__ = clear  # type: ignore[attr-defined]
        handlers["after_in_child"] = after_in_child
    _register_at_fork(**handlers)


def install():
    """Put :func:`register_at_fork` in place of :func:`os.register_at_fork` (once; before the preload imports).

    Handlers registered earlier (the standard library's) are left as they are.
    """
    if getattr(os, "register_at_fork", None) is _register_at_fork:
        os.register_at_fork = register_at_fork


def chain_fork():
    """``os.fork()`` for the snapshot chain: a registered cache clear does not run in the child.  Raises OSError."""
    global chain_forking
    chain_forking = True
    try:
        return os.fork()
    finally:
        chain_forking = False
