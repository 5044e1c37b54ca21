"""A class on one server: real JupyterHub, two system users, the cellbox kernel through the Hub's proxy.

The Hub (JupyterHub from PyPI, its proxy configurable-http-proxy from npm) listens on 127.0.0.1 and spawns
each user's single-user server with ``LocalProcessSpawner``, as that user, configured as docs/jupyterhub.md
tells an instructor to (the cellbox kernel as the default kernel). The test starts both servers through the
Hub's REST API with an admin service's token, then, with each user's own token and through the proxy only,
starts a kernel with the single-user server's REST API and runs cells over its websocket (the Jupyter
messaging spec over a websocket, jupyter_server's JSON protocol).

Creating the users needs root: a normal user's run skips, and .ci/run's unprivileged pass leaves these tests
out (``-m 'not browser and not hub'``). The users' servers run this virtualenv's Python: where it lies under a
folder they may not enter (a pyenv under /root), the tests skip, and .ci/run runs them once more, as root, from
the copy it made with /usr/bin/python3 for its unprivileged pass, with ``CELLBOX_REQUIRE_HUB=1``.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest
import requests
import websocket

from conftest import find_tool

pytestmark = [pytest.mark.slow, pytest.mark.hub]

ROOT = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent
# Set by .ci/run for its run of these tests from a virtualenv every user may reach: an unreachable one fails.
REQUIRE_HUB_VARIABLE = "CELLBOX_REQUIRE_HUB"
USERS = ("cbx-hub-a", "cbx-hub-b")
SERVICE = "cellbox-test"
TIMEOUT = 180.0  # seconds for the Hub, a server or a kernel to come up on a busy 2-core machine
CELL_TIMEOUT = 60.0  # seconds for one cell's reply; the slowest cell (a 2 s wall stop) needs a few
SECRET = "the other user's secret\n"
CLASS_KERNEL = "cellbox-class"
CLASS_WALL = 3  # seconds: the class kernelspec's wall_time, which every cell gets without a %%limits line


# ------------------------------------------------------------------------------------------------ the class


def free_port() -> int:
    """A TCP port of 127.0.0.1 that nothing listens on now (the kernel picks it: bind to port 0)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def closed_to_others(path: Path) -> Path | None:
    """The first folder on the way to ``path``, or ``path`` itself, that other users cannot enter or run, or None."""
    for step in [*reversed(path.parents), path]:
        if not step.stat().st_mode & stat.S_IXOTH:
            return step
    return None


def remove_user(name: str) -> None:
    """Kill what user ``name`` still runs (by pid) and remove the user with its home (userdel -r)."""
    try:
        uid = pwd.getpwnam(name).pw_uid
    except KeyError:
        return
    left = [p for p in psutil.process_iter(["uids"]) if p.info["uids"] and p.info["uids"].real == uid]
    for process in left:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()
    psutil.wait_procs(left, timeout=10)
    subprocess.run(["userdel", "--remove", name], check=False, capture_output=True)


@pytest.fixture(scope="module")
def students() -> Iterator[dict[str, pwd.struct_passwd]]:
    """Two system users with homes (``useradd -m``), each with a file only its owner may read (mode 0600)."""
    if os.geteuid() != 0:
        pytest.skip("a class's system users are created with useradd, which needs root (run the hub tests as root)")
    # The servers run this virtualenv's jupyterhub-singleuser, its Python and the clone's cellbox, as each user.
    for what in (VENV_BIN, Path(os.path.realpath(sys.executable)), ROOT / "kernel" / "cellbox"):
        if closed := closed_to_others(what):
            unreachable = (
                f"the students' servers cannot run {what}: {closed} has mode {stat.filemode(closed.stat().st_mode)}; "
                "run the tests from a virtualenv of a Python and a clone every user may reach "
                "(/usr/bin/python3 -m venv .venv; .ci/run runs them so, from its unprivileged user's copy)"
            )
            # CI's own python3 may live where no other user may enter (a pyenv under /root): .ci/run then runs
            # these tests again, as root, from the copy it makes with /usr/bin/python3, and asks for them there.
            if os.environ.get(REQUIRE_HUB_VARIABLE, "") not in ("", "0"):
                pytest.fail(unreachable)
            pytest.skip(unreachable)
    entries = {}
    for name in USERS:
        remove_user(name)  # what a run that was killed left
        subprocess.run(["useradd", "--create-home", "--shell", "/bin/bash", name], check=True, capture_output=True)
        entry = pwd.getpwnam(name)
        secret = Path(entry.pw_dir) / "secret.txt"
        secret.write_text(SECRET)
        os.chown(secret, entry.pw_uid, entry.pw_gid)
        secret.chmod(0o600)
        entries[name] = entry
    try:
        yield entries
    finally:
        for name in USERS:
            remove_user(name)


@dataclass
class Hub:
    """A running JupyterHub: the proxy's public URL and an admin service's API token."""

    url: str
    token: str
    process: subprocess.Popen[bytes]
    log: Path
    user_tokens: dict[str, str] = field(default_factory=dict)

    def api(self, method: str, path: str, token: str | None = None, **kwargs: Any) -> requests.Response:
        """A request to the Hub's REST API (``/hub/api/...``) through the proxy, as the service or ``token``."""
        headers = {"Authorization": f"token {token or self.token}"}
        return requests.request(method, f"{self.url}/hub/api/{path}", headers=headers, timeout=30, **kwargs)


HUB_CONFIG = """\
c = get_config()  # noqa
c.JupyterHub.bind_url = "http://127.0.0.1:{proxy_port}"
c.JupyterHub.hub_bind_url = "http://127.0.0.1:{hub_port}"
c.ConfigurableHTTPProxy.api_url = "http://127.0.0.1:{api_port}"
c.ConfigurableHTTPProxy.command = [{proxy!r}]
c.ConfigurableHTTPProxy.pid_file = {state!r} + "/proxy.pid"
c.JupyterHub.db_url = "sqlite:///" + {state!r} + "/jupyterhub.sqlite"
c.JupyterHub.cookie_secret_file = {state!r} + "/cookie_secret"
c.JupyterHub.pid_file = {state!r} + "/jupyterhub.pid"

# As docs/jupyterhub.md sets up a class: local system users, each server started as its user, cellbox's kernel
# the default one.
c.JupyterHub.spawner_class = "jupyterhub.spawner.LocalProcessSpawner"
c.Authenticator.allowed_users = {users!r}
c.Spawner.cmd = [{singleuser!r}]
c.Spawner.args = [
    "--MappingKernelManager.default_kernel_name={kernel}",
    "--KernelSpecManager.allowed_kernelspecs={kernel}",
    "--ServerApp.terminals_enabled=False",
]
# The class's kernelspec, with the instructor's limits (docs/jupyterhub.md installs it with --sys-prefix).
c.Spawner.environment = {{"JUPYTER_PATH": {jupyter_path!r}}}
c.Spawner.start_timeout = {timeout}
c.Spawner.http_timeout = {timeout}

c.JupyterHub.services = [{{"name": {service!r}, "api_token": {token!r}}}]
c.JupyterHub.load_roles = [{{"name": "admin", "services": [{service!r}]}}]
"""


def hub_environment() -> dict[str, str]:
    """The Hub's environment: this one without what ties it to this test's Jupyter (JUPYTER_*, JPY_*)."""
    return {key: value for key, value in os.environ.items() if not key.startswith(("JUPYTER", "JPY_"))}


def wait_until(what: str, ready: Any, timeout: float = TIMEOUT, log: Path | None = None) -> Any:
    """Call ``ready()`` every 0.2 s until it returns something true; return that, or fail after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(requests.ConnectionError):
            if result := ready():
                return result
        time.sleep(0.2)
    tail = log.read_text()[-3000:] if log else ""
    pytest.fail(f"{what} after {timeout} s\n{tail}")


def stop_hub(process: subprocess.Popen[bytes], state: Path) -> None:
    """Stop the Hub as Ctrl-C does (it stops the servers and its proxy), then kill whatever of it is left."""
    tree = []
    with contextlib.suppress(psutil.NoSuchProcess):
        tree = [psutil.Process(process.pid), *psutil.Process(process.pid).children(recursive=True)]
    proxy_pid = state / "proxy.pid"
    if proxy_pid.exists():
        with contextlib.suppress(psutil.NoSuchProcess, ValueError):
            tree.append(psutil.Process(int(proxy_pid.read_text())))
    process.send_signal(signal.SIGINT)
    try:
        process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    for left in tree:
        with contextlib.suppress(psutil.NoSuchProcess):
            left.kill()
    psutil.wait_procs(tree, timeout=10)


@pytest.fixture(scope="module")
def class_kernelspec() -> Iterator[Path]:
    """The instructor's kernelspec ``cellbox-class`` (``cellbox install``), in a Jupyter data folder all may read."""
    folder = Path(tempfile.mkdtemp(prefix="cellbox-class-", dir="/var/tmp"))
    try:
        folder.chmod(0o755)
        command = ["install", "--prefix", str(folder), "--name", CLASS_KERNEL, "--wall", str(CLASS_WALL)]
        subprocess.run([str(VENV_BIN / "cellbox"), *command], check=True, capture_output=True)
        yield folder / "share" / "jupyter"
    finally:
        shutil.rmtree(folder)


@pytest.fixture(scope="module")
def hub(
    students: dict[str, pwd.struct_passwd], class_kernelspec: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Hub]:
    """JupyterHub on 127.0.0.1 (free ports), with both users' servers started through its REST API."""
    proxy = find_tool("configurable-http-proxy", install="npm install -g configurable-http-proxy")
    state = tmp_path_factory.mktemp("hub")
    token = secrets.token_hex(32)
    config = state / "jupyterhub_config.py"
    proxy_port = free_port()
    config.write_text(
        HUB_CONFIG.format(
            proxy_port=proxy_port,
            hub_port=free_port(),
            api_port=free_port(),
            proxy=proxy,
            state=str(state),
            users=set(students),
            singleuser=str(VENV_BIN / "jupyterhub-singleuser"),
            kernel=CLASS_KERNEL,
            jupyter_path=str(class_kernelspec),
            timeout=int(TIMEOUT),
            service=SERVICE,
            token=token,
        )
    )
    log = state / "jupyterhub.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [str(VENV_BIN / "jupyterhub"), "-f", str(config)],
            cwd=state,
            env=hub_environment(),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: the test's Ctrl-C does not reach it half-way
        )
    running = Hub(f"http://127.0.0.1:{proxy_port}", token, process, log)
    try:
        wait_until("the Hub did not answer", lambda: process.poll() is None and running.api("GET", "").ok, log=log)
        for name in students:
            started = running.api("POST", f"users/{name}/server")
            assert started.status_code in (201, 202), started.text
        for name in students:
            wait_until(f"{name}'s server was not ready", lambda name=name: server_ready(running, name), log=log)
            made = running.api("POST", f"users/{name}/tokens", json={"note": "cellbox test", "expires_in": 3600})
            assert made.status_code == 201, made.text
            running.user_tokens[name] = made.json()["token"]
        yield running
    finally:
        stop_hub(process, state)


def server_ready(hub: Hub, name: str) -> bool:
    """Whether user ``name``'s default server is up, as the Hub says (GET /hub/api/users/NAME)."""
    reply = hub.api("GET", f"users/{name}")
    assert reply.ok, reply.text
    server = reply.json()["servers"].get("")
    if hub.process.poll() is not None:
        pytest.fail(f"the Hub ended with status {hub.process.returncode}\n{hub.log.read_text()[-3000:]}")
    return bool(server and server["ready"])


# ------------------------------------------------------------------------------- a kernel through the proxy


@dataclass
class Cell:
    """What one execute_request gave: the reply's content, and the iopub outputs (streams and errors)."""

    reply: dict[str, Any]
    outputs: list[dict[str, Any]]

    def stream(self, name: str = "stdout") -> str:
        return "".join(
            o["content"]["text"] for o in self.outputs if o["msg_type"] == "stream" and o["content"]["name"] == name
        )

    @property
    def errors(self) -> list[str]:
        return [o["content"]["ename"] for o in self.outputs if o["msg_type"] == "error"]


class RemoteKernel:
    """A kernel of a user's single-user server, reached through the Hub's proxy with that user's token."""

    def __init__(self, hub: Hub, user: str) -> None:
        self.base = f"{hub.url}/user/{user}/api"
        self.headers = {"Authorization": f"token {hub.user_tokens[user]}"}
        # No kernel name: the server's default, which the Hub's configuration makes cellbox.
        started = requests.post(f"{self.base}/kernels", headers=self.headers, json={}, timeout=TIMEOUT)
        assert started.status_code == 201, started.text
        self.model = started.json()
        self.session = uuid.uuid4().hex
        url = f"{self.base}/kernels/{self.model['id']}/channels?session_id={self.session}".replace("http", "ws", 1)
        self.socket = websocket.create_connection(
            url, header=[f"{k}: {v}" for k, v in self.headers.items()], timeout=TIMEOUT, suppress_origin=True
        )

    def execute(self, code: str) -> Cell:
        """Send an execute_request on the shell channel; collect iopub until idle, and the execute_reply."""
        msg_id = uuid.uuid4().hex
        header = {
            "msg_id": msg_id,
            "msg_type": "execute_request",
            "session": self.session,
            "username": "test",
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "version": "5.3",
        }
        content = {"code": code, "silent": False, "store_history": True, "user_expressions": {}, "allow_stdin": False}
        message = {"header": header, "parent_header": {}, "metadata": {}, "content": content, "channel": "shell"}
        self.socket.send(json.dumps(message))
        outputs: list[dict[str, Any]] = []
        reply: dict[str, Any] | None = None
        idle = False
        deadline = time.monotonic() + CELL_TIMEOUT
        while not (idle and reply is not None):
            assert time.monotonic() < deadline, f"no reply in {CELL_TIMEOUT} s to {code!r}: {outputs}"
            incoming = json.loads(self.socket.recv())
            if incoming.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            kind = incoming["msg_type"]
            if incoming["channel"] == "shell" and kind == "execute_reply":
                reply = incoming["content"]
            elif kind == "status":
                idle = incoming["content"]["execution_state"] == "idle"
            elif kind in ("stream", "error", "execute_result"):
                outputs.append(incoming)
        return Cell(reply, outputs)

    def close(self) -> None:
        self.socket.close()
        requests.delete(f"{self.base}/kernels/{self.model['id']}", headers=self.headers, timeout=TIMEOUT)


@pytest.fixture(scope="module")
def kernels(hub: Hub) -> Iterator[dict[str, RemoteKernel]]:
    """A cellbox kernel on each user's server."""
    started: dict[str, RemoteKernel] = {}
    try:
        for name in USERS:
            started[name] = RemoteKernel(hub, name)
        yield started
    finally:
        for kernel in started.values():
            kernel.close()


# ------------------------------------------------------------------------------------------------ the tests


def test_every_server_offers_the_class_kernel_alone_as_its_default_and_no_terminal(
    kernels: dict[str, RemoteKernel],
) -> None:
    assert {name: kernel.model["name"] for name, kernel in kernels.items()} == {name: CLASS_KERNEL for name in USERS}
    for kernel in kernels.values():
        specs = requests.get(f"{kernel.base}/kernelspecs", headers=kernel.headers, timeout=TIMEOUT).json()
        assert (specs["default"], sorted(specs["kernelspecs"])) == (CLASS_KERNEL, [CLASS_KERNEL])
        terminal = requests.post(f"{kernel.base}/terminals", headers=kernel.headers, timeout=TIMEOUT)
        assert terminal.status_code == 404, terminal.text


def test_the_class_wall_time_stops_a_cell_without_a_limits_line(kernels: dict[str, RemoteKernel]) -> None:
    stopped = kernels[USERS[1]].execute("while True:\n    pass")
    assert stopped.reply["ename"] == "CellTimeoutError", stopped.outputs
    assert stopped.reply["evalue"].startswith(f"the cell ran past its {CLASS_WALL} s wall-clock limit;")


def test_each_cell_runs_as_its_user(kernels: dict[str, RemoteKernel], students: dict[str, pwd.struct_passwd]) -> None:
    for name, kernel in kernels.items():
        cell = kernel.execute("import os\nprint(os.getuid(), os.getgid())")
        assert cell.reply["status"] == "ok", cell.outputs
        assert cell.stream() == f"{students[name].pw_uid} {students[name].pw_gid}\n"


def test_a_wall_limit_stops_a_spinning_cell_and_the_kernel_lives_on(kernels: dict[str, RemoteKernel]) -> None:
    kernel = kernels[USERS[0]]
    stopped = kernel.execute("%%limits wall=2\nwhile True:\n    pass")
    assert stopped.reply["status"] == "error" and stopped.reply["ename"] == "CellTimeoutError", stopped.outputs
    assert stopped.errors == ["CellTimeoutError"]
    after = kernel.execute("print('still here')")
    assert after.reply["status"] == "ok" and after.stream() == "still here\n"


READ_OTHER_HOME = """\
from pathlib import Path
home = Path({home!r})
for what, attempt in (("list", lambda: sorted(p.name for p in home.iterdir())),
                      ("read", lambda: (home / "secret.txt").read_text())):
    try:
        print(what, "got", attempt())
    except OSError as error:
        print(what, type(error).__name__)
"""


def test_a_cell_cannot_read_the_other_users_home(
    kernels: dict[str, RemoteKernel], students: dict[str, pwd.struct_passwd]
) -> None:
    (owner, other) = USERS
    # The file is there and readable by its owner (so a refusal below is the fence, not a missing file).
    assert (Path(students[other].pw_dir) / "secret.txt").read_text() == SECRET
    for reader, victim in ((owner, other), (other, owner)):
        cell = kernels[reader].execute(READ_OTHER_HOME.format(home=students[victim].pw_dir))
        assert cell.reply["status"] == "ok", cell.outputs
        said = dict(line.split(" ", 1) for line in cell.stream().splitlines())
        assert said["list"] in ("FileNotFoundError", "PermissionError"), said
        assert said["read"] in ("FileNotFoundError", "PermissionError"), said
    own = kernels[owner].execute("print(open('secret.txt').read(), end='')")  # the cell's folder is its home
    assert own.reply["status"] == "ok" and own.stream() == SECRET, own.outputs


def test_state_carries_from_one_cell_to_the_next(kernels: dict[str, RemoteKernel]) -> None:
    kernel = kernels[USERS[1]]
    assert kernel.execute("answer = 6 * 7").reply["status"] == "ok"
    cell = kernel.execute("print(answer)")
    assert cell.reply["status"] == "ok" and cell.stream() == "42\n", cell.outputs


WRITE_KERNELSPEC = """\
import json, os
folder = {folder!r}
try:
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "kernel.json"), "w") as spec:
        json.dump({{"argv": ["python3", "-m", "ipykernel", "-f", "{{connection_file}}"], "display_name": "mine"}}, spec)
    print("wrote")
except OSError as error:
    print(type(error).__name__)
"""


def test_a_student_cannot_put_a_kernel_of_their_own_in_place_of_the_class_kernel(
    kernels: dict[str, RemoteKernel], students: dict[str, pwd.struct_passwd]
) -> None:
    # A kernelspec of the same name in ~/.local/share/jupyter/kernels comes before the class's on Jupyter's path:
    # with terminals off, neither a cell nor the file browser may write one there.
    name = USERS[0]
    folder = Path(students[name].pw_dir) / ".local" / "share" / "jupyter" / "kernels" / CLASS_KERNEL
    cell = kernels[name].execute(WRITE_KERNELSPEC.format(folder=str(folder)))
    assert cell.reply["status"] == "ok", cell.outputs
    assert not (folder / "kernel.json").exists(), cell.stream()
    kernel = kernels[name]
    path = f".local/share/jupyter/kernels/{CLASS_KERNEL}/kernel.json"
    body = {"type": "file", "format": "text", "content": "{}"}
    put = requests.put(f"{kernel.base}/contents/{path}", headers=kernel.headers, json=body, timeout=TIMEOUT)
    assert 400 <= put.status_code < 500, put.text
    assert not (folder / "kernel.json").exists()


def test_a_student_cannot_plant_config_for_their_next_server(
    kernels: dict[str, RemoteKernel], students: dict[str, pwd.struct_passwd]
) -> None:
    # ~/.jupyter/jupyter_server_config.py would run in the student's next server, outside every sandbox (and
    # turn terminals back on).  The view covers ~/.jupyter (a home without one yet: tests/test_isolation.py's
    # test_a_child_cannot_plant_config_where_the_home_has_none_yet).
    name = USERS[0]
    config = Path(students[name].pw_dir) / ".jupyter" / "jupyter_server_config.py"
    code = (
        f"import os\nos.makedirs({str(config.parent)!r}, exist_ok=True)\n"
        f"open({str(config)!r}, 'w').write('c.ServerApp.terminals_enabled = True')\nprint('wrote')"
    )
    cell = kernels[name].execute(code)
    assert cell.reply["status"] == "ok", cell.outputs
    assert not config.exists()
