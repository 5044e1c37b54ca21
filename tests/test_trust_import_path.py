"""No trusted process imports anything from a folder a cell can write (the notebook folder, the cells' home).

Each attack plants code where Python would look for it (a module named as
one the kernel or the keeper imports, a package shadowing cellbox or IPython,
``sitecustomize``, ``usercustomize``, a ``.pth`` file) and that code appends
a line to a marker file saying whether it ran in a cell's own process (which
has ``CELLBOX_CHANNEL``) or in another (the kernel, the keeper, a snapshot).
"""

from __future__ import annotations

import json
import os
import sys
import sysconfig
from pathlib import Path
from typing import Any

import pytest
from jupyter_client.manager import KernelManager

from cellbox.cli import main
from cellbox.kernelspec import kernel_json
from cellbox.sandbox import run
from cellbox.sandbox.environment import TaskDirectory
from cellbox.sandbox.importpath import KEEPER_FLAGS, KERNEL_FLAGS, add_working_directory, trusted_sys_path
from cellbox.sandbox.limits import Limits
from cellbox.sandbox.session import ForkServer
from kernelkit import execute, running_kernel

MARKER = "planted-code-ran.jsonl"


def planted(marker: Path, name: str) -> str:
    """One line of Python (a ``.pth`` file runs such a line) noting in ``marker`` that it ran, and where."""
    note = f"{{'name': {name!r}, 'cell': bool(os.environ.get('CELLBOX_CHANNEL')), 'pid': os.getpid()}}"
    return f"import os, json; open({str(marker)!r}, 'a').write(json.dumps({note}) + chr(10))\n"


def ran(marker: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in marker.read_text().splitlines()] if marker.exists() else []


def planted_files(folder: Path) -> dict[str, str]:
    """What a hostile cell leaves next to the notebook, each named for something a trusted process imports."""
    marker = folder / MARKER
    names = ("jedi.py", "sitecustomize.py", "usercustomize.py", "IPython/__init__.py", "cellbox/__init__.py")
    return {name: planted(marker, name) for name in names}


def plant(folder: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (folder / name).parent.mkdir(exist_ok=True)
        (folder / name).write_text(text)


# --------------------------------------------------------------------------- the functions


def test_trusted_sys_path_drops_the_working_directory_and_relative_entries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    notebook = tmp_path / "notebook"
    (notebook / "below").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    path = ["", ".", "lib", str(tmp_path), str(notebook), str(notebook / "below"), "/usr/lib/python3.11"]
    removed = trusted_sys_path((str(notebook),), path)
    assert removed == ["", ".", "lib", str(tmp_path), str(notebook)]
    # A folder below a writable one stays: an editable install of cellbox in the project started from.
    assert path == [str(notebook / "below"), "/usr/lib/python3.11"]


def test_working_directory_goes_after_the_standard_library_as_under_ipykernel() -> None:
    path = ["/py/lib/python311.zip", "/py/lib/python3.11", "/venv/lib/python3.11/site-packages"]
    assert add_working_directory(path) is True
    assert path == ["/py/lib/python311.zip", "/py/lib/python3.11", "", "/venv/lib/python3.11/site-packages"]
    assert add_working_directory(path) is False
    assert path.count("") == 1


def test_the_cli_drops_its_working_directory_from_sys_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", ["", str(tmp_path), *sys.path])
    main([])  # prints the help: what matters is the path it leaves for the modules it imports later
    assert "" not in sys.path and str(tmp_path) not in sys.path


# --------------------------------------------------------------------------- the kernelspec


def test_the_kernelspec_starts_python_with_no_working_directory_and_no_pythonpath() -> None:
    argv = KernelManager(kernel_name="cellbox").format_kernel_cmd()
    # jupyter_client still puts its own interpreter in place of the leading "python".
    assert argv[: len(KERNEL_FLAGS) + 3] == [sys.executable, *KERNEL_FLAGS, "-m", "cellbox.kernel"]
    assert KERNEL_FLAGS == ("-E", "-P")
    assert kernel_json(executable="/opt/python")["argv"][:5] == ["/opt/python", "-E", "-P", "-m", "cellbox.kernel"]


# --------------------------------------------------------------------------- a real kernel


def test_code_a_cell_plants_in_the_notebook_folder_never_runs_in_the_kernel_or_the_keeper(tmp_path: Path) -> None:
    notebook = tmp_path / "notebook"
    notebook.mkdir()
    marker = notebook / MARKER
    with running_kernel("cellbox", cwd=str(notebook)) as (km, kc):
        files = {"mymodule.py": planted(marker, "mymodule.py") + "VALUE = 42\n", **planted_files(notebook)}
        cell = f"from pathlib import Path\nfor name, text in {files!r}.items():\n"
        cell += f"    (Path({str(notebook)!r}) / name).parent.mkdir(exist_ok=True)\n"
        cell += f"    (Path({str(notebook)!r}) / name).write_text(text)"
        assert execute(kc, cell).status == "ok"
        assert (notebook / "cellbox" / "__init__.py").exists()
        _complete(kc, "import os\nos.pa")  # the kernel's completion (jedi, before it moved to the session)
        # The next kernel in this folder (Restart; jupyter execute, nbgrader and papermill start one the same
        # way), and its session's keeper, start with all of it in place.
        km.restart_kernel(now=False)
        kc.wait_for_ready(timeout=60)
        _complete(kc, "import os\nos.pa")
        result = execute(kc, "import mymodule\nprint(mymodule.VALUE)")
        assert (result.status, result.stream()) == ("ok", "42\n")
    notes = ran(marker)
    # The marker works from inside the session (the cell's own import), and nothing else ran.
    assert [note["name"] for note in notes if note["cell"]] == ["mymodule.py"]
    assert [note for note in notes if not note["cell"]] == []


def _complete(kc: Any, code: str) -> dict[str, Any]:
    msg_id = kc.complete(code, len(code))
    while True:
        reply = kc.get_shell_msg(timeout=60)
        if reply["parent_header"].get("msg_id") == msg_id:
            return dict(reply["content"])


# --------------------------------------------------------------------------- the session's keeper


def test_the_keeper_imports_nothing_from_its_folder_or_its_home(tmp_path: Path) -> None:
    folder = tmp_path / "notebook"
    folder.mkdir()
    marker = folder / MARKER
    probe = planted(marker, "probe_module") + "print('probe ran')\n"
    plant(folder, {**planted_files(folder), "probe_module.py": probe})
    with TaskDirectory.create() as task:
        # The cells' home is the task's home/: a .pth in its user site-packages would run in every new keeper.
        user_site = Path(sysconfig.get_path("purelib", f"{os.name}_user", vars={"userbase": str(task.home / ".local")}))
        user_site.mkdir(parents=True)
        (user_site / "planted.pth").write_text(planted(marker, "planted.pth"))
        (user_site / "usercustomize.py").write_text(planted(marker, "home usercustomize"))
        with ForkServer(preload=["probe_module", "json"], task=task, cwd=folder) as server:
            assert server.wait_ready(60)
            assert "probe_module" in server.failed  # not importable from the keeper's folder
            assert "-P" in KEEPER_FLAGS and "-s" in KEEPER_FLAGS
            # A run forked from the session is `python -m` in its folder: its own process finds the module.
            outcome = run(
                [sys.executable, "-m", "probe_module"], forkserver=server, task=task, cwd=folder, limits=Limits()
            )
            assert "forkserver" in outcome.isolation, outcome.notes
            assert outcome.stdout == "probe ran\n", outcome.stderr
    assert [note["name"] for note in ran(marker)] == ["probe_module"]
