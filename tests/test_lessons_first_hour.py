"""A newcomer's first hour with ``cellbox lessons``: their own copy, a clean Ctrl-C, checks that say what failed.

The JupyterLab test starts the real ``cellbox lessons`` with its own ``JUPYTER_RUNTIME_DIR``, waits for the
server, starts a kernel through the server's REST API, sends SIGINT as a Ctrl-C would, and looks at what is left.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import nbformat
import psutil
import pytest
from jupyter_client.kernelspec import KernelSpecManager

from cellbox.cli import main
from cellbox.lessons import CHECK_FAILED, CHECK_PASSED, STUDENT_FILES, student_copy

ROOT = Path(__file__).resolve().parents[1]
LESSONS = ROOT / "lessons"
CELLBOX = Path(sys.executable).with_name("cellbox")


def test_student_copy_has_the_notebooks_and_helpers_but_no_solutions_or_grading(tmp_path: Path) -> None:
    target = tmp_path / "mine"
    copied = student_copy(LESSONS, target)
    notebooks = sorted(path.name for path in LESSONS.glob("[0-9][0-9]-*.ipynb"))
    assert len(notebooks) == 13
    assert sorted(path.name for path in copied) == sorted([*notebooks, *STUDENT_FILES])
    assert sorted(path.name for path in target.iterdir()) == sorted([*notebooks, *STUDENT_FILES])
    assert not (target / "solutions").exists() and not (target / "grading").exists()


def test_student_copy_keeps_the_students_work(tmp_path: Path) -> None:
    student_copy(LESSONS, tmp_path)
    work = tmp_path / "01-separate-process.ipynb"
    work.write_text("my answers")
    (tmp_path / "03-timeouts.ipynb").unlink()
    assert student_copy(LESSONS, tmp_path) == [tmp_path / "03-timeouts.ipynb"]
    assert work.read_text() == "my answers"


def test_unknown_kernel_names_the_kernels_that_exist(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["lessons", "--kernel", "nosuch"]) == 2
    known = sorted(KernelSpecManager().find_kernel_specs())
    assert "cellbox" in known
    assert capsys.readouterr().err == (
        f"cellbox lessons: error: --kernel nosuch: no such kernel; the kernels Jupyter knows here: {', '.join(known)}\n"
    )


def test_execute_says_what_each_failed_check_said(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "cellbox", "display_name": "Python 3 (cellbox)", "language": "python"}
    said = [f"{CHECK_FAILED} fib: fib(10) returned 0, expected 55", f"{CHECK_FAILED} mean: mean([]) raised ValueError"]
    nb.cells = [
        nbformat.v4.new_code_cell(f"print({said[0]!r})", metadata={"tags": ["check"]}),
        nbformat.v4.new_code_cell(f"print({CHECK_PASSED + ' first: correct'!r})", metadata={"tags": ["check"]}),
        nbformat.v4.new_code_cell(f"print({said[1]!r})", metadata={"tags": ["check"]}),
    ]
    nbformat.write(nb, tmp_path / "01-checks.ipynb")
    assert main(["lessons", "--execute", "--dir", str(tmp_path)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("01-checks.ipynb") and "FAILED" in out[0] and "checks: 1 passed, 2 failed" in out[0]
    assert [line.strip() for line in out[1:4]] == ["2 check cell(s) reported a problem:", *said]
    assert out[-1] == "cellbox lessons: 0 of 1 lessons ran cleanly"


def _wait_for(what: str, probe: object, timeout: float) -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = probe()  # type: ignore[operator]
        if found:
            return found
        time.sleep(0.2)
    raise AssertionError(f"no {what} within {timeout} s")


def _answers(url: str) -> bool:
    """Whether the server at ``url`` accepts a connection (any HTTP reply, even an error, means it listens)."""
    try:
        with urllib.request.urlopen(f"{url.rstrip('/')}/api", timeout=5):
            return True
    except urllib.error.HTTPError:
        return True
    except OSError:
        return False


def _cellbox_kernels(runtime: Path) -> list[psutil.Process]:
    """The cellbox kernel processes whose connection file lies in ``runtime``."""
    found = []
    for process in psutil.process_iter(["cmdline"]):
        cmdline = process.info["cmdline"] or []
        if "cellbox.kernel" in cmdline and any(str(runtime) in arg for arg in cmdline):
            found.append(process)
    return found


@pytest.mark.slow
def test_ctrl_c_stops_jupyterlab_its_kernels_and_leaves_no_token_file(tmp_path: Path) -> None:
    pytest.importorskip("jupyterlab")
    runtime = tmp_path / "runtime"
    env = {
        **os.environ,
        "HOME": str(tmp_path / "home"),
        "JUPYTER_RUNTIME_DIR": str(runtime),
        "BROWSER": "true",  # webbrowser "opens" the page with /bin/true
    }
    cellbox = subprocess.Popen(
        [str(CELLBOX), "lessons", "--into", str(tmp_path / "mine")],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        info_file = _wait_for("jpserver-*.json", lambda: sorted(runtime.glob("jpserver-*.json")), 90)[0]  # type: ignore[index]
        info = json.loads(info_file.read_text())
        assert Path(info["root_dir"]) == tmp_path / "mine"
        # jupyter_server writes its info file before its event loop binds the port (ServerApp.start_app, then
        # _bind_http_server as the loop's first callback): the server is ready once its port answers.
        _wait_for(f"server listening on port {info['port']}", lambda: _answers(info["url"]), 60)
        request = urllib.request.Request(
            f"{info['url'].rstrip('/')}/api/kernels",
            data=json.dumps({"name": "cellbox"}).encode(),
            headers={"Authorization": f"token {info['token']}", "Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=30) as reply:
            assert json.loads(reply.read())["name"] == "cellbox"
        kernels = _wait_for("cellbox kernel process", lambda: _cellbox_kernels(runtime), 30)
        server = psutil.Process(info["pid"])
        cellbox.send_signal(signal.SIGINT)
        output, _ = cellbox.communicate(timeout=60)
    finally:
        if cellbox.poll() is None:
            # JupyterLab and its kernels are its children: a failed test leaves none of them holding the port.
            below = psutil.Process(cellbox.pid).children(recursive=True)
            cellbox.kill()
            for process in below:
                try:
                    process.kill()
                except psutil.NoSuchProcess:
                    pass
    assert cellbox.returncode == 0, output
    assert "cellbox lessons: JupyterLab stopped" in output
    assert sorted(path.name for path in runtime.glob("jpserver-*")) == []
    assert not server.is_running()
    for kernel in kernels:  # type: ignore[attr-defined]
        assert not kernel.is_running(), f"kernel {kernel.pid} outlived JupyterLab"
    assert not (tmp_path / "mine" / "solutions").exists()
