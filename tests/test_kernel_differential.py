"""Tutorial-style notebooks give the same outputs under ipykernel's python3 and under cellbox.

Each notebook runs under both kernels with nbclient, in directories with the
same files; outputs are compared cell by cell after normalising what is
legitimately variable (timings, object addresses, PNG bytes, the directory's
path).  A cell marked with a ``difference`` is one whose output differs on
purpose: the test checks that it does differ and that the documentation's
"Differences from ipykernel" page names it.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path
from typing import Any

import nbformat
import pytest
from nbclient import NotebookClient

from kernelkit import plain, without_notes

# Whole notebooks under two kernels: heavy, left to CI and -m slow.
pytestmark = pytest.mark.slow

DIFFERENCES = Path(__file__).resolve().parent.parent / "docs" / "reference" / "ipykernel-differences.md"

# (source, tags, documented difference or None)
Cell = tuple[str, list[str], str | None]
ERR = ["raises-exception"]

PLAIN_PYTHON: list[Cell] = [
    ('print("Hello, students!")', [], None),
    ("numbers = [3, 1, 4, 1, 5, 9, 2, 6]\nsorted(numbers)", [], None),
    ("squares = {n: n * n for n in range(5)}\nsquares", [], None),
    (
        'def describe(values):\n    """Return a summary of the values."""\n'
        '    return f"{len(values)} values, mean {sum(values) / len(values):.2f}"\ndescribe(numbers)',
        [],
        None,
    ),
    (
        "class Account:\n"
        "    def __init__(self, owner, balance=0):\n"
        "        self.owner, self.balance = owner, balance\n"
        "    def deposit(self, amount):\n"
        "        if amount <= 0:\n"
        '            raise ValueError("deposits must be positive")\n'
        "        self.balance += amount\n"
        "        return self.balance\n"
        'acct = Account("Ada")\nacct.deposit(50)',
        [],
        None,
    ),
    ("acct.deposit(-5)", ERR, None),
    ("_ * 2", [], None),
    ('import math\nprint(math.sqrt(2))\nfor i in range(3):\n    print("line", i)', [], None),
    ("undefined_name + 1", ERR, None),
    ('import sys\nprint("to stderr", file=sys.stderr)\nprint("to stdout")', [], "stream order"),
    ('text = "the quick brown fox"\nwords = text.split()\nlen(words), words[-1].upper()', [], None),
    ("acct", [], None),
]

MAGICS: list[Cell] = [
    ("%time total = sum(range(1000))", [], None),
    ("%timeit -n 10 -r 3 sum(range(100))", [], None),
    ('%%writefile helper.py\ndef greet(name):\n    return f"Hello, {name}!"', [], None),
    ('from helper import greet\ngreet("Grace")', [], None),
    ('%run helper.py\ngreet("Alan")', [], None),
    ("%env TUTORIAL_MODE=on", [], None),
    ('import os\nos.environ["TUTORIAL_MODE"]', [], None),
    ('%%capture captured\nprint("hidden")', [], None),
    ("captured.stdout", [], None),
    ("%%html\n<b>bold</b>", [], None),
    ("%%markdown\n# Heading", [], None),
    ("In[1]", [], None),
    ("Out[4]", [], None),
    ("%%time\nsum(range(10))", [], None),
    ("%pdb on", [], None),
    # nbclient allows no input: the post-mortem debugger %pdb starts fails on both kernels, each traceback its own.
    ("1 / 0", ERR, "%pdb"),
    ("%pdb off", [], None),
]

SHELL: list[Cell] = [
    ('!echo "Hello from the shell"', [], None),
    ("!pwd", [], None),
    ("files = !ls\nsorted(files)", [], None),
    ('%%bash\nfor i in 1 2 3; do echo "item $i"; done\necho "done" >&2', [], None),
    ('!python -c "print(6 * 7)"', [], None),
    ("%pip --version", [], None),
    ("!echo $HOME", [], "HOME"),
]


# Where json's source lives (a traceback shows it): under the user's home with a pyenv, not with Debian's python3.
STDLIB_UNDER_HOME = os.path.realpath(os.path.dirname(json.__file__)).startswith(
    os.path.realpath(os.path.expanduser("~")) + os.sep
)

HELP_PLOTS_ERRORS: list[Cell] = [
    ("len?", [], None),
    ("%matplotlib inline\nimport matplotlib.pyplot as plt", [], None),
    ('plt.plot([1, 2, 3], [2, 4, 8])\nplt.title("growth")', [], None),
    ('fig, ax = plt.subplots()\nax.bar(["a", "b"], [3, 5])\nplt.show()\nprint("after the plot")', [], None),
    (
        'from IPython.display import HTML, Markdown, display\ndisplay(HTML("<i>hi</i>"))\ndisplay(Markdown("**b**"))',
        [],
        None,
    ),
    ("def countdown(n):\n    return countdown(n - 1) if n else 1 / n\ncountdown(3)", ERR, None),
    ('int("twelve")', ERR, None),
    # IPython writes a path under $HOME as ~/...: ipykernel's HOME is the user's, a cell's is its own.
    ('import json\njson.loads("{bad json}")', ERR, "HOME" if STDLIB_UNDER_HOME else None),
    ("def f(x):\n    return x * 2\nf?", [], None),
]

BROKEN_REPR = "class Point:\n    def __init__(self, x):\n        self.x = x\n    def __repr__(self):\n"
HTML_RAISES = "class Table:\n    def _repr_html_(self):\n        raise ValueError('no html')\n    def __repr__(self):\n"

DISPLAYS_AND_KERNEL_MAGICS: list[Cell] = [
    (BROKEN_REPR + "        return f'Point({self.y})'\nPoint(1)", ERR, None),
    (HTML_RAISES + "        return 'Table()'\nTable()", ERR, None),
    ('display(Table())\nprint("after the display")', [], None),
    ("%matplotlib inline\nimport matplotlib.pyplot as plt\nplt.plot([1, 2, 3]); 1 / 0", ERR, None),
    ("x = 1\n%store x", [], None),
    ("del x\n%store -r x\nx", [], None),
    ("%autosave 0", [], None),
    ("%clear", [], None),
    ("%less data.csv", [], None),
    ("%matplotlib notebook", ERR, "%matplotlib notebook"),
    ("%%script cellbox-no-such-program\nprint(1)", [], "PATH"),
    ("%subshell", ERR, "%subshell"),
]

NOTEBOOKS = {
    "plain_python": PLAIN_PYTHON,
    "magics": MAGICS,
    "shell": SHELL,
    "help_plots_errors": HELP_PLOTS_ERRORS,
    "displays_and_kernel_magics": DISPLAYS_AND_KERNEL_MAGICS,
}

_TIME = re.compile(r"\d+(?:\.\d+)?(?:e[+-]?\d+)?\s*(?:ns|µs|μs|us|ms|s)\b")
_ADDRESS = re.compile(r"0x[0-9a-f]+")


# %timeit adds this line when runs vary a lot, which a busy machine decides, not the kernel.
_SLOWEST = re.compile(r"^The slowest run took .*\n", re.MULTILINE)


# The debugger names the file each kernel wrote the cell's source to (ipykernel's temp folder, cellbox's task's).
_CELL_FILE = re.compile(r"^> \S+\.py\(", re.MULTILINE)


def _text(text: str, directory: Path) -> str:
    text = _CELL_FILE.sub("> <cell>.py(", plain(text))
    text = _SLOWEST.sub("", text.replace(str(directory), "<dir>"))
    return _ADDRESS.sub("0x…", _TIME.sub("<time>", text))


def _normalised(outputs: list[Any], directory: Path) -> list[dict[str, Any]]:
    result: list[dict[str, Any]] = []
    # cellbox's own notes (a normal user's first cell says the session's memory is unbounded) have no
    # counterpart under ipykernel; tests/test_kernel_session.py checks them.
    for output in without_notes(outputs):
        kind = output["output_type"]
        if kind == "stream":
            text = _text(output["text"], directory)
            if result and result[-1]["output_type"] == "stream" and result[-1]["name"] == output["name"]:
                result[-1]["text"] += text
            else:
                result.append({"output_type": "stream", "name": output["name"], "text": text})
        elif kind in ("display_data", "execute_result"):
            data = {
                mime: "<png>" if mime == "image/png" else _text(value, directory) if isinstance(value, str) else value
                for mime, value in output["data"].items()
            }
            result.append({"output_type": kind, "data": data, "count": output.get("execution_count")})
        elif kind == "error":
            tb = [_text(line, directory) for line in output["traceback"]]
            result.append({"output_type": "error", "ename": output["ename"], "evalue": output["evalue"], "tb": tb})
    return result


def _run(cells: list[Cell], kernel: str, directory: Path) -> list[list[dict[str, Any]]]:
    directory.mkdir(parents=True)
    (directory / "data.csv").write_text("name,score\nAda,90\n")
    nb = nbformat.v4.new_notebook()
    for source, tags, _difference in cells:
        cell = nbformat.v4.new_code_cell(source)
        cell.metadata["tags"] = tags
        nb.cells.append(cell)
    NotebookClient(nb, kernel_name=kernel, timeout=120, resources={"metadata": {"path": str(directory)}}).execute()
    return [_normalised(cell.outputs, directory) for cell in nb.cells]


@pytest.mark.parametrize("name", list(NOTEBOOKS))
def test_notebook_outputs_match_ipykernel(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # ipykernel's cells see the PATH of whoever started Jupyter: as someone who activated this
    # environment, its bin first (cellbox puts it first for every cell).
    # Only folders this user may search: `su` keeps root's PATH (/root/...), where a program lookup fails with
    # EACCES, which IPython's %%script reports as PermissionError instead of "Couldn't find program".
    searchable = [part for part in os.environ.get("PATH", "").split(os.pathsep) if part and os.access(part, os.X_OK)]
    monkeypatch.setenv("PATH", os.pathsep.join([os.path.dirname(sys.executable), *searchable]))
    # ipykernel's %store writes under IPython's directory: a fresh one, not the user's ~/.ipython.
    monkeypatch.setenv("IPYTHONDIR", str(tmp_path / "ipython"))
    cells = NOTEBOOKS[name]
    theirs = _run(cells, "python3", tmp_path / "python3" / name)
    ours = _run(cells, "cellbox", tmp_path / "cellbox" / name)
    documented = DIFFERENCES.read_text()
    for (source, _tags, difference), expected, got in zip(cells, theirs, ours, strict=True):
        if difference is None:
            assert got == expected, f"cell {source!r} differs"
        else:
            assert got != expected, f"cell {source!r} is marked as a difference but gives the same output"
            assert f"`{difference}`" in documented, difference
