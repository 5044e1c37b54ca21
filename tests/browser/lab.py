"""Start a throwaway JupyterLab server for the browser test, and stop it with everything it started.

The server listens on 127.0.0.1 on a free port, asks for a random token, and
keeps its configuration, runtime files, settings and workspaces in a temporary
directory, so nothing of the machine's own Jupyter set-up (or of an earlier
run) changes what the browser sees.  Option names are jupyter_server 2's
(``IdentityProvider.token`` replaced ``ServerApp.token``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil

# Seconds JupyterLab may take to answer its first request (a cold start on a busy 2-core machine takes ~10).
START_TIMEOUT = 90.0
# Seconds a clean shutdown (POST /api/shutdown: kernels first, then the server) may take.
STOP_TIMEOUT = 20.0

# JupyterLab's settings that keep the page quiet: no "get notified of news?" toast,
# no update check (the machine has no internet; the toast would cover the notebook).
QUIET_SETTINGS = {
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {
        "fetchNews": "false",
        "checkForUpdates": False,
    },
}


class LabError(RuntimeError):
    """JupyterLab did not start or did not answer; the message ends with the server's last log lines."""


@dataclasses.dataclass
class JupyterLab:
    """A running JupyterLab server.

    Attributes:
        url: the server's base URL, ``http://127.0.0.1:PORT``.
        token: the token every request must carry.
        root: the directory the server shows (notebooks are written here).
        process: the ``jupyter lab`` process.
        log: the file that receives the server's stdout and stderr.
    """

    url: str
    token: str
    root: Path
    process: subprocess.Popen[bytes]
    log: Path

    def page_url(self, path: str = "lab") -> str:
        """The address of a page of the server, with the token (which JupyterLab turns into a cookie)."""
        return f"{self.url}/{path}?token={self.token}"

    def api(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        """Call the server's REST API (``/api/...``); returns the decoded JSON reply, or ``None`` when empty.

        Raises:
            urllib.error.URLError: the server did not answer, or answered with an error status.
        """
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(
            f"{self.url}/{path.lstrip('/')}",
            data=data,
            method=method,
            headers={"Authorization": f"token {self.token}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            text = response.read()
        return json.loads(text) if text.strip() else None

    def shutdown_kernels(self) -> None:
        """Shut down every kernel of the server (one test's notebook does not run on into the next)."""
        for kernel in self.api("GET", "api/kernels"):
            self.api("DELETE", f"api/kernels/{kernel['id']}")

    def kernel_pids(self) -> set[int]:
        """Process ids of the server's kernels (its direct children)."""
        try:
            return {child.pid for child in psutil.Process(self.process.pid).children()}
        except psutil.NoSuchProcess:
            return set()

    def log_tail(self, lines: int = 30) -> str:
        """The last ``lines`` lines of the server's log, for error messages."""
        text = self.log.read_text(encoding="utf-8", errors="replace") if self.log.exists() else ""
        return "\n".join(text.splitlines()[-lines:])


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the server is told not to try others)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def lab_command(port: int, token: str, root: Path) -> list[str]:
    """The ``jupyter lab`` command line, run with this interpreter so it finds this environment's kernelspecs."""
    command = [
        sys.executable,
        "-m",
        "jupyterlab",
        "--no-browser",
        "--ServerApp.ip=127.0.0.1",
        f"--ServerApp.port={port}",
        "--ServerApp.port_retries=0",
        f"--IdentityProvider.token={token}",
        f"--ServerApp.root_dir={root}",
        "--LabApp.news_url=None",
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
    ]
    if os.geteuid() == 0:
        command.append("--allow-root")  # CI runs as root; jupyter_server refuses root without it
    return command


def lab_environment(home: Path) -> dict[str, str]:
    """This process's environment with Jupyter's and IPython's directories moved under ``home``."""
    env = dict(os.environ)
    dirs = {
        "HOME": home,
        "JUPYTER_CONFIG_DIR": home / "config",
        "JUPYTER_RUNTIME_DIR": home / "runtime",
        "JUPYTER_DATA_DIR": home / "data",
        "IPYTHONDIR": home / "ipython",
    }
    for name, path in dirs.items():
        path.mkdir(parents=True, exist_ok=True)
        env[name] = str(path)
    settings = home / "config" / "lab" / "user-settings"
    for name, values in QUIET_SETTINGS.items():
        path = settings / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values), encoding="utf-8")
    env.pop("JUPYTER_PATH", None)
    return env


def wait_until_answers(lab: JupyterLab, timeout: float = START_TIMEOUT) -> None:
    """Poll ``GET /api/status`` until the server answers with the token accepted.

    Raises:
        LabError: the server exited, or did not answer within ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if lab.process.poll() is not None:
            raise LabError(f"jupyter lab exited with status {lab.process.returncode}:\n{lab.log_tail()}")
        try:
            lab.api("GET", "api/status")
            return
        except (OSError, urllib.error.URLError):
            time.sleep(0.25)
    raise LabError(f"jupyter lab did not answer on {lab.url} within {timeout:g} s:\n{lab.log_tail()}")


@contextmanager
def running_lab(root: Path, home: Path) -> Iterator[JupyterLab]:
    """Start JupyterLab showing ``root``, with its settings under ``home``; stop it and all it started.

    Raises:
        LabError: it did not start, or a process it started was still alive after the shutdown.
    """
    port, token = free_port(), secrets.token_hex(16)
    log = home / "jupyterlab.log"
    env = lab_environment(home)
    with log.open("wb") as out:
        process = subprocess.Popen(
            lab_command(port, token, root),
            cwd=root,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group, so stop() can end all of it
        )
    lab = JupyterLab(url=f"http://127.0.0.1:{port}", token=token, root=root, process=process, log=log)
    try:
        wait_until_answers(lab)
        yield lab
    finally:
        left = stop(lab)
    if left:
        raise LabError(f"processes left after JupyterLab stopped (now killed): {left}")


def stop(lab: JupyterLab) -> list[str]:
    """Stop the server: a clean shutdown through the API, then SIGTERM, then SIGKILL.

    Returns:
        ``"pid name"`` of every process the server had started that was still alive
        after the server stopped (killed now); an empty list when nothing was left.
    """
    try:
        descendants = psutil.Process(lab.process.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        descendants = []
    try:
        lab.api("POST", "api/shutdown")
    except (OSError, urllib.error.URLError):
        pass  # already gone, or not answering: the signals below
    try:
        lab.process.wait(timeout=STOP_TIMEOUT)
    except subprocess.TimeoutExpired:
        _signal_group(lab.process.pid, signal.SIGTERM)
        try:
            lab.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            _signal_group(lab.process.pid, signal.SIGKILL)
            lab.process.wait()
    _, alive = psutil.wait_procs(descendants, timeout=5)
    left = []
    for process in alive:
        try:
            left.append(f"{process.pid} {' '.join(process.cmdline())[:120]}")
            process.kill()
        except psutil.NoSuchProcess:
            pass
    _signal_group(lab.process.pid, signal.SIGKILL)  # anything else still in the server's group
    return left


def _signal_group(pgid: int, signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except ProcessLookupError:
        pass
