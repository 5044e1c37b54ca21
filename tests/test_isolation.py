"""Isolation beyond rlimits: what a child can no longer reach, grouped by threat.

Every test runs a real child inside bubblewrap.  Where this machine lacks a
layer, the test is skipped with the reason ``cellbox doctor`` gives, and fails
instead under ``CELLBOX_REQUIRE_ALL=1`` (CI).  At the end, every adversarial
test of the core runs again with isolation on.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pwd
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import types
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import test_sandbox_adversarial as adversarial
from cellbox.cli import main
from cellbox.sandbox import SandboxError, run, start
from cellbox.sandbox import runs as sandbox
from cellbox.sandbox.cgroups import memory_cgroup_root
from cellbox.sandbox.environment import TaskDirectory
from cellbox.sandbox.isolation import (
    BWRAP_LAYERS,
    LAYERS,
    REFUSAL_WORDS,
    UNPRIVILEGED_USER,
    Isolation,
    IsolationError,
    Support,
    describe,
    landlock_abi,
    make_plan,
    probe,
    runtime_directories,
)
from cellbox.sandbox.limits import Limits
from cellbox.sandbox.outcome import Status
from conftest import missing
from sandboxkit import FORK_UNTIL_REFUSED, marker, run_python, survivors

AUTO = Isolation(mode="auto")
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="the unprivileged user switch happens only as root")


def require_layers(*layers: str) -> None:
    """Skip (fail under CELLBOX_REQUIRE_ALL) unless every layer named works on this machine."""
    support = probe()
    for layer in layers or LAYERS:
        if not support.available(layer):
            why = f"isolation layer {layer!r} is not available here ({support.missing.get(layer)})"
            missing(why, "apt-get install bubblewrap; `cellbox doctor` says what else is missing")


@pytest.fixture
def all_layers() -> None:
    require_layers()


# --------------------------------------------------------------------------- network


@pytest.fixture
def host_server() -> Iterator[int]:
    """A TCP server on the host's 127.0.0.1 that answers every connection with ``hello``; yields its port."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            with conn:
                conn.sendall(b"hello")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join()
    server.close()


CONNECT = """
import socket, sys
try:
    with socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=3) as s:
        print("connected", s.recv(5).decode())
except OSError as exc:
    print("refused", type(exc).__name__)
"""


def test_child_cannot_connect_to_a_server_on_the_hosts_loopback(all_layers: None, host_server: int) -> None:
    outcome = run([sys.executable, "-c", CONNECT, str(host_server)], isolation=AUTO)
    assert outcome.status is Status.OK, outcome.stderr
    assert outcome.stdout == "refused ConnectionRefusedError\n"  # a private loopback, with nobody listening
    assert "net" in outcome.isolation


def test_network_allowed_reaches_the_hosts_loopback(all_layers: None, host_server: int) -> None:
    outcome = run([sys.executable, "-c", CONNECT, str(host_server)], isolation=Isolation.auto(network=True))
    assert outcome.stdout == "connected hello\n"
    assert "net" not in outcome.isolation
    assert {"pid", "fs", "user"} <= set(outcome.isolation)


# --------------------------------------------------------------------------- files


@pytest.fixture
def home_secret() -> Iterator[Path]:
    """A secret file in this user's home directory, removed afterwards."""
    path = Path.home() / f".cellbox-test-secret-{uuid.uuid4().hex}"
    path.write_text("hunter2\n")
    path.chmod(0o644)  # even a file every user may read stays out of sight
    yield path
    path.unlink()


@pytest.fixture
def connection_file() -> Iterator[Path]:
    """A fake kernel connection file in Jupyter's runtime directory (``~/.local/share/jupyter/runtime``)."""
    runtime = Path.home() / ".local" / "share" / "jupyter" / "runtime"
    made = [p for p in (runtime, *runtime.parents) if not p.exists()]
    runtime.mkdir(parents=True, exist_ok=True)
    path = runtime / f"kernel-cellbox-test-{uuid.uuid4().hex}.json"
    path.write_text(json.dumps({"key": "secret-signing-key", "shell_port": 5555}))
    path.chmod(0o644)
    yield path
    path.unlink()
    for directory in sorted(made, key=lambda p: len(p.parts), reverse=True):
        try:
            directory.rmdir()
        except OSError:
            pass  # something else (a real kernel) put files there meanwhile: keep them


READ = """
import sys
for path in sys.argv[1:]:
    try:
        with open(path) as f:
            print("read", f.read().strip())
    except OSError as exc:
        print("unreadable", type(exc).__name__)
"""


def test_child_cannot_read_a_file_in_the_users_home(all_layers: None, home_secret: Path) -> None:
    without = run([sys.executable, "-c", READ, str(home_secret)])
    assert without.stdout == "read hunter2\n"  # the file is there to be read without the layers
    outcome = run([sys.executable, "-c", READ, str(home_secret)], isolation=AUTO)
    assert outcome.status is Status.OK, outcome.stderr
    assert outcome.stdout == "unreadable FileNotFoundError\n"


def test_child_cannot_read_a_kernel_connection_file(all_layers: None, connection_file: Path) -> None:
    outcome = run([sys.executable, "-c", READ, str(connection_file)], isolation=AUTO)
    assert outcome.status is Status.OK, outcome.stderr
    assert outcome.stdout == "unreadable FileNotFoundError\n"


def test_secrets_stay_covered_when_the_working_directory_is_the_home(
    all_layers: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # Worst case: a notebook opened in the home directory itself, which is then
    # bound read-write; its secrets (SSH keys, the runtime dir) are still covered.
    home = tmp_path / "home"
    files = {
        "notes.txt": "my notes",
        ".ssh/id_ed25519": "PRIVATE KEY",
        ".local/share/jupyter/runtime/kernel-1.json": '{"key": "secret-signing-key"}',
    }
    for name, text in files.items():
        (home / name).parent.mkdir(parents=True, exist_ok=True)
        (home / name).write_text(text)
    for path in [home, *home.rglob("*")]:
        path.chmod(0o777 if path.is_dir() else 0o644)  # open to all: only the view may hide them
    monkeypatch.setenv("HOME", str(home))
    outcome = run([sys.executable, "-c", READ, *(str(home / name) for name in files)], isolation=AUTO, cwd=home)
    assert outcome.status is Status.OK, outcome.stderr
    hidden = "unreadable FileNotFoundError"
    assert outcome.stdout.splitlines() == ["read my notes", hidden, hidden]
    assert (home / ".ssh" / "id_ed25519").read_text() == "PRIVATE KEY"


# Files that programs outside every sandbox run or obey, the next time the user starts them: Jupyter's
# config (the server, `jupyter execute`, nbconvert, nbgrader), the kernel's own IPython config, a kernelspec.
PLANTED = (
    ".jupyter/jupyter_config.py",
    ".ipython/profile_default/ipython_kernel_config.py",
    ".config/jupyter/jupyter_config.py",
    ".local/share/jupyter/kernels/python3/kernel.json",
    ".local/lib/python3.11/site-packages/planted.pth",
    ".local/bin/jupyter",
    ".bashrc",
)
PLANT = """
import os, sys
for path in sys.argv[1:]:
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write("import os; os.system('id > /tmp/planted')")
        print("planted")
    except PermissionError:
        print("refused")  # a cover of root's, as nobody
"""


def test_a_child_cannot_plant_config_where_the_home_has_none_yet(
    all_layers: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # A notebook opened in a fresh home (no ~/.jupyter, ~/.ipython, ~/.config yet): the view covers only
    # what exists, so the child's ~/.jupyter/jupyter_config.py would land on the host and run, outside any
    # sandbox, in the next `jupyter execute` or Jupyter server.  The missing folders are made (empty) and covered.
    home = tmp_path / "home"
    home.mkdir()
    home.chmod(0o777)
    (home / ".bashrc").write_text("")  # one that exists: covered by an empty file
    monkeypatch.setenv("HOME", str(home))
    outcome = run([sys.executable, "-c", PLANT, *(str(home / name) for name in PLANTED)], isolation=AUTO, cwd=home)
    assert outcome.status is Status.OK, outcome.stderr
    assert set(outcome.stdout.splitlines()) <= {"planted", "refused"}  # into the view's covers, gone with the run
    assert [name for name in PLANTED if (home / name).exists() and (home / name).read_text()] == []
    assert [str(p.relative_to(home)) for p in home.rglob("*") if not p.is_dir()] == [".bashrc"]
    assert (home / ".jupyter").stat().st_mode & 0o777 == 0o700  # made empty, as Jupyter would


def test_hidden_path_is_covered_even_inside_the_working_directory(all_layers: None, tmp_path: Path) -> None:
    secret = tmp_path / "connection.json"
    secret.write_text("secret-signing-key")
    secret.chmod(0o644)
    tmp_path.chmod(0o755)
    isolation = Isolation.auto(hidden=(str(secret),))
    outcome = run([sys.executable, "-c", READ, str(secret)], isolation=isolation, cwd=tmp_path)
    assert outcome.stdout == "read \n"  # an empty file stands where the secret was
    assert secret.read_text() == "secret-signing-key"


WRITE = """
import os, sys
for path in sys.argv[1:]:
    try:
        with open(path, "w") as f:
            f.write("written by the child")
        print("wrote", path)
    except OSError as exc:
        print("refused", path, type(exc).__name__)
"""


def test_child_cannot_write_outside_its_working_and_task_directories(all_layers: None, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    inside = tmp_path / "work"
    for directory in (outside, inside):
        directory.mkdir()
        directory.chmod(0o777)  # open to every user: only the view may stop the writes
    targets = {
        "outside": outside / "escape.txt",
        "prefix": Path(sys.prefix) / f"cellbox-test-{uuid.uuid4().hex}",
        "etc": Path("/etc") / f"cellbox-test-{uuid.uuid4().hex}",
        "tmp": Path("/tmp") / f"cellbox-test-{uuid.uuid4().hex}",
    }
    allowed = {"cwd": inside / "result.txt"}
    code = WRITE + "\nfor name in ('HOME', 'TMPDIR'):\n    open(os.path.join(os.environ[name], 'x'), 'w').write('1')\n"
    script = [sys.executable, "-c", code, *map(str, targets.values()), *map(str, allowed.values())]
    task = TaskDirectory.create()
    try:
        outcome = run(script, isolation=AUTO, cwd=inside, task=task)
        assert outcome.status is Status.OK, outcome.stderr
        assert [p for p in targets.values() if p.exists()] == []
        assert allowed["cwd"].read_text() == "written by the child"
        assert (task.home / "x").exists() and (task.tmp / "x").exists()
        assert f"refused {targets['outside']}" in outcome.stdout
        assert f"refused {targets['etc']}" in outcome.stdout
        # /tmp in the view is the run's own: the write succeeds there and never reaches the host.
        assert f"wrote {targets['tmp']}" in outcome.stdout
    finally:
        task.remove()


def test_home_and_tmpdir_are_inside_the_task_directory_in_the_view(all_layers: None) -> None:
    code = "import os, tempfile; print(os.environ['HOME']); print(tempfile.gettempdir()); print(os.getcwd())"
    task = TaskDirectory.create()
    try:
        outcome = run([sys.executable, "-c", code], isolation=AUTO, task=task)
        assert outcome.stdout.splitlines() == [str(task.home), str(task.tmp), str(task.work)]
    finally:
        task.remove()


@as_root
def test_working_directory_closed_to_the_unprivileged_user_is_named(all_layers: None, tmp_path: Path) -> None:
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    outcome = run(["true"], isolation=AUTO, cwd=private)
    assert outcome.status is Status.ERROR
    uid = pwd.getpwnam(UNPRIVILEGED_USER).pw_uid
    assert f"fs: the working directory {private} is not writable by {UNPRIVILEGED_USER} (uid {uid})" in outcome.notes
    assert outcome.stderr == (
        f"cellbox: user {UNPRIVILEGED_USER!r} cannot enter the working directory {private} (Permission denied)\n"
    )


# --------------------------------------------------------------------------- processes


def test_child_cannot_see_or_signal_the_parent_or_a_host_process(all_layers: None) -> None:
    mark = marker()
    helper = subprocess.Popen([sys.executable, "-c", f"import time; time.sleep(60)  # {mark}"])
    code = f"""
import os, signal
pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
needle = {mark[:10]!r}.encode() + {mark[10:]!r}.encode()  # split, so this code does not match itself
seen = [p for p in pids if needle in open(f"/proc/{{p}}/cmdline", "rb").read()]
print("seen", seen)
print("mine", sorted(pids))
for target in ({helper.pid}, {os.getpid()}):
    try:
        os.kill(target, signal.SIGKILL)
        print("signalled", target)
    except OSError as exc:
        print("cannot signal", target, type(exc).__name__)
    try:
        open(f"/proc/{{target}}/environ", "rb").read()
        print("environ readable", target)
    except OSError as exc:
        print("environ unreadable", target, type(exc).__name__)
"""
    try:
        outcome = run([sys.executable, "-c", code], isolation=AUTO)
        assert outcome.status is Status.OK, outcome.stderr
        lines = outcome.stdout.splitlines()
        assert lines[0] == "seen []"
        assert max(json.loads(lines[1].removeprefix("mine "))) < 10  # only the run's own few processes
        for target in (helper.pid, os.getpid()):
            assert f"cannot signal {target} ProcessLookupError" in lines
            assert f"environ unreadable {target} FileNotFoundError" in lines
        assert helper.poll() is None  # the host process lives on
    finally:
        helper.kill()
        helper.wait()


def test_setsid_daemon_dies_at_once_when_the_supervisor_dies(all_layers: None) -> None:
    # Without a PID namespace, a daemon that left the process group outlives a
    # supervisor killed from outside until the parent's clean-up; with one, the
    # kernel ends it with the namespace's init.
    mark = marker()
    code = f"""
import os, sys, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:  # the daemon: a fresh program whose argv alone holds the whole mark
        os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(1000)", {mark[:12]!r} + {mark[12:]!r}])
    os._exit(0)
print("ready", flush=True)
time.sleep(1000)
"""
    ready = threading.Event()
    running = start(
        [sys.executable, "-c", code], isolation=AUTO, limits=Limits(wall_time=20), on_stdout=lambda _: ready.set()
    )
    waiter = ThreadPoolExecutor(1).submit(running.wait)  # output is read by the waiting thread
    try:
        assert ready.wait(10)
        deadline = time.monotonic() + 5
        while not survivors(mark) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(survivors(mark)) == 1  # the daemon runs
        os.kill(_launcher_pid(running.proc.pid), signal.SIGKILL)
        deadline = time.monotonic() + 2
        while survivors(mark) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert survivors(mark) == []
    finally:
        running.kill()
        waiter.result(timeout=10)


def _launcher_pid(root: int) -> int:
    """The pid (in this namespace) of the launcher that runs under bwrap started as ``root``."""
    for _ in range(100):
        for name in os.listdir("/proc"):
            if name.isdigit():
                try:
                    cmdline = Path(f"/proc/{name}/cmdline").read_bytes()
                    status = Path(f"/proc/{name}/status").read_text()
                except OSError:
                    continue
                if b"_launch.py" in cmdline and b"bwrap" not in cmdline and "NSpid" in status:
                    if len(status.split("NSpid:")[1].split("\n")[0].split()) == 2 and _descends(int(name), root):
                        return int(name)
        time.sleep(0.05)
    raise AssertionError("no launcher found under bwrap")


def _descends(pid: int, root: int) -> bool:
    while pid > 1:
        if pid == root:
            return True
        pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    return False


@as_root
def test_child_of_root_runs_unprivileged_without_capabilities(all_layers: None) -> None:
    code = "import os; print(os.getuid(), os.getgid()); print(open('/proc/self/status').read())"
    outcome = run([sys.executable, "-c", code], isolation=AUTO)
    assert outcome.status is Status.OK, outcome.stderr
    nobody = pwd.getpwnam(UNPRIVILEGED_USER)
    ids, _, status = outcome.stdout.partition("\n")
    assert ids == f"{nobody.pw_uid} {nobody.pw_gid}"
    fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
    assert fields["CapEff"] == fields["CapPrm"] == fields["CapAmb"] == "0000000000000000"
    assert fields["NoNewPrivs"] == "1"
    assert outcome.as_root is False
    assert f"user:{UNPRIVILEGED_USER}" in outcome.isolation


def test_numpy_imports_in_the_view(all_layers: None) -> None:
    pytest.importorskip("numpy")
    code = "import numpy as np; print(int(np.arange(10).sum()))"
    outcome = run([sys.executable, "-c", code], isolation=AUTO, limits=Limits(wall_time=30))
    assert outcome.status is Status.OK, outcome.stderr
    assert outcome.stdout == "45\n"


def test_channel_fds_survive_bwrap(all_layers: None) -> None:
    code = """
import json, os
out, inp = os.fdopen(3, "w", buffering=1), os.fdopen(4)
out.write(json.dumps({"ask": os.environ["CELLBOX_CHANNEL"]}) + "\\n")
print(json.loads(inp.readline())["answer"])
"""
    messages: list[object] = []
    running = start([sys.executable, "-c", code], isolation=AUTO, channel=True, on_message=messages.append)
    running.send({"answer": "42"})
    outcome = running.wait()
    assert outcome.status is Status.OK, outcome.stderr
    assert messages == [{"ask": "3,4"}]
    assert outcome.stdout == "42\n"


@as_root
def test_processes_limit_holds_in_the_namespaces_without_a_pids_cgroup(
    all_layers: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # RLIMIT_NPROC counts nobody's tasks on the whole machine, while the
    # launcher sees only its PID namespace: the parent counts for it.
    monkeypatch.setattr("cellbox.sandbox.confinement.pids_cgroup_root", lambda: None)
    mark = marker()
    outcome = run_python(FORK_UNTIL_REFUSED, mark, limits=Limits(processes=10, wall_time=10), isolation=AUTO)
    assert outcome.status is Status.OK, outcome.stderr
    assert "pids-cgroup" not in outcome.isolation
    started = int(outcome.stdout.split()[2])
    assert 0 < started < 10
    assert outcome.killed_processes == started
    assert survivors(mark) == []


def test_kill_interrupt_and_send_after_the_run_ended_do_nothing() -> None:
    # A kernel's interrupt may arrive from another thread just after the cell ended.
    running = start(["true"], channel=True)
    outcome = running.wait()
    running.kill()
    running.interrupt()
    running.send({"late": True})
    assert outcome.status is Status.OK


# --------------------------------------------------------------------------- reporting and configuration


def test_outcome_lists_the_active_layers(all_layers: None) -> None:
    outcome = run(["true"], isolation=AUTO)
    assert [layer for layer in outcome.isolation if layer in LAYERS] == list(LAYERS)
    assert outcome.isolation[:4] == ("rlimits", "environment-allowlist", "process-group", "subreaper")
    assert outcome.notes == ()


def test_without_isolation_no_layer_is_listed() -> None:
    outcome = run(["true"], isolation="none")
    assert not set(outcome.isolation) & set(LAYERS)


def test_missing_bwrap_is_named_for_each_layer_it_would_give(tmp_path: Path) -> None:
    support = probe(bwrap=str(tmp_path / "no-bwrap-here"))
    # As root the user layer is a plain switch to another user, which needs no bwrap.
    switch = ["user"] if os.geteuid() == 0 else []
    assert [layer for layer in BWRAP_LAYERS if support.available(layer)] == switch
    plan = make_plan(AUTO, support, user=None)
    landlock = ["landlock"] if support.available("landlock") else []  # needs no bwrap
    assert plan.layers == [*switch, *landlock, "syscall-filter"]
    missing = [layer for layer in LAYERS if layer not in [*switch, *landlock]]
    together = ", ".join(layer for layer in missing if layer in BWRAP_LAYERS and (layer != "user" or os.geteuid() != 0))
    assert plan.notes[0].startswith(f"{together}: isolation layers not active: bwrap cannot start here")
    assert plan.missing.keys() == set(missing)


def test_strict_run_without_a_layer_is_a_one_line_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no bwrap on PATH
    monkeypatch.setattr("cellbox.sandbox.isolation.BWRAP_FALLBACK", str(tmp_path / "bwrap"))  # nor where Debian puts it
    with pytest.raises(SandboxError, match=r"^isolation is strict and the net layer is not available here: "):
        start(["true"], isolation="strict")


def test_strict_run_with_every_layer_runs(all_layers: None) -> None:
    outcome = run(["true"], isolation="strict")
    assert outcome.status is Status.OK
    assert set(LAYERS) <= set(outcome.isolation)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"mode": "paranoid"}, "isolation setting: unknown isolation mode 'paranoid'; use one of none, auto, strict"),
        ({"network": "maybe"}, "isolation setting: expected on or off for the network, got 'maybe'"),
        (
            {"layers": "net,disk"},
            "isolation setting: unknown isolation layer 'disk'; use some of net, pid, fs, user, landlock",
        ),
        ({"read_only": "data"}, "isolation setting: read_only path 'data' is not absolute; give a full path"),
    ],
)
def test_bad_isolation_option_is_one_line_naming_its_source(options: dict[str, str], message: str) -> None:
    with pytest.raises(IsolationError) as caught:
        Isolation.from_options(**options, source="isolation setting")  # type: ignore[arg-type]
    assert str(caught.value) == message


def test_options_from_text_build_the_same_setting() -> None:
    parsed = Isolation.from_options("Auto", network="on", layers="pid, fs", read_only="/data:/srv/x")
    assert parsed == Isolation(mode="auto", network=True, layers=("pid", "fs"), read_only=("/data", "/srv/x"))
    assert parsed.wanted == ("pid", "fs")
    assert Isolation.from_options("auto", network="off").wanted == LAYERS
    assert Isolation().wanted == ()
    # A setting survives a trip through JSON (the grader sends it to its workers that way).
    assert Isolation.from_options(**json.loads(json.dumps(dataclasses.asdict(parsed)))) == parsed


def test_cellbox_run_json_lists_layers(all_layers: None, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["run", "--json", "--isolation", "auto", "--", sys.executable, "-c", "print('hi')"])
    data = json.loads(capsys.readouterr().out)
    assert code == 0
    assert data["stdout"] == "hi\n"
    assert set(LAYERS) <= set(data["isolation"])


def test_cellbox_run_network_flag_drops_the_net_layer(all_layers: None, capsys: pytest.CaptureFixture[str]) -> None:
    main(["run", "--json", "--network", "--", "true"])
    data = json.loads(capsys.readouterr().out)
    assert "net" not in data["isolation"] and "pid" in data["isolation"]


def test_cellbox_run_file_outside_the_working_directory_is_in_the_view(
    all_layers: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    scripts, work = tmp_path / "scripts", tmp_path / "work"
    scripts.mkdir(mode=0o700)  # a private directory: only the file itself is shown
    work.mkdir(mode=0o777)
    script = scripts / "hello.py"
    script.write_text("print('hello from the view')")
    script.chmod(0o644)
    assert main(["run", "--json", "--isolation", "strict", "--cwd", str(work), str(script)]) == 0
    assert json.loads(capsys.readouterr().out)["stdout"] == "hello from the view\n"


def test_cellbox_run_bad_layer_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--layers", "net,moon", "--", "true"]) == 2
    err = capsys.readouterr().err
    layers = ", ".join(LAYERS)
    assert err == f"cellbox run: error: --layers: unknown isolation layer 'moon'; use some of {layers}\n"


def test_doctor_reports_every_layer(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["doctor", "--json"])
    report = json.loads(capsys.readouterr().out)
    support = probe()
    assert list(report["layers"]) == list(LAYERS)
    for layer in LAYERS:
        assert report["layers"][layer] == {"available": support.available(layer), "reason": support.missing.get(layer)}
    assert code == (0 if all(support.available(layer) for layer in LAYERS) else 1)
    assert report["syscall_filter"] == {"available": True, "reason": None}  # pyseccomp is a dependency
    assert report["disk_tmpfs"]["available"] is support.tmpfs_size
    assert report["memory_cgroup"]["available"] is (memory_cgroup_root() is not None)


def test_doctor_names_a_missing_memory_cgroup(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("cellbox.sandbox.cgroups.memory_cgroup_root", lambda: None)
    main(["doctor"])
    out = capsys.readouterr().out.splitlines()
    assert (
        "memory cgroup: no: no writable memory cgroup (root or a delegated cgroup gives one): memfds, shared "
        "mappings and what runs keep in /tmp and /dev/shm are not bounded as a whole, only by each tmpfs's size "
        "and each process's address space"
    ) in out


def test_doctor_says_why_without_bwrap(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr("cellbox.sandbox.isolation.BWRAP_FALLBACK", str(tmp_path / "bwrap"))
    assert main(["doctor"]) == 1
    out = capsys.readouterr().out
    assert "bubblewrap: not installed (apt-get install bubblewrap)" in out
    assert "net      no: bubblewrap is not installed (apt-get install bubblewrap)" in out


def test_runtime_directory_follows_jupyter_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", "/srv/jupyter/run")
    assert runtime_directories()[0] == "/srv/jupyter/run"


@pytest.mark.parametrize("layers", [(layer,) for layer in LAYERS] + [("net", "pid"), ("pid", "fs")])
def test_any_choice_of_layers_runs_python_and_reports_those_layers(all_layers: None, layers: tuple[str, ...]) -> None:
    code = "import os, json; print(json.dumps([os.getcwd() == os.environ['HOME'].replace('home', 'work')]))"
    outcome = run([sys.executable, "-c", code], isolation=Isolation.auto(layers=layers))
    if os.geteuid() == 0 and layers == ("user",):
        # As nobody without the view: the run works only if this Python is open to every user.
        note = f"user: without the fs layer, {UNPRIVILEGED_USER} must reach the interpreter and the working directory"
        assert note in " ".join(outcome.notes)
        if outcome.status is Status.ERROR:
            assert "it is not open to them" in outcome.stderr
            return
    assert outcome.status is Status.OK, outcome.stderr
    assert outcome.stdout == "[true]\n"
    # Without root, bwrap needs a user namespace; Landlock alone runs without bwrap.
    uses_bwrap = any(layer in BWRAP_LAYERS for layer in layers)
    expected = set(layers) | ({"user"} if os.geteuid() != 0 and uses_bwrap else set())
    assert {layer for layer in outcome.isolation if layer in LAYERS} == expected


def test_docs_isolation_table_lists_every_layer() -> None:
    page = (Path(__file__).resolve().parents[1] / "docs" / "isolation.md").read_text()
    rows = [line for line in page.splitlines() if line.startswith("| `")]
    assert [row.split("`")[1] for row in rows] == list(LAYERS)


def test_describe_gives_one_line_for_banners_and_reports(tmp_path: Path) -> None:
    assert describe(Isolation()) == "isolation none: rlimits and environment allowlist only"
    without_bwrap = probe(bwrap=str(tmp_path / "no-bwrap-here"))
    line = describe(Isolation.auto(network=True), without_bwrap)
    assert line.startswith("isolation auto: ")
    assert "(network allowed)" in line
    together = "pid, fs" if os.geteuid() == 0 else "pid, fs, user"  # one reason, the layers named together
    assert f"({together}: not available: bwrap cannot start here" in line
    assert "net:" not in line  # the network was allowed, so no net layer was wanted
    if probe().missing == {}:
        assert describe(AUTO) == "isolation auto: net, pid, fs, user, landlock"


# --------------------------------------------------------------------------- Landlock alone (no bubblewrap)

LANDLOCK_ONLY = Isolation.auto(layers=("landlock",))


def require_landlock_abi(version: int, feature: str) -> None:
    require_layers("landlock")
    if landlock_abi() < version:
        missing(f"Landlock ABI {landlock_abi()} has no {feature} (needs ABI {version})", "a Linux kernel 6.7 or later")


def test_landlock_alone_keeps_the_home_out_of_reach(home_secret: Path) -> None:
    require_layers("landlock")
    outcome = run([sys.executable, "-c", READ, str(home_secret)], isolation=LANDLOCK_ONLY)
    assert outcome.status is Status.OK, outcome.stderr
    assert outcome.stdout == "unreadable PermissionError\n"  # even for root: Landlock ignores capabilities
    assert "landlock" in outcome.isolation and not {"net", "pid", "fs"} & set(outcome.isolation)


def test_landlock_alone_refuses_tcp_when_the_network_is_off(host_server: int) -> None:
    require_landlock_abi(4, "TCP rules")
    outcome = run([sys.executable, "-c", CONNECT, str(host_server)], isolation=LANDLOCK_ONLY)
    assert outcome.stdout == "refused PermissionError\n"
    allowed = run(
        [sys.executable, "-c", CONNECT, str(host_server)], isolation=Isolation.auto(layers=("landlock",), network=True)
    )
    assert allowed.stdout == "connected hello\n"


def test_landlock_alone_keeps_signals_inside_the_run() -> None:
    require_landlock_abi(6, "signal scoping")
    helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    code = f"""
import os, signal
try:
    os.kill({helper.pid}, signal.SIGKILL)  # root may signal any process; the Landlock domain may not
except OSError as exc:
    print(type(exc).__name__)
"""
    try:
        outcome = run([sys.executable, "-c", code], isolation=LANDLOCK_ONLY)
        assert outcome.stdout == "PermissionError\n"
        assert helper.poll() is None
    finally:
        helper.kill()
        helper.wait()


def test_landlock_alone_keeps_disks_and_other_devices_out_of_reach() -> None:
    require_layers("landlock")
    disks = sorted(str(p) for p in Path("/dev").iterdir() if p.is_block_device())[:3]
    code = READ.replace("f.read().strip()", "len(f.read(1))")  # one byte is enough to know
    outcome = run([sys.executable, "-c", code, *disks, "/dev/null"], isolation=LANDLOCK_ONLY)
    assert outcome.status is Status.OK, outcome.stderr
    assert outcome.stdout.splitlines() == ["unreadable PermissionError"] * len(disks) + ["read 0"]


# --------------------------------------------------------------------------- the core's adversarial tests, isolated


@pytest.fixture
def isolated_by_default(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Turn every layer on for runs that do not choose, as if it were the core's default.

    As root the command runs as an unprivileged user, which needs a working
    directory it may write (see docs/isolation.md): the test's
    ``tmp_path`` is opened to it, as a user would open a notebook directory.
    """
    require_layers()
    monkeypatch.setattr(sandbox, "DEFAULT_ISOLATION", AUTO)
    tmp_path.chmod(0o777)


def _isolated_copy(test: Callable[..., None]) -> Callable[..., None]:
    """A copy of ``test`` (same code, fixtures and parameters) that also uses ``isolated_by_default``.

    A copy, because marking the original would turn isolation on in its own module too. The copies are marked
    slow: the default test command runs each attack once (test_sandbox_adversarial.py), CI under every layer.
    """
    copy = types.FunctionType(test.__code__, test.__globals__, test.__name__, test.__defaults__, test.__closure__)
    copy.__dict__.update(test.__dict__)
    marks = [pytest.mark.usefixtures("isolated_by_default").mark, pytest.mark.slow.mark]
    copy.pytestmark = [*getattr(test, "pytestmark", []), *marks]  # type: ignore[attr-defined]
    return copy


# Each adversarial test of the core is collected again here, under the fixture above.
ADVERSARIAL = [name for name in vars(adversarial) if name.startswith("test_")]
globals().update({f"{name}_isolated": _isolated_copy(getattr(adversarial, name)) for name in ADVERSARIAL})


def test_adversarial_tests_run_again_isolated_and_unchanged_in_their_own_module() -> None:
    assert len(ADVERSARIAL) > 10
    assert all(f"{name}_isolated" in globals() for name in ADVERSARIAL)
    marks = [m.name for name in ADVERSARIAL for m in getattr(getattr(adversarial, name), "pytestmark", [])]
    assert "usefixtures" not in marks
    assert not set(run_python("print(1)").isolation) & set(LAYERS)


# --------------------------------------------------------------------------- root without bubblewrap

ROOT_WITHOUT_POWERS = """
import ctypes, os, stat
libc = ctypes.CDLL(None)
print("uid", os.getuid(), os.geteuid())
with open("/proc/self/status") as f:
    fields = dict(line.split(":", 1) for line in f)
print("caps", fields["CapEff"].strip(), "no_new_privs", fields["NoNewPrivs"].strip())
for name, attempt in (
    ("shadow", lambda: open("/etc/shadow").read(1)),
    ("shm", lambda: open("/dev/shm/cellbox-test-left", "w").write("x")),
    ("device", lambda: os.mknod("disk", stat.S_IFBLK | 0o600, os.makedev(8, 0))),
    ("parent-environ", lambda: open(f"/proc/{PARENT}/environ", "rb").read(1)),
):
    try:
        attempt()
        print(name, "done")
    except OSError as exc:
        print(name, type(exc).__name__)
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="checks a run of root")
def test_root_run_without_bubblewrap_keeps_no_powers(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no bwrap on PATH
    monkeypatch.setattr("cellbox.sandbox.isolation.BWRAP_FALLBACK", str(tmp_path / "bwrap"))  # nor where Debian puts it
    code = ROOT_WITHOUT_POWERS.replace("PARENT", str(os.getpid()))
    # Debian's Python and a folder open to all: without the fs layer nobody must reach them by itself.
    with tempfile.TemporaryDirectory(dir="/tmp") as work:
        os.chmod(work, 0o1777)
        outcome = run(["/usr/bin/python3", "-c", code], isolation="auto", cwd=work)
    assert outcome.status is Status.OK, outcome.stderr
    nobody = pwd.getpwnam(UNPRIVILEGED_USER).pw_uid
    assert outcome.stdout.splitlines() == [
        f"uid {nobody} {nobody}",
        "caps 0000000000000000 no_new_privs 1",
        "shadow PermissionError",
        "shm PermissionError",
        "device PermissionError",
        "parent-environ PermissionError",
    ]
    assert not outcome.as_root
    assert {"user", "landlock", "signal-scope", "syscall-filter"} <= set(outcome.isolation)
    assert not {"net", "pid", "fs"} & set(outcome.isolation)
    assert not [note for note in outcome.notes if "still reach the host" in note]
    assert not os.path.exists("/dev/shm/cellbox-test-left")


# ------------------------------------------------------------------ no socket, shared memory or device to the host

TO_THE_HOST = """
import ctypes, errno, os, socket, stat, sys
udp_port, unix_path, shm_name = int(sys.argv[1]), sys.argv[2], sys.argv[3]
libc = ctypes.CDLL(None, use_errno=True)


def attempt(name, action):
    try:
        action()
        print(name, "done")
    except OSError as exc:
        print(name, type(exc).__name__)


def udp():
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.sendto(b"escaped", ("127.0.0.1", udp_port))


def unix():
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(2)
        s.connect(unix_path)
        s.sendall(b"escaped")


def raw_unix():
    # socket(2) itself, with the family's high bits set: the kernel reads an int, so this is AF_UNIX.
    fd = libc.syscall(41, ctypes.c_ulong((1 << 32) | socket.AF_UNIX), socket.SOCK_STREAM, 0)
    if fd < 0:
        raise OSError(ctypes.get_errno(), "socket")
    address = b"\\x01\\x00" + unix_path.encode() + b"\\x00"  # struct sockaddr_un
    if libc.connect(fd, address, len(address)) != 0:
        raise OSError(ctypes.get_errno(), "connect")
    os.write(fd, b"escaped")


def shm():
    with open("/dev/shm/" + shm_name, "w") as f:
        f.write("left")


attempt("udp", udp)
attempt("unix", unix)
attempt("raw-unix", raw_unix)
attempt("shm", shm)
attempt("device", lambda: os.mknod("disk", stat.S_IFBLK | 0o600, os.makedev(8, 0)))
attempt("pair", lambda: socket.socketpair()[0].close())
"""


@pytest.fixture
def host_listeners(tmp_path: Path) -> Iterator[tuple[socket.socket, socket.socket, str, str]]:
    """A UDP socket on the host's 127.0.0.1 and a unix socket listening in the host's /tmp, open to every user."""
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("127.0.0.1", 0))
    udp.setblocking(False)
    folder = Path(tempfile.mkdtemp(dir="/tmp"))
    folder.chmod(0o755)
    path = str(folder / "host.sock")
    unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    unix.bind(path)
    os.chmod(path, 0o777)
    unix.listen()
    unix.setblocking(False)
    shm_name = f"cellbox-test-{uuid.uuid4().hex}"
    try:
        yield udp, unix, path, shm_name
    finally:
        udp.close()
        unix.close()
        os.unlink(path)
        folder.rmdir()
        if os.path.exists(f"/dev/shm/{shm_name}"):
            os.unlink(f"/dev/shm/{shm_name}")


def _received(udp: socket.socket, unix: socket.socket) -> list[str]:
    """What reached the host's listeners: ``udp`` and ``unix`` for each that got anything."""
    got = []
    try:
        udp.recv(64)
        got.append("udp")
    except BlockingIOError:
        pass
    try:
        conn, _ = unix.accept()
        conn.close()
        got.append("unix")
    except BlockingIOError:
        pass
    return got


def hide_bubblewrap(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Runs of this test find no bwrap: not on PATH, nor where Debian puts it."""
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr("cellbox.sandbox.isolation.BWRAP_FALLBACK", str(tmp_path / "bwrap"))


@pytest.mark.parametrize("keep_root", [False, True], ids=["default", "keep-root"])
def test_without_bubblewrap_no_socket_shared_memory_or_device_reaches_the_host(
    keep_root: bool,
    host_listeners: tuple[socket.socket, socket.socket, str, str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    require_layers("landlock")
    udp, unix, path, shm_name = host_listeners
    hide_bubblewrap(monkeypatch, tmp_path / "bin")
    argv = ["/usr/bin/python3", "-c", TO_THE_HOST, str(udp.getsockname()[1]), path, shm_name]
    # Debian's Python and a folder open to all: without the fs layer nobody must reach them by itself.
    with tempfile.TemporaryDirectory(dir="/tmp") as folder:
        work = Path(folder)
        work.chmod(0o1777)
        outcome = run(argv, isolation=Isolation.auto(keep_root=keep_root), cwd=folder)
        assert not (work / "disk").exists()
    assert outcome.status is Status.OK, outcome.stderr
    assert outcome.stdout.splitlines() == [
        "udp PermissionError",
        "unix PermissionError",
        "raw-unix PermissionError",
        "shm PermissionError",
        "device PermissionError",
        "pair done",
    ]
    assert _received(udp, unix) == []
    assert not os.path.exists(f"/dev/shm/{shm_name}")
    assert {"landlock", "syscall-filter"} <= set(outcome.isolation)
    assert not [note for note in outcome.notes if "still reach the host" in note]


def test_with_bubblewrap_no_socket_shared_memory_or_device_reaches_the_host(
    all_layers: None, host_listeners: tuple[socket.socket, socket.socket, str, str], tmp_path: Path
) -> None:
    udp, unix, path, shm_name = host_listeners
    tmp_path.chmod(0o777)
    argv = ["/usr/bin/python3", "-c", TO_THE_HOST, str(udp.getsockname()[1]), path, shm_name]
    outcome = run(argv, isolation="auto", cwd=str(tmp_path))
    assert outcome.status is Status.OK, outcome.stderr
    # The datagram goes to the run's own loopback; the host's /tmp and /dev/shm are not in the view (a family
    # number with high bits set, as the raw call gives it, is refused outright by the filter every run has).
    assert outcome.stdout.splitlines() == [
        "udp done",
        "unix FileNotFoundError",
        "raw-unix PermissionError",
        "shm done",
        "device PermissionError",
        "pair done",
    ]
    assert _received(udp, unix) == []
    assert not os.path.exists(f"/dev/shm/{shm_name}")
    assert not (tmp_path / "disk").exists()
    # The net and fs layers keep sockets in; the filter is there for the walls no namespace gives (ptrace,
    # set-user-ID files), and for what bwrap leaves open (nested user namespaces of a run root hands to
    # another user, or under a bwrap before 0.8).
    assert "syscall-filter" in outcome.isolation


def test_without_libseccomp_the_notes_say_sockets_reach_the_host(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    def no_library(*_args: object, **_kwargs: object) -> bytes:
        raise OSError("libseccomp is not available (Unable to find libseccomp)")

    monkeypatch.setattr("cellbox.sandbox.isolation.socket_filter", no_library)
    plan = make_plan(AUTO, probe(bwrap=str(tmp_path / "no-bwrap-here")), user=None)
    assert "syscall-filter" not in plan.layers
    assert plan.sockets == (True, True)
    assert (
        "net: UDP and unix sockets still reach the host (Landlock refuses TCP only; "
        "no syscall filter: libseccomp is not available (Unable to find libseccomp))"
    ) in plan.notes
    refused = "syscall filter: not applied (libseccomp is not available (Unable to find libseccomp)): "
    assert any(note.startswith(refused + REFUSAL_WORDS["ipc"]) for note in plan.notes), plan.notes


def test_syscall_filter_refuses_io_uring_whose_sockets_bypass_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    require_layers("landlock")
    hide_bubblewrap(monkeypatch, tmp_path / "bin")
    code = """
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
params = ctypes.create_string_buffer(120)  # struct io_uring_params
print(libc.syscall(425, 4, params), ctypes.get_errno())  # io_uring_setup
"""
    outcome = run(["/usr/bin/python3", "-c", code], isolation="auto", cwd="/")
    assert outcome.stdout == "-1 1\n"  # EPERM


@pytest.mark.skipif(os.geteuid() != 0, reason="checks a run of root")
def test_root_kept_without_bubblewrap_keeps_uid_0_and_no_powers(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    require_landlock_abi(6, "signal scoping")
    hide_bubblewrap(monkeypatch, tmp_path / "bin")
    helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])  # a process of root's
    code = (
        ROOT_WITHOUT_POWERS.replace("PARENT", str(os.getpid()))
        + f"""
for name, attempt in (
    ("kill-root-process", lambda: os.kill({helper.pid}, 9)),
    ("setuid", lambda: os.setuid(65534)),
    ("chown", lambda: os.chown(".", 65534, 65534)),
    ("etc", lambda: open("/etc/cellbox-test-left", "w")),
):
    try:
        attempt()
        print(name, "done")
    except OSError as exc:
        print(name, type(exc).__name__)
"""
    )
    try:
        outcome = run([sys.executable, "-c", code], isolation=Isolation.auto(keep_root=True), cwd=str(tmp_path))
        assert helper.poll() is None
    finally:
        helper.kill()
        helper.wait()
    assert outcome.status is Status.OK, outcome.stderr
    assert outcome.stdout.splitlines() == [
        "uid 0 0",
        "caps 0000000000000000 no_new_privs 1",
        "shadow PermissionError",
        "shm PermissionError",
        "device PermissionError",
        "parent-environ PermissionError",
        "kill-root-process PermissionError",
        "setuid PermissionError",
        "chown PermissionError",
        "etc PermissionError",
    ]
    assert not outcome.as_root
    assert not os.path.exists("/etc/cellbox-test-left")
    assert {"user", "landlock", "signal-scope", "syscall-filter"} <= set(outcome.isolation)


def test_root_kept_without_bubblewrap_or_signal_scope_runs_as_nobody(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("cellbox.sandbox.isolation.landlock_abi", lambda: 5)
    support = Support(bwrap=None, as_root=True, missing={})  # root, Landlock, no bubblewrap
    plan = make_plan(Isolation.auto(keep_root=True), support, user=None)
    assert plan.user == UNPRIVILEGED_USER
    assert (
        "user: runs as nobody, not uid 0 without capabilities: without bubblewrap and Landlock's signal scope "
        "(ABI 6, Linux 6.12) uid 0 could still signal root's processes"
    ) in plan.notes
    monkeypatch.setattr("cellbox.sandbox.isolation.landlock_abi", lambda: 6)
    assert make_plan(Isolation.auto(keep_root=True), support, user=None).user is None


# --------------------------------------------------------------------------- the filter's walls without bubblewrap

WALL_LIMITS = Limits(wall_time=20, cpu_time=10)


CHANGE_FILE_ATTRIBUTES = """
import os, sys
folder = sys.argv[1]
secret = folder + "/secret"
for name, action in (
    ("chmod-dir", lambda: os.chmod(folder, 0o777)),
    ("chmod-secret", lambda: os.chmod(secret, 0o666)),
    ("setuid", lambda: os.chmod(secret, 0o4755)),
    ("fchmod", lambda: os.fchmod(os.open(folder, os.O_RDONLY), 0o777)),
    ("chown", lambda: os.chown(secret, 65534, 65534)),
    ("setxattr", lambda: os.setxattr(secret, "user.cellbox", b"1")),
    ("acl", lambda: os.setxattr(folder, "system.posix_acl_access", b"\\x02\\x00\\x00\\x00")),
    ("utime", lambda: os.utime(secret, (0, 0))),
):
    try:
        action()
        print(name, "done")
    except OSError as exc:
        print(name, type(exc).__name__)
"""


@as_root
def test_root_kept_without_bubblewrap_cannot_change_modes_owners_xattrs_or_times(
    victim: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # uid 0 without capabilities still owns every root file, and chmod(2) needs only ownership:
    # Landlock has no right for modes, owners, extended attributes or times; the filter refuses them.
    require_landlock_abi(6, "keep_root without bubblewrap needs Landlock's signal scope")
    hide_bubblewrap(monkeypatch, tmp_path / "bin")
    work = tmp_path / "work"
    work.mkdir()
    before = (victim / "secret").stat()
    outcome = run(
        ["/usr/bin/python3", "-c", CHANGE_FILE_ATTRIBUTES, str(victim)],
        isolation=Isolation.auto(keep_root=True),
        cwd=str(work),
        limits=WALL_LIMITS,
    )
    assert outcome.status is Status.OK, outcome.stderr
    names = ["chmod-dir", "chmod-secret", "setuid", "fchmod", "chown", "setxattr", "acl", "utime"]
    assert outcome.stdout.splitlines() == [f"{name} PermissionError" for name in names]
    after = (victim / "secret").stat()
    assert (after.st_mode, after.st_uid, after.st_mtime_ns) == (before.st_mode, before.st_uid, before.st_mtime_ns)
    assert victim.stat().st_mode & 0o777 == 0o755
    assert "user: as root without bubblewrap the program may not change modes, owners, ACLs or times of files" in (
        outcome.notes
    )


def test_a_run_that_may_keep_root_powers_of_ownership_gets_no_file_attribute_rule(tmp_path: Path) -> None:
    # With bubblewrap's user namespace, or as nobody, ownership of root's files is not the program's.
    no_bwrap = probe(bwrap=str(tmp_path / "no-bwrap-here"))
    plan = make_plan(AUTO, no_bwrap, user=None)
    assert "file-attributes" not in plan.refuse
    assert "ipc" in plan.refuse
    assert make_plan(Isolation(mode="none"), no_bwrap, user=None).refuse == ()
    root = Support(None, True, {"net": "x", "pid": "x", "fs": "x"})
    assert "file-attributes" not in make_plan(AUTO, root, user=None).refuse  # runs as nobody


DATAGRAMS_TO_THE_HOST = """
import errno, socket, sys
path = sys.argv[1]
for kind in ("SOCK_DGRAM", "SOCK_SEQPACKET"):
    try:
        a, _ = socket.socketpair(socket.AF_UNIX, getattr(socket, kind) | socket.SOCK_NONBLOCK)
        a.sendto(b"escaped-" + kind.encode(), path)
        print(kind, "done")
    except OSError as exc:
        print(kind, type(exc).__name__)
a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
for name, action in (
    ("stream-sendto", lambda: a.sendto(b"escaped-sendto", path)),
    ("stream-sendmsg", lambda: a.sendmsg([b"escaped-sendmsg"], [], 0, path)),
    ("stream-connect", lambda: a.connect(path)),
):
    try:
        action()
        print(name, "done")
    except OSError as exc:
        print(name, errno.errorcode[exc.errno])
a.send(b"pair")
print("pair", b.recv(4).decode())
"""


@pytest.mark.parametrize("keep_root", [False, True], ids=["default", "keep-root"])
def test_without_bubblewrap_no_datagram_reaches_a_host_unix_socket(
    keep_root: bool, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # An unconnected end of a datagram socketpair reaches any pathname socket of the host by sendto()
    # or connect(); a stream or seqpacket pair is connected: an address is refused (EISCONN) or ignored.
    if keep_root and os.geteuid() != 0:
        pytest.skip("keep_root is root's")
    require_landlock_abi(6 if keep_root else 1, "Landlock")
    hide_bubblewrap(monkeypatch, tmp_path / "bin")
    folder = Path(tempfile.mkdtemp(dir="/tmp"))
    folder.chmod(0o755)
    path = str(folder / "host.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    listener.bind(path)
    os.chmod(path, 0o777)
    listener.setblocking(False)
    got = []
    try:
        with tempfile.TemporaryDirectory(dir="/tmp") as work:
            os.chmod(work, 0o1777)
            outcome = run(
                ["/usr/bin/python3", "-c", DATAGRAMS_TO_THE_HOST, path],
                isolation=Isolation.auto(keep_root=keep_root),
                cwd=work,
                limits=WALL_LIMITS,
            )
        while True:
            try:
                got.append(listener.recv(64))
            except BlockingIOError:
                break
    finally:
        listener.close()
        os.unlink(path)
        folder.rmdir()
    assert outcome.status is Status.OK, outcome.stderr
    assert outcome.stdout.splitlines() == [
        "SOCK_DGRAM PermissionError",
        "SOCK_SEQPACKET done",  # to its own peer: the keeper and its snapshots talk over such pairs
        "stream-sendto EISCONN",
        "stream-sendmsg EISCONN",
        "stream-connect EPERM",
        "pair pair",
    ]
    assert "syscall-filter" in outcome.isolation
    assert got == []


PIPES_POOLS_AND_THREADS = """
import multiprocessing, subprocess, threading

def square(x):
    return x * x

parent, child = multiprocessing.Pipe()
child.send("pipe")
print(parent.recv())
process = multiprocessing.get_context("fork").Process(target=square, args=(3,))
process.start()
process.join()
print("process", process.exitcode)
print(subprocess.run(["/bin/echo", "subprocess"], capture_output=True, text=True).stdout.strip())
thread = threading.Thread(target=print, args=("thread",))
thread.start()
thread.join()
try:
    multiprocessing.get_context("fork").Pool(2)
except OSError as exc:
    print("pool", type(exc).__name__)
"""


def test_without_bubblewrap_pipes_processes_subprocess_and_threads_work_under_the_filter(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # They use pipes, stream socketpairs, clone(2) (clone3 answers ENOSYS, glibc falls back).  A Pool
    # needs a POSIX semaphore in the host's /dev/shm, which Landlock keeps out of reach without the fs layer.
    require_landlock_abi(1, "Landlock")
    hide_bubblewrap(monkeypatch, tmp_path / "bin")
    with tempfile.TemporaryDirectory(dir="/tmp") as work:
        os.chmod(work, 0o1777)
        outcome = run(
            ["/usr/bin/python3", "-c", PIPES_POOLS_AND_THREADS],
            isolation=Isolation.auto(keep_root=os.geteuid() == 0 and landlock_abi() >= 6),
            cwd=work,
            limits=WALL_LIMITS,
        )
    assert outcome.status is Status.OK, outcome.stderr
    assert outcome.stdout.splitlines() == ["pipe", "process 0", "subprocess", "thread", "pool PermissionError"]
    assert "syscall-filter" in outcome.isolation


SYSV_MQUEUE_AND_KEYS = """
import ctypes, sys
libc = ctypes.CDLL(None, use_errno=True)
rt = ctypes.CDLL("librt.so.1", use_errno=True)
key, description = int(sys.argv[1]), sys.argv[2]
calls = (
    ("shmget", lambda: libc.shmget(key, 4096, 0o1000 | 0o666)),
    ("msgget", lambda: libc.msgget(key, 0o1000 | 0o666)),
    ("semget", lambda: libc.semget(key, 1, 0o1000 | 0o666)),
    ("mq_open", lambda: rt.mq_open(b"/" + description.encode(), 0o100 | 2, 0o666, None)),
    # add_key(2) into the user's keyring (KEY_SPEC_USER_KEYRING), shared by every process of this uid.
    ("add_key", lambda: libc.syscall(248, b"user", description.encode(), b"left", 4, ctypes.c_int(-4))),
    ("request_key", lambda: libc.syscall(249, b"user", description.encode(), None, 0)),
    ("keyctl", lambda: libc.syscall(250, 0, ctypes.c_int(-4), 0)),  # KEYCTL_GET_KEYRING_ID
)
for name, call in calls:
    result = call()
    print(name, "done" if result >= 0 else ctypes.get_errno())
"""


def _sysv_keys(kind: str) -> set[int]:
    """The keys of the host's System V objects of ``kind`` (shm, msg, sem), as ipcs(1) reads them."""
    with open(f"/proc/sysvipc/{kind}") as f:
        return {int(line.split()[0]) for line in f.read().splitlines()[1:] if line.strip()}


def test_without_bubblewrap_no_ipc_object_or_key_outlives_the_run(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # No IPC namespace without bubblewrap: System V objects, POSIX message queues and the user's keys
    # would stay after the run, shared with every process of its uid; the filter refuses them (EPERM).
    require_landlock_abi(1, "Landlock")
    hide_bubblewrap(monkeypatch, tmp_path / "bin")
    key = 0x0CE11000 | (uuid.uuid4().int & 0xFFF)
    description = f"cellbox-test-{uuid.uuid4().hex}"
    with tempfile.TemporaryDirectory(dir="/tmp") as work:
        os.chmod(work, 0o1777)
        outcome = run(
            ["/usr/bin/python3", "-c", SYSV_MQUEUE_AND_KEYS, str(key), description],
            isolation=Isolation.auto(keep_root=os.geteuid() == 0 and landlock_abi() >= 6),
            cwd=work,
            limits=WALL_LIMITS,
        )
    assert outcome.status is Status.OK, outcome.stderr
    names = ["shmget", "msgget", "semget", "mq_open", "add_key", "request_key", "keyctl"]
    assert outcome.stdout.splitlines() == [f"{name} 1" for name in names]  # EPERM
    assert all(key not in _sysv_keys(kind) for kind in ("shm", "msg", "sem"))
    assert not os.path.exists(f"/dev/mqueue/{description}")
    assert "syscall-filter" in outcome.isolation


NESTED_USER_NAMESPACE = """
import ctypes, os, subprocess, threading
libc = ctypes.CDLL(None, use_errno=True)
if libc.unshare(0x10000000) != 0:  # CLONE_NEWUSER
    print("unshare refused", ctypes.get_errno())
else:
    print("unshare done CapEff", open("/proc/self/status").read().split("CapEff:")[1].split()[0])
done = subprocess.run(["unshare", "-U", "true"], capture_output=True)
print("unshare -U", "refused" if done.returncode else "done")
thread = threading.Thread(target=print, args=("thread",))
thread.start()
thread.join()
"""


@pytest.mark.parametrize("how", ["bwrap", "bwrap-as-nobody", "no-bwrap"])
def test_a_run_cannot_regain_capabilities_in_a_user_namespace(
    how: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # A user namespace of its own gives a program a full capability set there.  bubblewrap refuses
    # nested ones (--disable-userns) in the run's own user namespace; a run root hands to nobody, and
    # a run without bubblewrap, get the filter's refusal of CLONE_NEWUSER.
    bubblewrap = how != "no-bwrap"
    if how == "bwrap-as-nobody" and os.geteuid() != 0:
        pytest.skip("checks a run root hands to another user")
    if bubblewrap:
        require_layers("user")
        version = subprocess.run([str(probe().bwrap), "--version"], capture_output=True, text=True).stdout.split()
        if tuple(int(part) for part in version[-1].split(".")[:2]) < (0, 8):
            pytest.skip(f"bwrap {version[-1]} has no --disable-userns (0.8 and later)")
    else:
        require_landlock_abi(1, "Landlock")
        hide_bubblewrap(monkeypatch, tmp_path / "bin")
    work = tmp_path / "work"
    work.mkdir()
    work.chmod(0o777)
    keep_root = os.geteuid() == 0 and landlock_abi() >= 6 and how != "bwrap-as-nobody"
    outcome = run(
        [sys.executable if bubblewrap else "/usr/bin/python3", "-c", NESTED_USER_NAMESPACE],
        isolation=Isolation.auto(keep_root=keep_root),
        cwd=str(work),
        limits=WALL_LIMITS,
    )
    assert outcome.status is Status.OK, outcome.stderr
    lines = outcome.stdout.splitlines()
    assert lines[0].startswith("unshare refused"), lines
    assert lines[1:] == ["unshare -U refused", "thread"]
