"""The fork server: every run forked from a warm server starts pristine, under the same limits.

Two groups: what only a fork server could get wrong (state, randomness, fds,
threads carried from one run to the next; the server dying or hanging; a
changed environment), and every adversarial test of the core collected again
with its programs run as ``python -m cellbox._testprog CODE`` through a fork
server (the pattern of test_isolation's isolated copies).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import types
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import sandboxkit
import test_sandbox_adversarial as adversarial
from cellbox.sandbox import SandboxError, cgroups, run, start
from cellbox.sandbox.environment import TaskDirectory
from cellbox.sandbox.limits import Limits
from cellbox.sandbox.outcome import Status
from cellbox.sandbox.session import ForkServer

FORKED_LIMITS = Limits(wall_time=10, cpu_time=10, memory=1024**3)


@pytest.fixture(scope="module")
def server() -> Iterator[ForkServer]:
    """A fork server with only the runner's own modules (small, so 256M memory limits still fork)."""
    with ForkServer(preload=[]) as fork_server:
        assert fork_server.wait_ready(60)
        yield fork_server


def forked(server: ForkServer, code: str, **options: object) -> tuple[str, str, tuple[str, ...]]:
    """Run ``code`` through ``server``; return stdout, stderr and the isolation list."""
    limits = options.pop("limits", FORKED_LIMITS)
    outcome = run([sys.executable, "-m", "cellbox._testprog", code], forkserver=server, limits=limits, **options)  # type: ignore[arg-type]
    assert "forkserver" in outcome.isolation, outcome.notes
    return outcome.stdout, outcome.stderr, outcome.isolation


# --------------------------------------------------------------------------- pristine runs


def test_module_attribute_changed_by_one_run_is_not_seen_by_the_next(server: ForkServer) -> None:
    forked(server, "import json; json.MARK = 'left'; import os; os.sep = '!'")
    out, err, _ = forked(server, "import json, os; print(getattr(json, 'MARK', 'clean'), os.sep)")
    assert out == "clean /\n", err


def test_monkeypatch_of_a_builtin_is_not_seen_by_the_next_run(server: ForkServer) -> None:
    forked(server, "import builtins; builtins.print = lambda *a, **k: None")
    out, _, _ = forked(server, "print('still printing')")
    assert out == "still printing\n"


def test_open_file_and_thread_of_one_run_are_gone_in_the_next(server: ForkServer) -> None:
    code = """
import os, threading
before = sorted(int(fd) for fd in os.listdir('/proc/self/fd'))
f = open(os.devnull)
threading.Thread(target=lambda: __import__('time').sleep(0.2), daemon=True).start()
print(before, threading.active_count())
"""
    first, _, _ = forked(server, code)
    second, _, _ = forked(server, code)
    assert first == second
    fds, threads = second.rsplit(" ", 1)
    assert fds == "[0, 1, 2, 3]"  # the three streams and listdir's own
    assert threads.strip() == "2"  # the main thread and the one just started


def test_two_runs_see_different_random_numbers(server: ForkServer) -> None:
    code = "import random; print(random.getrandbits(64))"
    values = {forked(server, code)[0] for _ in range(3)}
    assert len(values) == 3


def test_numpy_global_generator_is_reseeded_in_every_run() -> None:
    pytest.importorskip("numpy")
    with ForkServer(preload=["numpy"]) as numpy_server:
        assert numpy_server.wait_ready(60)
        assert numpy_server.loaded == ["numpy"]
        code = "import numpy; print(numpy.random.randint(0, 2**62))"
        values = {forked(numpy_server, code)[0] for _ in range(3)}
    assert len(values) == 3


def test_run_starts_in_its_working_directory_with_it_first_on_the_path(server: ForkServer, tmp_path: Path) -> None:
    (tmp_path / "localmod.py").write_text("WHERE = 'local'\n")
    out, err, _ = forked(server, "import os, localmod; print(os.getcwd(), localmod.WHERE)", cwd=tmp_path)
    assert out == f"{tmp_path} local\n", err


def test_channel_and_stdin_reach_a_forked_run(server: ForkServer) -> None:
    code = """
import json, os
out = os.fdopen(3, 'w')
out.write(json.dumps({'got': input()}) + '\\n'); out.flush()
"""
    messages: list[object] = []
    run(
        [sys.executable, "-m", "cellbox._testprog", code],
        forkserver=server,
        limits=FORKED_LIMITS,
        channel=True,
        stdin="hello\n",
        on_message=messages.append,
    )
    assert messages == [{"got": "hello"}]


def test_exit_status_and_keyboard_interrupt_are_those_of_python_m(server: ForkServer) -> None:
    argv = [sys.executable, "-m", "cellbox._testprog"]
    assert run([*argv, "raise SystemExit(3)"], forkserver=server).exit_code == 3
    failed = run([*argv, "1/0"], forkserver=server)
    assert (failed.exit_code, failed.stderr.splitlines()[-1]) == (1, "ZeroDivisionError: division by zero")
    interrupted = run([*argv, "raise KeyboardInterrupt"], forkserver=server)
    assert interrupted.signal == "SIGINT"


def test_interrupt_from_another_thread_reaches_a_forked_run(server: ForkServer) -> None:
    code = "import time\nprint('started', flush=True)\ntime.sleep(30)"
    handle = start([sys.executable, "-m", "cellbox._testprog", code], forkserver=server, limits=FORKED_LIMITS)
    threading.Timer(0.5, handle.interrupt).start()
    outcome = handle.wait()
    assert outcome.status is Status.INTERRUPTED
    assert outcome.stdout == "started\n"
    assert outcome.stderr.splitlines()[-1] == "KeyboardInterrupt"
    assert outcome.wall_time < 3


# --------------------------------------------------------------------------- falling back to spawn


def test_command_that_is_not_python_m_is_spawned(server: ForkServer) -> None:
    outcome = run([sys.executable, "-c", "print(1)"], forkserver=server)
    assert outcome.stdout == "1\n"
    assert "forkserver" not in outcome.isolation
    assert outcome.notes == ()


def test_memory_limit_below_the_server_size_is_spawned_with_a_note(server: ForkServer) -> None:
    outcome = run(
        [sys.executable, "-m", "cellbox._testprog", "print(1)"], forkserver=server, limits=Limits(memory=64 * 1024**2)
    )
    assert outcome.stdout == "1\n"
    assert "forkserver" not in outcome.isolation
    assert any("memory limit" in note for note in outcome.notes)


def test_dead_server_is_restarted_and_the_run_still_happens() -> None:
    with ForkServer(preload=[]) as fork_server:
        assert fork_server.wait_ready(60)
        first = fork_server.pid
        assert first is not None
        os.kill(first, signal.SIGKILL)
        # Until the session has seen its keeper's end (a fixed 0.3 s was too short at a load of 13: the run then
        # found it by a failed request, and the session was replaced without counting a restart).
        fork_server._server.thread.join(60)  # type: ignore[union-attr]
        outcome = run([sys.executable, "-m", "cellbox._testprog", "print(2)"], forkserver=fork_server)
        assert outcome.stdout == "2\n"
        assert outcome.status is Status.OK
        assert fork_server.wait_ready(60)
        assert fork_server.pid not in (None, first)
        assert fork_server.restarts >= 1


def test_hung_server_times_out_the_hand_off_and_the_run_is_spawned() -> None:
    with ForkServer(preload=[], handoff_timeout=0.5) as fork_server:
        assert fork_server.wait_ready(60)
        assert fork_server.pid is not None
        os.kill(fork_server.pid, signal.SIGSTOP)
        started = time.monotonic()
        outcome = run([sys.executable, "-m", "cellbox._testprog", "print(3)"], forkserver=fork_server)
        assert time.monotonic() - started < 5
        assert outcome.stdout == "3\n"
        assert "forkserver" not in outcome.isolation
        assert any(note.startswith("forkserver:") for note in outcome.notes)
        # A session replaced because it stopped answering counts as a restart, as one that ended does.
        assert fork_server.restarts == 1
        assert fork_server.lost is not None and fork_server.lost.startswith("the session stopped answering")


def test_changed_site_directory_restarts_the_server(monkeypatch: pytest.MonkeyPatch) -> None:
    import cellbox.sandbox.session as forkserver_module

    with ForkServer(preload=[]) as fork_server:
        assert fork_server.wait_ready(60)
        first = fork_server.pid
        fingerprint = forkserver_module._site_fingerprint()
        # As after `pip install` from a cell: a site directory's time changes.
        monkeypatch.setattr(forkserver_module, "_site_fingerprint", lambda: (*fingerprint, ("/new", 1.0)))
        run([sys.executable, "-m", "cellbox._testprog", "pass"], forkserver=fork_server)
        assert fork_server.restarts == 1
        assert fork_server.wait_ready(60)
        assert fork_server.pid != first


def test_forkserver_start_method_without_a_server_is_a_clear_error() -> None:
    with pytest.raises(SandboxError, match="needs a fork server"):
        run([sys.executable, "-m", "cellbox._testprog", "pass"], start_method="forkserver")


def test_closed_server_leaves_no_process_behind() -> None:
    with TaskDirectory.create() as task:
        fork_server = ForkServer(preload=[], task=task)
        assert fork_server.wait_ready(60)
        launcher = fork_server.launcher_pid
        pids = [fork_server.pid]
        fork_server.close()
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and any(_alive(pid) for pid in [launcher, *pids]):
            time.sleep(0.05)
        assert not any(_alive(pid) for pid in [launcher, *pids])


def _alive(pid: int | None) -> bool:
    if pid is None:
        return False
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rpartition(b")")[2].split()[0] != b"Z"
    except OSError:
        return False


# --------------------------------------------------------------------------- ahead of the run: cgroup and shell


def test_forked_runs_are_held_by_the_sessions_pids_cgroup_set_to_each_runs_limit(server: ForkServer) -> None:
    root = cgroups.pids_cgroup_root()
    if root is None:
        pytest.skip("needs a writable pids cgroup (root); without one RLIMIT_NPROC is used, tested elsewhere")
    code = f"path = {str(root)!r} + open('/proc/self/cgroup').read().split('pids:')[1].split()[0]\n"
    code += "print(path, int(open(path + '/pids.max').read()) - int(open(path + '/pids.current').read()))"
    seen = []
    for processes in (7, 9):
        limits = Limits(wall_time=10, cpu_time=10, memory=1024**3, processes=processes)
        stdout, _stderr, isolation = forked(server, code, limits=limits)
        path, room = stdout.split()
        assert "pids-cgroup" in isolation
        seen.append((path, int(room)))
    # One cgroup for the session; room for the run's processes beyond the command itself.
    assert seen[0][0] == seen[1][0]
    # Never more than the run's limit; at most two fewer (a middle process, a zombie not reaped yet).
    assert [limit - 2 <= room <= limit for (_path, room), limit in zip(seen, (7, 9), strict=True)] == [True, True]


def test_cgroups_left_by_a_dead_process_are_found_and_ours_are_not(tmp_path: Path) -> None:
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_name, own_name = f"cellbox-{dead.stdout.strip()}-0123456789ab", f"cellbox-{os.getpid()}-0123456789ab"
    names = [dead_name, own_name, "cellbox-x-1", "other"]
    for name in names:
        (tmp_path / name).mkdir()
    later = time.time() + cgroups.STALE_CGROUP_AGE + 1
    assert [path.name for path in cgroups.stale_cgroups(tmp_path, now=later)] == [names[0]]
    assert cgroups.stale_cgroups(tmp_path) == []  # too new: perhaps a run that has not moved in yet


def test_left_behind_cgroup_with_a_process_in_it_is_not_removed_or_killed() -> None:
    # A maker that looks dead here may be alive in another pid namespace: the sweep only rmdirs.
    root = cgroups.pids_cgroup_root()
    if root is None:
        pytest.skip("needs a writable pids cgroup (root)")
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    path = root / f"cellbox-{dead.stdout.strip()}-0123456789ab"
    path.mkdir()
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        (path / "cgroup.procs").write_text(str(sleeper.pid))
        os.utime(path, (time.time() - 3600, time.time() - 3600))
        assert path in cgroups.stale_cgroups(root)
        remover = cgroups.CgroupRemover()
        remover.start(root)
        assert remover.drain(10)
        assert (path.exists(), sleeper.poll()) == (True, None)
    finally:
        sleeper.kill()
        sleeper.wait()
        time.sleep(0.1)
        path.rmdir()


WARM_SHELL_CHECK = """
import json, os, sys
os.environ["MPLBACKEND"] = "agg"
from cellbox.kernel import cellrunner
channel = cellrunner.Channel(",".join(map(str, (os.pipe()[1], os.pipe()[0]))))
spec = {"code": "pass", "history_length": 1, "history_digest": cellrunner.history_digest([""]), "limits": {}}
if sys.argv[1] == "warm":
    cellrunner.warm_start()
os.chdir(sys.argv[2])
shell = cellrunner._session_shell(channel, spec)
print(json.dumps({
    "names": sorted(shell.user_ns), "hidden": sorted(shell.user_ns_hidden),
    "dh": [str(p) for p in shell.history_manager.dir_hist], "channel": shell.channel is channel,
    "result": shell.run_cell("a = 1\\na + 1").result,
}))
"""


def test_shell_built_ahead_of_the_first_cell_is_the_shell_the_cell_would_build(tmp_path: Path) -> None:
    seen = {}
    for how in ("warm", "cold"):
        argv = [sys.executable, "-c", WARM_SHELL_CHECK, how, str(tmp_path)]
        done = subprocess.run(argv, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        seen[how] = json.loads(done.stdout)
    assert seen["warm"] == seen["cold"]
    warm = seen["warm"]
    assert (warm["dh"], warm["result"], warm["channel"]) == ([str(tmp_path)], 2, True)


def test_warmed_module_found_ahead_runs_with_the_globals_python_m_gives_it(tmp_path: Path) -> None:
    code = "import sys\nprint(__name__, __file__, __spec__.name, __package__, sys.argv)\n"
    code += "print(sys.modules['__main__'].__file__)"
    argv = [sys.executable, "-m", "cellbox._testprog", code, "arg"]
    spawned = run(argv, cwd=str(tmp_path))
    with ForkServer(preload=["cellbox._testprog"], warm="cellbox._testprog") as fork_server:
        assert fork_server.wait_ready(60)
        forked = run(argv, forkserver=fork_server, cwd=str(tmp_path))
    assert "forkserver" in forked.isolation
    assert (forked.stdout, forked.stderr) == (spawned.stdout, spawned.stderr)
    assert spawned.stdout.startswith("__main__ ")


# --------------------------------------------------------------------------- the core's adversarial tests, forked


@pytest.fixture
def forked_by_default(server: ForkServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run every program of the test through ``server`` (sandboxkit.run_python asserts it was forked)."""
    monkeypatch.setattr(sandboxkit, "FORKSERVER", server)


def _forked_copy(test: Callable[..., None]) -> Callable[..., None]:
    """A copy of ``test`` (same code, fixtures and parameters) that also uses ``forked_by_default``.

    The copies are marked slow: the default test command runs each attack once (test_sandbox_adversarial.py),
    CI forked too.
    """
    copy = types.FunctionType(test.__code__, test.__globals__, test.__name__, test.__defaults__, test.__closure__)
    copy.__dict__.update(test.__dict__)
    marks = [pytest.mark.usefixtures("forked_by_default").mark, pytest.mark.slow.mark]
    copy.pytestmark = [*getattr(test, "pytestmark", []), *marks]  # type: ignore[attr-defined]
    return copy


# A memory limit below the server's own size cannot be forked (the run is
# spawned, with a note): these programs are about a fresh import under one.
# Likewise 2,000 thread stacks under 256M: forked, the run starts with the base's address space and
# runs out while CPython starts a thread, whose start then never returns (timed_out, not memory_limit).
SPAWN_ONLY = {
    "test_numpy_import_under_a_tight_memory_limit_is_memory_limit",
    "test_thread_that_cannot_reserve_its_stack_is_memory_limit_with_a_note",
}
ADVERSARIAL = [name for name in vars(adversarial) if name.startswith("test_") and name not in SPAWN_ONLY]
globals().update({f"{name}_forked": _forked_copy(getattr(adversarial, name)) for name in ADVERSARIAL})


def test_first_run_is_spawned_and_starts_the_server_when_it_ends() -> None:
    with TaskDirectory.create() as task:
        fork_server = ForkServer(preload=[], task=task)
        try:
            argv = [sys.executable, "-m", "cellbox._testprog", "print(4)"]
            first = run(argv, forkserver=fork_server, task=task)
            assert (first.stdout, "forkserver" in first.isolation, first.notes) == ("4\n", False, ())
            assert fork_server.launcher_pid is not None  # started by the end of the first run
            assert fork_server.wait_ready(60)
            assert "forkserver" in run(argv, forkserver=fork_server, task=task).isolation
        finally:
            fork_server.close()


def test_server_that_cannot_start_is_not_retried_and_runs_are_spawned_with_the_reason() -> None:
    with ForkServer(preload=["cellbox._testprog_missing_module_raises"]) as fork_server:
        # A preload module that fails to import is reported, not fatal: the server still starts.
        assert fork_server.wait_ready(60)
        assert list(fork_server.failed) == ["cellbox._testprog_missing_module_raises"]
    with ForkServer(preload=[]) as fork_server:
        assert fork_server.wait_ready(60)
        server_pid = fork_server.pid
        assert server_pid is not None
        fork_server._server.hello.clear()  # type: ignore[union-attr] - as if it had never said it was ready
        os.kill(server_pid, signal.SIGKILL)
        fork_server._server.thread.join(10)  # type: ignore[union-attr]
        argv = [sys.executable, "-m", "cellbox._testprog", "print(5)"]
        outcomes = [run(argv, forkserver=fork_server) for _ in range(2)]
        assert [o.stdout for o in outcomes] == ["5\n", "5\n"]
        assert all("the fork server could not start" in " ".join(o.notes) for o in outcomes)
        assert (fork_server.restarts, fork_server.launcher_pid) == (0, None)  # not started again


def test_the_sessions_landlock_holds_its_forked_runs_and_not_its_keeper() -> None:
    from cellbox.sandbox.isolation import Isolation, probe

    if not probe().available("landlock"):
        pytest.skip("Landlock is not available on this machine")
    isolation = Isolation(mode="strict", layers=("landlock",))
    with ForkServer(preload=[], isolation=isolation) as session:
        assert session.wait_ready(60)
        code = "import os\ntry:\n    os.listdir('/root'); print('read')\nexcept PermissionError:\n    print('denied')"
        keeper = session.pid
        code += f"\ntry:\n    os.kill({keeper}, 0); print('reached')\n"
        code += "except OSError as exc:\n    print(type(exc).__name__)"
        outcome = run([sys.executable, "-m", "cellbox._testprog", code], forkserver=session, isolation=isolation)
    assert outcome.stdout == "denied\nPermissionError\n"
    assert {"landlock", "forkserver"} <= set(outcome.isolation)


def test_a_run_that_asks_for_other_layers_than_the_sessions_is_spawned_with_a_note(server: ForkServer) -> None:
    from cellbox.sandbox.isolation import BWRAP_LAYERS, Isolation, probe

    if not any(probe().available(layer) for layer in BWRAP_LAYERS):
        pytest.skip("bubblewrap gives no layer on this machine")
    outcome = run(
        [sys.executable, "-m", "cellbox._testprog", "print(6)"], forkserver=server, isolation=Isolation.auto()
    )
    assert outcome.stdout == "6\n"
    assert "forkserver" not in outcome.isolation
    assert any("is not the session's" in note for note in outcome.notes)


def test_a_session_with_bubblewrap_layers_forks_runs_inside_them() -> None:
    from cellbox.sandbox.isolation import BWRAP_LAYERS, Isolation, probe

    if not all(probe().available(layer) for layer in BWRAP_LAYERS):
        pytest.skip("bubblewrap gives not every layer on this machine")
    with TaskDirectory.create() as task, ForkServer(preload=[], task=task, isolation=Isolation.auto()) as session:
        assert session.wait_ready(60)
        code = "import os\nprint(os.getpid() < 100, sorted(p for p in os.listdir('/proc') if p.isdigit())[:1])"
        outcome = run(
            [sys.executable, "-m", "cellbox._testprog", code], forkserver=session, isolation=Isolation.auto(), task=task
        )
    assert outcome.stdout == "True ['1']\n"
    assert {"net", "pid", "fs", "user", "forkserver"} <= set(outcome.isolation)


def test_run_that_removes_the_task_directory_does_not_break_the_server_start() -> None:
    with TaskDirectory.create() as task:
        fork_server = ForkServer(preload=[], task=task)
        try:
            argv = [
                sys.executable,
                "-m",
                "cellbox._testprog",
                "import shutil, os; shutil.rmtree(os.path.dirname(os.environ['HOME']))",
            ]
            first = run(argv, forkserver=fork_server, task=task, cwd="/tmp")
            assert first.status is Status.OK  # the server could not start in the removed directory; no harm done
            assert fork_server.launcher_pid is None and fork_server.last_error is not None
            for part in (task.home, task.work, task.tmp):
                part.mkdir(parents=True, exist_ok=True)
            again = [sys.executable, "-m", "cellbox._testprog", "print(7)"]
            assert run(again, forkserver=fork_server, task=task).stdout == "7\n"  # spawned; the server starts after it
            assert fork_server.wait_ready(60)
            assert "forkserver" in run(again, forkserver=fork_server, task=task).isolation
        finally:
            fork_server.close()


def test_installed_lists_what_is_installed_without_importing_it() -> None:
    check = "import sys\nfrom cellbox.sandbox.session import installed\n"
    check += "print(installed(['matplotlib.pyplot', 'json.decoder', 'cellbox_no_such_module.part']))\n"
    check += "print('matplotlib' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True).stdout
    assert out == "['matplotlib.pyplot', 'json.decoder']\nFalse\n"


FAILED_WARM_UP = """
import os, sys
os.environ["MPLBACKEND"] = "agg"
from cellbox.kernel import cellrunner
broken = cellrunner._install_pager
cellrunner._install_pager = lambda shell: 1 / 0  # the warm-up fails half-way, after the shell exists
try:
    cellrunner.warm_start()
except ZeroDivisionError:
    pass
cellrunner._install_pager = broken
channel = cellrunner.Channel(",".join(map(str, (os.pipe()[1], os.pipe()[0]))))
spec = {"history_length": 1, "history_digest": cellrunner.history_digest([""]), "limits": {}}
shell = cellrunner._session_shell(channel, spec)
print(shell.channel is channel, shell.run_cell("1 + 1").result)
"""


def test_warm_up_that_fails_leaves_no_half_made_shell_for_the_cell() -> None:
    done = subprocess.run([sys.executable, "-c", FAILED_WARM_UP], capture_output=True, text=True)
    assert (done.stdout, done.returncode) == ("True 2\n", 0), done.stderr


def _stopped_children(pid: int) -> set[int]:
    """Children of ``pid`` in state T (stopped), from /proc."""
    found = set()
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/children") as f:
            for child in map(int, f.read().split()):
                with open(f"/proc/{child}/stat", "rb") as stat:
                    if stat.read().rsplit(b")", 1)[1].split()[0] == b"T":
                        found.add(child)
    return found


def _wait_for_stopped_children(pid: int, count: int) -> set[int]:
    deadline = time.monotonic() + 30
    while len(found := _stopped_children(pid)) < count and time.monotonic() < deadline:
        time.sleep(0.05)
    return found


def test_next_run_is_forked_ahead_and_held_stopped_until_it_comes() -> None:
    # Between runs the keeper holds two stopped children: the base snapshot and the spare,
    # the next run's command forked ahead. The run is that process; a new spare follows it.
    with ForkServer(preload=[]) as fork_server:
        assert fork_server.wait_ready(60)
        keeper = fork_server.pid  # no pid namespace here: a pid of ours
        assert keeper is not None
        before = _wait_for_stopped_children(keeper, 2)
        assert len(before) == 2
        code = "import os\nprint(os.getpid())"
        outcome = run([sys.executable, "-m", "cellbox._testprog", code], forkserver=fork_server, limits=FORKED_LIMITS)
        assert "forkserver" in outcome.isolation
        ran = int(outcome.stdout)
        assert ran in before
        after = _wait_for_stopped_children(keeper, 2)
        assert len(after) == 2
        assert ran not in after
        assert before & after == before - {ran}  # the base snapshot stays


def _nice_of(pid: int) -> int:
    with open(f"/proc/{pid}/stat", "rb") as f:
        return int(f.read().rsplit(b")", 1)[1].split()[16])  # proc(5): field 19, nice


def test_keeper_keeps_the_callers_priority_and_runs_start_from_the_lowest() -> None:
    with ForkServer(preload=[]) as fork_server:
        assert fork_server.wait_ready(60)
        keeper = fork_server.pid
        assert keeper is not None
        assert _nice_of(keeper) == os.getpriority(os.PRIO_PROCESS, 0)
        assert {_nice_of(pid) for pid in _wait_for_stopped_children(keeper, 2)} == {19}
        code = "import os\nprint(os.getpriority(os.PRIO_PROCESS, 0))"
        # Only root may set a run's priority above the snapshot's (setpriority(2)).
        for nice in (19, 12) if os.geteuid() == 0 else (19,):
            limits = Limits(wall_time=10, cpu_time=10, memory=1024**3, nice=nice)
            stdout, _stderr, _isolation = forked(fork_server, code, limits=limits)
            assert int(stdout) == nice


def test_outcome_of_a_forked_run_comes_after_its_processes_are_reaped(server: ForkServer) -> None:
    # The session's keeper supervises: its exit record comes after it has reaped the command and
    # killed the rest (a multiprocessing pool's workers among them), so nothing of the run is left.
    code = "import multiprocessing as m\nif __name__ == '__main__':\n    print(sum(m.Pool(2).map(abs, range(10))))"
    for _ in range(10):
        running = start([sys.executable, "-m", "cellbox._testprog", code], forkserver=server, limits=FORKED_LIMITS)
        command = running.proc.pid  # the session has no pid namespace here: a pid of ours
        outcome = running.wait()
        assert outcome.status is Status.OK, outcome.stderr
        assert "forkserver" in outcome.isolation
        assert not os.path.exists(f"/proc/{command}")
