"""The cellbox Jupyter kernel: IPython's shell in a fresh, limited process per cell.

* :mod:`~cellbox.kernel.kernel`: the kernel process (:class:`~cellbox.kernel.kernel.CellboxKernel`), which never
  runs cell code; start it with ``python -m cellbox.kernel -f CONNECTION_FILE``;
* :mod:`~cellbox.kernel.cellrunner`: the cell runner, in the cell's own process (forked from the session's snapshot);
* :mod:`~cellbox.kernel.cellshell`: the IPython shell the cell runner runs cells in;
* :mod:`~cellbox.kernel.leftwork`: executors, pools and processes an earlier cell left, in a later cell's process;
* :mod:`~cellbox.kernel.magics`: ``%%limits`` and the magics that need a long-lived process;
* :mod:`~cellbox.kernel.cellerrors`: a stopped cell's error, as a student reads it;
* :mod:`~cellbox.kernel.completion`: ``is_complete``, in the kernel process;
* :mod:`~cellbox.kernel.beside`: completion and inspection, each a run forked beside the session's state,
  answered by :mod:`~cellbox.kernel.besiderunner` in that run.

Nothing is imported here: a cell's process imports only what it runs.
"""
