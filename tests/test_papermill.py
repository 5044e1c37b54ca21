"""papermill runs a parametrised notebook on the cellbox kernel (docs/papermill.md).

The real ``papermill`` command, as a user types it: ``papermill -k cellbox in.ipynb out.ipynb -p n 10``.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook

from cellbox.sandbox.limits import format_time
from conftest import missing
from kernelkit import plain

# Whole notebooks through papermill: heavy, left to CI and -m slow.
pytestmark = pytest.mark.slow

STOP_AFTER = 2.0  # the %%limits wall of the notebook's endless loop, seconds


def _notebook(path: Path, *, runaway: bool) -> None:
    nb = new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [
        new_code_cell("n = 3", metadata={"tags": ["parameters"]}),
        new_code_cell("print('sum', sum(range(n)))"),
    ]
    if runaway:
        nb.cells.append(new_code_cell(f"%%limits wall={STOP_AFTER:g}\nwhile True:\n    pass"))
    nb.cells.append(new_code_cell("print('last cell ran')"))
    nbformat.write(nb, path)


def _papermill(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    if importlib.util.find_spec("papermill") is None:
        missing("papermill is not installed", "pip install -e '.[test]'")
    env = {**os.environ, "HOME": str(tmp_path)}
    return subprocess.run(
        [sys.executable, "-m", "papermill", *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )


def _stdout(cell: nbformat.NotebookNode) -> str:
    return "".join(o.text for o in cell.outputs if o.output_type == "stream" and o.name == "stdout")


def test_parameters_reach_the_cells(tmp_path: Path) -> None:
    _notebook(tmp_path / "in.ipynb", runaway=False)
    done = _papermill(tmp_path, "-k", "cellbox", "in.ipynb", "out.ipynb", "-p", "n", "10")
    assert done.returncode == 0, done.stderr[-3000:]
    out = nbformat.read(tmp_path / "out.ipynb", as_version=4)
    default, injected, total, last = out.cells
    assert injected.metadata.tags == ["injected-parameters"] and "n = 10" in injected.source
    assert _stdout(total) == "sum 45\n"
    assert _stdout(last) == "last cell ran\n"
    assert out.metadata.papermill.parameters == {"n": 10}
    assert "Executing notebook with kernel: cellbox" in done.stderr


def test_stopped_cell_ends_the_run_with_cellboxs_error_in_the_output_notebook(tmp_path: Path) -> None:
    _notebook(tmp_path / "in.ipynb", runaway=True)
    done = _papermill(tmp_path, "-k", "cellbox", "in.ipynb", "out.ipynb", "-p", "n", "10")
    evalue = f"the cell ran past its {format_time(STOP_AFTER)} wall-clock limit; it was stopped."
    assert done.returncode == 1
    assert f"CellTimeoutError: {evalue}" in done.stderr
    out = nbformat.read(tmp_path / "out.ipynb", as_version=4)
    # papermill puts a banner first that links to the failing cell, and an anchor just before that cell.
    banner, _default, _injected, total, anchor, loop, last = out.cells
    assert banner.cell_type == "markdown" and "An Exception was encountered" in banner.source
    assert anchor.metadata.tags == ["papermill-error-cell-tag"] and 'id="papermill-error-cell"' in anchor.source
    assert _stdout(total) == "sum 45\n"
    [error] = [o for o in loop.outputs if o.output_type == "error"]
    assert error.ename == "CellTimeoutError" and error.evalue.startswith(evalue)
    assert f"CellTimeoutError: {evalue}" in plain("\n".join(error.traceback))
    assert last.outputs == [] and last.execution_count is None
    assert out.metadata.papermill.exception is True


def test_a_notebook_without_a_language_needs_it_named(tmp_path: Path) -> None:
    # docs/papermill.md, "Set up": `-k cellbox` names the kernel, not the language papermill writes parameters in.
    _notebook(tmp_path / "in.ipynb", runaway=False)
    nb = nbformat.read(tmp_path / "in.ipynb", as_version=4)
    del nb.metadata["kernelspec"]
    nbformat.write(nb, tmp_path / "in.ipynb")
    refused = _papermill(tmp_path, "-k", "cellbox", "in.ipynb", "out.ipynb", "-p", "n", "10")
    assert refused.returncode == 1 and not (tmp_path / "out.ipynb").exists()
    assert "ValueError: No language found in notebook and no override provided." in refused.stderr
    done = _papermill(tmp_path, "-k", "cellbox", "-l", "python", "in.ipynb", "out.ipynb", "-p", "n", "10")
    assert done.returncode == 0, done.stderr[-3000:]
    assert _stdout(nbformat.read(tmp_path / "out.ipynb", as_version=4).cells[2]) == "sum 45\n"
