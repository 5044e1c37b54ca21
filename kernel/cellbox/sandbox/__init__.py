"""The sandbox core: run a command, or a session of forked runs, in fresh limited processes.

Imports nothing from Jupyter, pytest or Dask; the kernel (:mod:`cellbox.kernel`)
and the grader (:mod:`cellbox.grading`) start children only through it.  Its
modules, each importing only those listed before it:

* :mod:`~cellbox.sandbox.limits`: the limits of a run and how people write them;
* :mod:`~cellbox.sandbox.outcome`: how a run ended (:class:`Status`, :class:`Outcome`);
* :mod:`~cellbox.sandbox.classify`: which status a run gets, in the design's order of precedence;
* :mod:`~cellbox.sandbox.environment`: the scrubbed environment and the task directory;
* :mod:`~cellbox.sandbox.isolation`: the layers below the interpreter (bubblewrap, Landlock) and their probe;
* :mod:`~cellbox.sandbox._launch`: the launcher, run in the child before the command (standard library only);
* :mod:`~cellbox.sandbox.cgroups`: a run's pids and memory cgroups;
* :mod:`~cellbox.sandbox.confinement`: a run's walls, set up before it starts (bwrap, Landlock, seccomp, cgroups);
* :mod:`~cellbox.sandbox.pump`: the reading of a run's pipes (output, status, channel, stdin);
* :mod:`~cellbox.sandbox.runs`: :func:`start` and :func:`run`, the parent's side of one run (:class:`Run`);
* :mod:`~cellbox.sandbox.snapshots`: the snapshot chain's processes (a run forked from a kept process image);
* :mod:`~cellbox.sandbox.keeper`: the session's trusted supervisor of the chain and of its runs;
* :mod:`~cellbox.sandbox.session`: :class:`~cellbox.sandbox.session.ForkServer`, the session sandbox, owner's side.
"""

from .limits import LimitError, Limits
from .outcome import Outcome, Status
from .runs import DEFAULT_ISOLATION, ForkServerError, Run, SandboxError, classify, pids_cgroup_root, run, start

__all__ = [
    "DEFAULT_ISOLATION",
    "ForkServerError",
    "LimitError",
    "Limits",
    "Outcome",
    "Run",
    "SandboxError",
    "Status",
    "classify",
    "pids_cgroup_root",
    "run",
    "start",
]
