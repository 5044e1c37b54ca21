"""The sandbox core's API: threads, interrupts, the message channel, task directories, users."""

from __future__ import annotations

import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from cellbox.sandbox import SandboxError, classify, run, start
from cellbox.sandbox.environment import TaskDirectory
from cellbox.sandbox.limits import Limits
from cellbox.sandbox.outcome import Status
from sandboxkit import DESIGN_KEYS, marker, run_python, survivors

as_root = pytest.mark.skipif(os.geteuid() != 0, reason="switching users needs root")


def test_runs_from_many_threads_at_once_each_get_their_own_result() -> None:
    def one(i: int) -> tuple[int, str, Status]:
        outcome = run_python(f"import time; time.sleep(0.2); print({i} * {i})")
        return i, outcome.stdout, outcome.status

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(one, range(16)))
    assert results == [(i, f"{i * i}\n", Status.OK) for i in range(16)]


def test_interrupt_from_another_thread_gives_keyboard_interrupt_and_interrupted() -> None:
    mark = marker()
    running = start([sys.executable, "-c", f"import time\nprint('go', flush=True)\ntime.sleep(100)\n# {mark}"])
    threading.Timer(0.5, running.interrupt).start()
    outcome = running.wait()
    assert outcome.status is Status.INTERRUPTED
    assert "KeyboardInterrupt" in outcome.stderr
    assert outcome.stdout == "go\n"
    assert survivors(mark) == []


def test_interrupt_ignored_by_the_child_is_followed_by_a_kill() -> None:
    code = "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nprint('ready', flush=True)\n"
    code += "time.sleep(100)"
    holder: list[Any] = []
    # Interrupted once SIGINT is ignored (on a loaded machine, Python may take longer than a fixed delay to start).
    running = start([sys.executable, "-c", code], on_stdout=lambda text: holder[0].interrupt(grace=0.5))
    holder.append(running)
    outcome = running.wait()
    assert outcome.status is Status.INTERRUPTED
    assert outcome.signal == "SIGKILL"
    assert outcome.wall_time < 3


def test_channel_carries_json_messages_both_ways() -> None:
    code = """
import json, os
out = os.fdopen(3, "w", buffering=1)
inp = os.fdopen(4, "r")
out.write(json.dumps({"type": "ask", "prompt": "name?"}) + "\\n")
reply = json.loads(inp.readline())
out.write(json.dumps({"type": "said", "value": reply["value"].upper()}) + "\\n")
print(os.environ["CELLBOX_CHANNEL"])
"""
    received: list[Any] = []
    running = start(
        [sys.executable, "-c", code],
        channel=True,
        on_message=lambda message: (
            received.append(message),
            message["type"] == "ask" and running.send({"value": "ada"}),
        ),
    )
    outcome = running.wait()
    assert outcome.status is Status.OK, outcome.stderr
    assert received == [{"type": "ask", "prompt": "name?"}, {"type": "said", "value": "ADA"}]
    assert outcome.stdout == "3,4\n"


def test_send_without_a_channel_is_a_clear_error() -> None:
    running = start([sys.executable, "-c", "pass"])
    try:
        with pytest.raises(SandboxError, match="channel=True"):
            running.send({"x": 1})
    finally:
        running.wait()


def test_own_task_directory_is_removed_and_home_points_into_it() -> None:
    outcome = run_python(
        "import os; print(os.environ['HOME']); print(os.environ['TMPDIR']); open(os.environ['HOME'] + '/x', 'w')"
    )
    home, tmp = outcome.stdout.split()
    assert Path(home).name == "home" and Path(tmp).name == "tmp"
    assert Path(home).parent == Path(tmp).parent
    assert not Path(home).parent.exists()


def test_given_task_directory_is_kept_across_runs() -> None:
    with TaskDirectory.create() as task:
        run_python("import os; open(os.path.join(os.environ['HOME'], 'state'), 'w').write('42')", task=task)
        outcome = run_python("import os; print(open(os.path.join(os.environ['HOME'], 'state')).read())", task=task)
        assert outcome.stdout == "42\n"
        assert outcome.wall_time > 0
    assert not task.path.exists()


def test_task_directory_is_removed_even_when_the_child_locks_it() -> None:
    code = "import os; d = os.path.join(os.environ['HOME'], 'locked'); os.mkdir(d); open(d + '/f', 'w'); os.chmod(d, 0)"
    outcome = run_python(code + "; print(os.environ['HOME'])")
    assert outcome.status is Status.OK
    assert not Path(outcome.stdout.strip()).parent.exists()


def test_missing_working_directory_is_one_line_error(tmp_path: Path) -> None:
    with pytest.raises(SandboxError, match="does not exist") as info:
        run(["true"], cwd=tmp_path / "nope")
    assert "\n" not in str(info.value)


def test_empty_command_is_an_error() -> None:
    with pytest.raises(SandboxError, match="empty"):
        run([])


def test_unknown_command_is_error_127_with_a_sentence() -> None:
    outcome = run(["cellbox-no-such-command"])
    assert outcome.status is Status.ERROR
    assert outcome.exit_code == 127
    assert outcome.stderr == "cellbox: cannot run cellbox-no-such-command: No such file or directory\n"


def test_outcome_reports_figures_from_the_os() -> None:
    outcome = run_python("x = bytearray(100 * 1024 * 1024); x[::4096] = b'1' * len(x[::4096])\nsum(range(3_000_000))")
    assert outcome.status is Status.OK
    assert outcome.peak_memory >= 100 * 1024**2
    assert 0 < outcome.cpu_time <= outcome.wall_time + 0.05
    data = outcome.to_json()
    assert set(data) >= DESIGN_KEYS
    assert data["status"] == "ok"


def test_priority_and_limits_are_in_force_in_the_child() -> None:
    code = """
import os, resource
print(os.getpriority(os.PRIO_PROCESS, 0))
print(resource.getrlimit(resource.RLIMIT_CPU))
print(resource.getrlimit(resource.RLIMIT_AS))
print(resource.getrlimit(resource.RLIMIT_CORE))
print(resource.getrlimit(resource.RLIMIT_NOFILE))
print(os.getpgid(0) == os.getpid())
"""
    outcome = run_python(code, limits=Limits(cpu_time=2.5, memory=300 * 1024**2, open_files=64))
    assert outcome.stdout.splitlines() == [
        "19",
        "(3, 4)",
        f"({300 * 1024**2}, {300 * 1024**2})",
        "(0, 0)",
        "(64, 64)",
        "True",
    ]


def test_io_class_is_idle_in_the_child() -> None:
    outcome = run(["ionice"]) if os.path.exists("/usr/bin/ionice") else None
    if outcome is None:
        pytest.skip("ionice is not installed")
    assert outcome.stdout.strip() == "idle"


def test_child_keeps_no_stray_file_descriptors() -> None:
    outcome = run_python("import os; print(sorted(int(f) for f in os.listdir('/proc/self/fd')))")
    # 0, 1, 2, and the one listdir itself opens.
    assert len(eval(outcome.stdout)) == 4  # noqa: S307 - our own child's printed list


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (dict(parent_action=Status.INTERRUPTED, exit_code=None, signum=9), Status.INTERRUPTED),
        (dict(parent_action=Status.TIMED_OUT, exit_code=None, signum=24), Status.TIMED_OUT),
        (dict(parent_action=Status.OUTPUT_LIMIT, exit_code=1, signum=None), Status.OUTPUT_LIMIT),
        (dict(parent_action=None, exit_code=None, signum=24), Status.CPU_LIMIT),
        (dict(parent_action=None, exit_code=None, signum=9, command_cpu=2.0), Status.CPU_LIMIT),
        (dict(parent_action=None, exit_code=1, signum=None, memory_error=True), Status.MEMORY_LIMIT),
        (dict(parent_action=None, exit_code=None, signum=11, peak_memory=2**30), Status.MEMORY_LIMIT),
        (dict(parent_action=None, exit_code=None, signum=11), Status.CRASHED),
        (dict(parent_action=None, exit_code=3, signum=None), Status.ERROR),
        (dict(parent_action=None, exit_code=0, signum=None, memory_error=True), Status.OK),
        (dict(parent_action=None, exit_code=0, signum=None), Status.OK),
    ],
)
def test_status_precedence_follows_the_design(args: dict[str, Any], expected: Status) -> None:
    full = dict(command_cpu=0.1, peak_memory=10 * 2**20, limits=Limits(cpu_time=2, memory=2**30), memory_error=False)
    full.update(args)
    assert classify(**full) is expected


# --------------------------------------------------------------------------- users


@as_root
def test_child_runs_as_another_user_with_its_task_directory() -> None:
    outcome = run(["/bin/sh", "-c", 'id -u; touch "$HOME/ok" && echo wrote'], user="nobody")
    assert outcome.status is Status.OK, outcome.stderr
    assert outcome.stdout.splitlines() == [str(_uid("nobody")), "wrote"]
    assert outcome.as_root is False
    assert "user:nobody" in outcome.isolation


def _uid(name: str) -> int:
    import pwd

    return pwd.getpwnam(name).pw_uid


@as_root
def test_unreachable_program_for_the_user_is_a_clear_error(tmp_path: Path) -> None:
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    script = private / "tool.sh"
    script.write_text("#!/bin/sh\necho hi\n")
    script.chmod(0o755)
    os.chmod(tmp_path, 0o755)
    outcome = run([str(script)], user="nobody", cwd="/")
    assert outcome.status is Status.ERROR
    assert outcome.stderr == f"cellbox: user 'nobody' cannot run {script}: it is not open to them\n"


@as_root
def test_unreachable_working_directory_for_the_user_is_a_clear_error(tmp_path: Path) -> None:
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    outcome = run(["/bin/true"], user="nobody", cwd=private)
    assert outcome.status is Status.ERROR
    assert f"user 'nobody' cannot enter the working directory {private}" in outcome.stderr


def test_unknown_user_is_a_one_line_error() -> None:
    with pytest.raises(SandboxError, match="no user 'no-such-user-xyz'"):
        run(["true"], user="no-such-user-xyz")


def test_running_as_root_is_reported() -> None:
    outcome = run(["true"])
    assert outcome.as_root is (os.geteuid() == 0)
    if os.geteuid() == 0:
        assert "ran as root" in outcome.summary()


def test_no_preexec_fn_in_the_parent() -> None:
    # Rule 1: the core must never run Python between fork and exec in a threaded parent.
    core = Path(__file__).parents[1] / "kernel" / "cellbox" / "sandbox"
    sources = {path.name: path.read_text() for path in core.glob("*.py")}
    assert "runs.py" in sources and "session.py" in sources
    assert [name for name, source in sources.items() if "preexec_fn=" in source] == []


def test_failing_output_consumer_still_leaves_nothing_running(monkeypatch: pytest.MonkeyPatch) -> None:
    # Without a pids cgroup (every non-root user) only the launcher can kill the
    # tree when the parent gives up on a run: it must be given the time to.
    monkeypatch.setattr("cellbox.sandbox.confinement.pids_cgroup_root", lambda: None)
    mark = marker()
    code = """
        import os, time
        if os.fork() == 0:
            os.setsid()
            time.sleep(100)
        print("started", flush=True)
        time.sleep(100)
    """

    def consumer(text: str) -> None:
        raise RuntimeError("the consumer of the output failed")

    start_time = time.monotonic()
    with pytest.raises(RuntimeError, match="consumer of the output failed"):
        run_python(code, mark, on_stdout=consumer)
    assert time.monotonic() - start_time < 5
    assert survivors(mark) == []
