"""IPython's language in cellbox cells: magics, shell escapes, help, and what needs a long-lived process."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from jupyter_client.blocking.client import BlockingKernelClient

from cellbox.kernel.cellshell import STORE_DIR, interactive_plots_refusal
from cellbox.kernel.magics import LIMITS_HELP, NEEDS_LONG_LIVED_PROCESS
from kernelkit import execute, plain, running_kernel, survivors


@pytest.fixture(scope="module")
def notebook_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("notebook")


@pytest.fixture(scope="module")
def kc(notebook_dir: Path) -> Iterator[BlockingKernelClient]:
    with running_kernel("cellbox", cwd=str(notebook_dir)) as (_km, client):
        yield client


def _page(result: object) -> str:
    [page] = result.content["payload"]  # type: ignore[attr-defined]
    assert page["source"] == "page"
    return plain(page["data"]["text/plain"])


def test_timeit_and_time_report_timings(kc: BlockingKernelClient) -> None:
    timeit = execute(kc, "%timeit -n 3 -r 2 sum(range(100))").stream()
    assert timeit.endswith(" per loop (mean ± std. dev. of 2 runs, 3 loops each)\n")
    timed = execute(kc, "%time total = sum(range(10))\nprint(total)").stream()
    assert timed.startswith("CPU times: user ") and "\nWall time: " in timed and timed.endswith("\n45\n")


def test_writefile_writes_into_the_notebook_directory(kc: BlockingKernelClient, notebook_dir: Path) -> None:
    result = execute(kc, "%%writefile greet.py\nprint('hello from greet.py')")
    assert result.stream() == "Writing greet.py\n"
    assert (notebook_dir / "greet.py").read_text() == "print('hello from greet.py')\n"
    assert execute(kc, "%run greet.py").stream() == "hello from greet.py\n"


def test_shell_escape_and_bash_cell_run_in_the_cell(kc: BlockingKernelClient, notebook_dir: Path) -> None:
    (notebook_dir / "listed.txt").write_text("")
    assert execute(kc, "!echo from the shell").stream() == "from the shell\r\n"
    captured = execute(kc, "files = !ls\n'listed.txt' in files")
    assert captured.of("execute_result")[0]["data"] == {"text/plain": "True"}
    bash = execute(kc, "%%bash\necho out\necho err >&2")
    assert (bash.stream(), bash.stream("stderr")) == ("out\n", "err\n")


def test_shell_escape_is_stopped_with_the_cell(kc: BlockingKernelClient) -> None:
    mark = f"cellbox-test-{uuid.uuid4().hex}"
    result = execute(kc, f"%%limits wall=2\n!sh -c 'sleep 300; : {mark}'")
    assert result.content["ename"] == "CellTimeoutError"
    assert survivors(mark) == []


def test_limits_line_combines_with_a_cell_magic(kc: BlockingKernelClient) -> None:
    result = execute(kc, "%%limits wall=5\n%%bash\necho limited bash")
    assert result.stream() == "limited bash\n"
    assert result.metadata["cellbox"]["limits"]["wall_time"] == 5.0


def test_pip_magic_uses_the_kernels_interpreter(kc: BlockingKernelClient) -> None:
    result = execute(kc, "%pip --version")
    site = str(Path(sys.executable).parent.parent)
    first = result.stream().splitlines()[0]
    assert first.startswith("pip ") and f" from {site}/lib/" in first
    assert execute(kc, "import sys\nprint(sys.executable)").stream() == f"{sys.executable}\n"


def test_help_syntax_fills_the_pager(kc: BlockingKernelClient) -> None:
    assert _page(execute(kc, "len?")).startswith("Signature: len(obj, /)\nDocstring: Return the number of items")
    execute(kc, "def area(r):\n    'Area of a circle.'\n    return 3.14159 * r * r")
    source = _page(execute(kc, "area??"))
    assert "def area(r):\n    'Area of a circle.'\n    return 3.14159 * r * r" in source


def test_limits_magic_shows_its_help_and_the_active_limits(kc: BlockingKernelClient) -> None:
    assert LIMITS_HELP.splitlines()[0] in _page(execute(kc, "%limits?"))
    assert execute(kc, "%limits").stream() == "wall 30 s, cpu 30 s, memory 2G, output 1M\n"
    assert execute(kc, "%%limits wall=9\n%limits").stream() == "wall 9 s, cpu 30 s, memory 2G, output 1M\n"


def test_limits_line_magic_with_values_explains_where_it_belongs(kc: BlockingKernelClient) -> None:
    result = execute(kc, "x = 1\n%limits wall=5")
    assert result.status == "error"
    assert result.stream("stderr") == (
        "UsageError: %%limits works on the first line of a cell only, where cellbox reads it before the cell "
        "starts; move it there\n"
    )


def test_traceback_into_a_function_from_an_earlier_cell_shows_its_source(kc: BlockingKernelClient) -> None:
    execute(kc, "def invert(x):\n    return 1 / x")
    result = execute(kc, "invert(0)")
    assert "Cell In[" in result.traceback and "----> 2     return 1 / x" in result.traceback


def test_magics_that_need_a_long_lived_process_say_why(kc: BlockingKernelClient) -> None:
    for name in ("qtconsole", "connect_info", "subshell"):
        result = execute(kc, f"%{name}")
        assert result.status == "error"
        assert result.stream("stderr") == f"UsageError: {NEEDS_LONG_LIVED_PROCESS[name]}\n"


def test_load_ext_is_repeated_in_later_cells(kc: BlockingKernelClient) -> None:
    assert execute(kc, "%load_ext autoreload").status == "ok"
    assert execute(kc, "%autoreload 2").status == "ok"


def test_cd_and_env_are_carried(kc: BlockingKernelClient) -> None:
    # A directory inside the notebook's: the only one the session's view shows writable.
    home = execute(kc, "import os\nos.makedirs('cd_target', exist_ok=True)\nprint(os.getcwd())").stream().strip()
    execute(kc, "%cd cd_target")
    assert execute(kc, "import os\nprint(os.getcwd())").stream() == f"{home}/cd_target\n"
    execute(kc, "%cd -")
    assert execute(kc, "print(os.getcwd())").stream() == f"{home}\n"


def test_matplotlib_inline_magic_is_accepted(kc: BlockingKernelClient) -> None:
    result = execute(kc, "%matplotlib inline\nimport matplotlib.pyplot as plt\nplt.bar([1, 2], [3, 4]);")
    assert result.status == "ok"
    assert [sorted(c["data"]) for c in result.of("display_data")] == [["image/png", "text/plain"]]


def test_exit_asks_the_frontend(kc: BlockingKernelClient) -> None:
    result = execute(kc, "exit()")
    assert result.content["payload"] == [{"source": "ask_exit", "keepkernel": False}]


def test_limits_line_below_the_first_line_is_refused_before_the_cell_runs(kc: BlockingKernelClient) -> None:
    result = execute(kc, "# setting up\n%%limits wall=5\nprint('ran')")
    assert (result.content["ename"], result.content["evalue"]) == (
        "LimitError",
        "%%limits line: %%limits works on the first line of a cell only; move it there",
    )
    assert result.stream() == ""


def test_shell_escape_and_pip_work_with_isolation_on(tmp_path: Path) -> None:
    # IPython runs !cmd through a pseudo-terminal; the Landlock rules once left
    # the view's own /dev/pts out, and every !cmd and %pip failed under `auto`.
    from cellbox.sandbox.isolation import probe

    if "fs" in probe().missing:
        pytest.skip(f"the fs layer is not available here: {probe().missing['fs']}")
    notebook = tmp_path / "notebook"
    notebook.mkdir()
    for directory in (tmp_path, notebook):
        directory.chmod(0o777)  # as root, isolated cells run as nobody
    with running_kernel("cellbox", cwd=str(notebook), extra=["--CellboxKernel.isolation=auto"]) as (_km, kc):
        assert execute(kc, "!echo from the shell").stream() == "from the shell\r\n"
        pip = execute(kc, "%pip --version")
        assert pip.status == "ok", pip.traceback
        assert pip.stream().startswith("pip ")


# --------------------------------------------------------------------------- ipykernel's own magics


def _magic_names(kc: BlockingKernelClient) -> dict[str, set[str]]:
    code = "print({kind: sorted(names) for kind, names in get_ipython().magics_manager.lsmagic().items()})"
    return {kind: set(names) for kind, names in eval(execute(kc, code).stream()).items()}  # noqa: S307 - our own output


def test_every_magic_of_ipykernel_is_there() -> None:
    with running_kernel("python3") as (_km, theirs):
        expected = _magic_names(theirs)
    with running_kernel("cellbox") as (_km, ours):
        got = _magic_names(ours)
    assert {"autosave", "clear", "less", "more", "man", "store", "subshell"} <= expected["line"]
    assert expected["line"] - got["line"] == set()
    assert expected["cell"] - got["cell"] == set()
    assert got["line"] - expected["line"] == {"limits"}


def test_store_keeps_a_value_in_the_notebook_folder_across_a_restart(tmp_path: Path) -> None:
    with running_kernel("cellbox", cwd=str(tmp_path)) as (km, kc):
        assert execute(kc, "x = 1\n%store x").stream() == "Stored 'x' (int)\n"
        km.restart_kernel(now=False)
        kc.wait_for_ready(timeout=60)
        assert execute(kc, "%store -r x\nprint(x + 1)").stream() == "2\n"
    assert (tmp_path / STORE_DIR / "autorestore" / "x").is_file()


def test_matplotlib_notebook_is_refused_in_plain_words_and_changes_nothing(kc: BlockingKernelClient) -> None:
    result = execute(kc, "%matplotlib notebook")
    assert result.stream("stderr") == f"UsageError: {interactive_plots_refusal('notebook')}\n"
    assert "gui" not in result.stream("stderr")
    plotted = execute(kc, "import matplotlib.pyplot as plt\nplt.plot([1, 2]);")
    assert [sorted(c["data"]) for c in plotted.of("display_data")] == [["image/png", "text/plain"]]


def test_script_with_a_missing_program_names_the_path_it_searched(kc: BlockingKernelClient) -> None:
    path = execute(kc, "import os\nprint(os.environ['PATH'])").stream().strip()
    assert path.split(os.pathsep)[0] == os.path.dirname(sys.executable)
    result = execute(kc, "%%script cellbox-no-such-program --flag\nprint(1)")
    assert result.stream() == f"Couldn't find program: 'cellbox-no-such-program' on the cell's PATH ({path})\n"
    assert execute(kc, "%%script python3\nprint(6 * 7)").stream() == "42\n"
    assert execute(kc, "%%bash\necho still here").stream() == "still here\n"


def test_ipykernel_magics_are_declared_by_name_and_imported_on_first_use() -> None:
    # The session's shell is built while the kernel starts, and its first cell waits for it: ipykernel's
    # module (jupyter_client, zmq) is imported only when one of its magics is used.
    from ipykernel.zmqshell import KernelMagics, ZMQInteractiveShell

    from cellbox.kernel.cellshell import KERNEL_ENVIRONMENT, KERNEL_MAGICS

    assert set(KERNEL_MAGICS) == set(KernelMagics.magics["line"])
    assert KernelMagics.magics["cell"] == {}
    before = dict(os.environ)
    try:
        ZMQInteractiveShell.init_environment(None)  # type: ignore[arg-type]
        assert {name: os.environ[name] for name in KERNEL_ENVIRONMENT} == KERNEL_ENVIRONMENT
    finally:
        os.environ.clear()
        os.environ.update(before)
    code = (
        "import sys\n"
        "from cellbox.kernel import cellrunner\n"
        "cellrunner.warm_start()\n"
        "shell = cellrunner._shell\n"
        # ipykernel.zmqshell is in sys.modules as a lazy module (tqdm.auto looks for it), not yet loaded.
        "print('jupyter_client' in sys.modules, 'zmq' in sys.modules)\n"
        "shell.run_cell('%autosave 0')\n"
        "print('ipykernel.zmqshell' in sys.modules, type(shell.find_line_magic('autosave').__self__).__name__)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.splitlines() == ["False False", "Autosave disabled", "True KernelMagics"]


def test_a_refused_ipykernel_magic_stays_refused_after_its_module_is_loaded(kc: BlockingKernelClient) -> None:
    assert execute(kc, "%autosave 0").stream() == "Autosave disabled\n"
    refused = execute(kc, "%subshell")
    assert refused.stream("stderr") == f"UsageError: {NEEDS_LONG_LIVED_PROCESS['subshell']}\n"
