"""A cellbox kernel session: state carried between cells, interrupts, stdin, shutdown, settings."""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from queue import Empty
from typing import Any

import pytest
from jupyter_client.blocking.client import BlockingKernelClient
from jupyter_client.manager import KernelManager

from kernelkit import execute, kernel_manager, running_kernel, survivors


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[KernelManager, BlockingKernelClient, Path]]:
    """One default kernel for the tests that leave it as they found it (an interrupt it lives on counts),
    with its notebook folder."""
    notebook = tmp_path_factory.mktemp("notebook")
    with running_kernel("cellbox", cwd=str(notebook)) as (km, client):
        yield km, client, notebook


@pytest.fixture(scope="module")
def kc(shared: tuple[KernelManager, BlockingKernelClient, Path]) -> BlockingKernelClient:
    return shared[1]


# --------------------------------------------------------------------------- state


def test_values_functions_classes_and_imports_reach_later_cells(kc: BlockingKernelClient) -> None:
    define = """
import math
from collections import Counter
rate = 3
def scaled(x):
    return x * rate
class Point:
    def __init__(self, x): self.x = x
    def norm(self): return math.fabs(self.x)
p = Point(-2.5)
counts = Counter("abca")
"""
    assert execute(kc, define).status == "ok"
    result = execute(kc, "print(scaled(2), p.norm(), isinstance(p, Point), counts['a'], math.pi > 3)")
    assert result.stream() == "6 2.5 True 2 True\n"


def test_functions_see_later_changes_of_globals(kc: BlockingKernelClient) -> None:
    execute(kc, "level = 1\ndef current():\n    return level")
    execute(kc, "level = 2")
    assert execute(kc, "print(current())").stream() == "2\n"


def test_stopped_cell_leaves_the_state_as_it_was(kc: BlockingKernelClient) -> None:
    execute(kc, "phase = 'before'")
    result = execute(kc, "%%limits wall=1\nphase = 'during'\nwhile True: pass")
    assert result.errors[0]["ename"] == "CellTimeoutError"
    assert execute(kc, "print(phase)").stream() == "before\n"


def test_last_result_and_out_are_carried(kc: BlockingKernelClient) -> None:
    first = execute(kc, "21 * 2")
    n = first.content["execution_count"]
    result = execute(kc, f"print(_, Out[{n}], _{n}, In[{n}])")
    assert result.stream() == "42 42 42 21 * 2\n"


def test_env_magic_changes_are_carried_but_not_in_the_kernel(kc: BlockingKernelClient) -> None:
    assert execute(kc, "%env COURSE_LEVEL=beginner").stream() == "env: COURSE_LEVEL=beginner\n"
    assert execute(kc, "import os\nprint(os.environ['COURSE_LEVEL'])").stream() == "beginner\n"
    assert "COURSE_LEVEL" not in os.environ


def test_reset_clears_the_state(kc: BlockingKernelClient) -> None:
    execute(kc, "forgotten = 1")
    assert execute(kc, "%reset -f").status == "ok"
    result = execute(kc, "forgotten")
    assert result.content["ename"] == "NameError"


def test_carry_state_false_gives_fresh_cells(tmp_path: Path) -> None:
    with running_kernel("cellbox", cwd=str(tmp_path), extra=["--CellboxKernel.carry_state=False"]) as (_km, kc):
        execute(kc, "x = 1")
        assert execute(kc, "x").content["ename"] == "NameError"


# --------------------------------------------------------------------------- stdin


def test_input_goes_through_the_frontend(kc: BlockingKernelClient) -> None:
    prompts: list[dict[str, Any]] = []

    def answer(request: dict[str, Any]) -> str:
        prompts.append(request)
        return "Ada"

    result = execute(kc, "name = input('Your name? ')\nprint('Hello,', name)", answer=answer)
    assert prompts == [{"prompt": "Your name? ", "password": False}]
    assert result.stream() == "Hello, Ada\n"


def test_getpass_asks_for_a_password(kc: BlockingKernelClient) -> None:
    prompts: list[dict[str, Any]] = []

    def answer(request: dict[str, Any]) -> str:
        prompts.append(request)
        return "s3cret"

    result = execute(kc, "import getpass\nprint(len(getpass.getpass('PIN: ')))", answer=answer)
    assert prompts == [{"prompt": "PIN: ", "password": True}]
    assert result.stream() == "6\n"


def test_input_without_stdin_fails_at_once(kc: BlockingKernelClient) -> None:
    start = time.monotonic()
    result = execute(kc, "input('never asked: ')", allow_stdin=False)
    assert result.content["ename"] == "StdinNotImplementedError"
    assert result.content["evalue"] == "raw_input was called, but this frontend does not support input requests."
    assert time.monotonic() - start < 20  # nowhere near the 30 s wall limit: it did not wait


# --------------------------------------------------------------------------- interrupt


def _interrupt_when_started(km: KernelManager) -> Any:
    def during(msg: dict[str, Any]) -> None:
        if msg["msg_type"] == "stream" and "started" in msg["content"]["text"]:
            threading.Timer(0.3, km.interrupt_kernel).start()

    return during


@pytest.mark.parametrize("mode", ["signal", "message"])
def test_interrupt_stops_the_cell_and_the_kernel_lives_on(mode: str, tmp_path: Path) -> None:
    mark = f"cellbox-test-{uuid.uuid4().hex}"
    with running_kernel("cellbox", cwd=str(tmp_path), interrupt_mode=mode) as (km, kc):
        execute(kc, "kept = 'yes'")
        code = (
            f"import subprocess, time\nsubprocess.Popen(['sh', '-c', 'sleep 300; : {mark}'])\n"
            "print('started')\ntime.sleep(300)"
        )
        result = execute(kc, code, during=_interrupt_when_started(km))
        assert result.status == "error"
        assert result.content["ename"] == "KeyboardInterrupt"
        assert result.metadata["cellbox"]["status"] == "interrupted"
        assert "----> 4 time.sleep(300)" in result.traceback
        assert survivors(mark) == []
        assert execute(kc, "print(kept)").stream() == "yes\n"


def test_interrupt_ignored_by_the_cell_is_followed_by_a_kill(tmp_path: Path) -> None:
    code = "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nprint('started')\ntime.sleep(300)"
    # A short grace: the default gives a KeyboardInterrupt handler 5 s, which this cell does not use.
    with running_kernel("cellbox", cwd=str(tmp_path), extra=["--CellboxKernel.interrupt_grace=1"]) as (km, kc):
        result = execute(kc, code, during=_interrupt_when_started(km))
        assert (result.content["ename"], result.content["evalue"]) == ("KeyboardInterrupt", "the cell was interrupted")
        assert execute(kc, "print('alive')").stream() == "alive\n"


def test_interrupt_while_waiting_for_input(shared: tuple[KernelManager, BlockingKernelClient, Path]) -> None:
    km, kc, _notebook = shared
    asked = threading.Event()

    def answer(request: dict[str, Any]) -> str:
        asked.set()
        km.interrupt_kernel()
        time.sleep(2)
        return "too late"

    result = execute(kc, "input('? ')", answer=answer)
    assert asked.is_set()
    assert result.content["ename"] == "KeyboardInterrupt"
    assert execute(kc, "print('alive')").stream() == "alive\n"


def _input_requests_sent_after_the_reply(kc: BlockingKernelClient, msg_id: str) -> list[dict[str, Any]]:
    """The input requests of cell ``msg_id`` the kernel sent after its reply (by the kernel's own clock).

    The stdin and shell channels are separate sockets, so a request sent just
    before the reply may be read just after it; the kernel's timestamps say
    which came first.
    """
    reply = kc.get_shell_msg(timeout=60)
    while reply["parent_header"].get("msg_id") != msg_id:
        reply = kc.get_shell_msg(timeout=60)
    requests: list[dict[str, Any]] = []
    deadline = time.monotonic() + 0.5
    while time.monotonic() < deadline:
        try:
            requests.append(kc.get_stdin_msg(timeout=0.05))
        except Empty:
            pass
    return [r for r in requests if r["header"]["date"] > reply["header"]["date"]]


@pytest.mark.slow
def test_interrupting_input_gives_one_keyboard_interrupt_and_no_box_after_the_reply(tmp_path: Path) -> None:
    # The interrupt lands at different moments: as the frontend is asked, or while the cell is still
    # sending its request. Each must end the same way, as under ipykernel.
    with running_kernel("cellbox", cwd=str(tmp_path)) as (km, kc):
        execute(kc, "pass")  # the first cell's notes are the machine's (no memory cgroup for a normal user)
        for attempt in range(8):
            delay = (0.0, 0.005, 0.02, None)[attempt % 4]

            def answer(request: dict[str, Any], delay: float | None = delay) -> None:
                if delay is None:  # left unanswered, as by a student who presses the interrupt button
                    km.interrupt_kernel()

            def during(msg: dict[str, Any], delay: float | None = delay) -> None:
                if delay is not None and msg["msg_type"] == "stream" and "asking" in msg["content"]["text"]:
                    threading.Timer(delay, km.interrupt_kernel).start()

            result = execute(kc, "print('asking')\nx = input('? ')", answer=answer, during=during)
            errors = [(e["ename"], e["evalue"]) for e in result.errors]
            assert errors == [("KeyboardInterrupt", "Interrupted by user")], attempt
            assert "----> 2 x = input('? ')" in result.traceback
            assert result.stream("stderr") == ""
            assert result.metadata["cellbox"]["status"] == "interrupted"
            with pytest.raises(Empty):  # no input box left open after the reply
                kc.get_stdin_msg(timeout=0.3)
        assert execute(kc, "print('alive')").stream() == "alive\n"


def test_an_input_request_never_reaches_the_frontend_after_its_cells_reply(tmp_path: Path) -> None:
    # A thread asks while the cell ends: the request goes out before the reply or not at all.
    code = "import threading, time\nthreading.Thread(target=input, args=('late? ',), daemon=True).start()\n"
    with running_kernel("cellbox", cwd=str(tmp_path)) as (_km, kc):
        for pause in ("", "time.sleep(0.001)", "time.sleep(0.01)", "time.sleep(0.05)") * 2:
            msg_id = kc.execute(code + pause, allow_stdin=True)
            assert _input_requests_sent_after_the_reply(kc, msg_id) == []
        assert execute(kc, "print('alive')").stream() == "alive\n"


# --------------------------------------------------------------------------- lifecycle


def _task_directory(kc: BlockingKernelClient) -> Path:
    home = execute(kc, "import os\nprint(os.environ['HOME'])").stream().strip()
    return Path(home).parent


def test_shutdown_kills_the_running_cell_and_removes_the_task_directory(tmp_path: Path) -> None:
    mark = f"cellbox-test-{uuid.uuid4().hex}"
    km = kernel_manager("cellbox")
    km.start_kernel(cwd=str(tmp_path))
    kc = km.client()
    kc.start_channels()
    kc.wait_for_ready(timeout=60)
    task = _task_directory(kc)
    assert task.is_dir() and task.name.startswith("cellbox-kernel-")
    kc.execute(f"import subprocess\nsubprocess.run(['sh', '-c', 'sleep 300; : {mark}'])")
    deadline = time.monotonic() + 20
    while not survivors(mark) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert survivors(mark)
    kc.stop_channels()
    km.shutdown_kernel(now=False)
    assert survivors(mark) == []
    assert not task.exists()


@pytest.mark.slow  # five kernels, one after another
def test_the_kernel_exits_on_its_own_after_a_shutdown_request(tmp_path: Path) -> None:
    # The request's idle status used to race the interpreter's exit: IOPub's thread stopped first, the
    # control thread's send then blocked for good, and the kernel lived until jupyter_client terminated it
    # (2.5 s later: 3 s added to every nbclient run, in 1 to 3 shutdowns of 4). Five tries: one hang fails.
    exits = []
    for _ in range(5):
        km = kernel_manager("cellbox")
        km.start_kernel(cwd=str(tmp_path))
        kc = km.client()
        kc.start_channels()
        try:
            kc.wait_for_ready(timeout=60)
            for _cell in range(3):
                assert execute(kc, "pass").status == "ok"
        finally:
            kc.stop_channels()
        km.request_shutdown()
        process = km.provisioner.process  # type: ignore[union-attr]
        # A hang, not a slow exit (a busy machine's can take seconds): nothing terminates it before this.
        deadline = time.monotonic() + 30
        while process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        exits.append(process.poll())
        if process.poll() is None:
            km.shutdown_kernel(now=True)
        km.cleanup_resources()
    assert exits == [0] * 5


def test_restart_starts_a_fresh_session(tmp_path: Path) -> None:
    with running_kernel("cellbox", cwd=str(tmp_path)) as (km, kc):
        execute(kc, "before_restart = 1")
        old_task = _task_directory(kc)
        km.restart_kernel(now=False)
        kc.wait_for_ready(timeout=60)
        assert not old_task.exists()
        assert execute(kc, "before_restart").content["ename"] == "NameError"


# --------------------------------------------------------------------------- settings and info


def test_kernel_info_is_pythons_with_limits_in_the_banner_and_the_debugger(kc: BlockingKernelClient) -> None:
    kc.kernel_info()
    info = kc.get_shell_msg(timeout=30)["content"]
    assert info["implementation"] == "cellbox"
    assert info["language_info"]["name"] == "python"
    assert info["language_info"]["file_extension"] == ".py"
    assert info["language_info"]["codemirror_mode"] == {"name": "ipython", "version": 3}
    # debugpy comes with ipykernel: the debugger is offered as ipykernel offers it (tests/test_kernel_debug_adapter.py).
    assert "debugger" in info["supported_features"]
    assert info["debugger"] is True
    assert "limits: wall 30 s, cpu 30 s, memory 2G, output 1M" in info["banner"]
    lines = info["banner"].splitlines()
    assert [line for line in lines if line.startswith("Isolation ")][0].startswith("Isolation auto: ")
    # As root, the banner says what root means for the cells: here none of root's powers.
    root_lines = [line for line in lines if line.startswith("The kernel runs as root")]
    assert len(root_lines) == (os.geteuid() == 0)
    if root_lines and "user" in info["banner"].split("Isolation auto: ", 1)[1].split("\n")[0]:
        assert "every capability dropped" in root_lines[0]


def test_a_kernel_without_isolation_says_so_in_the_first_cells_output(tmp_path: Path) -> None:
    with running_kernel("cellbox", cwd=str(tmp_path), extra=["--CellboxKernel.isolation=none"]) as (_km, kc):
        first, second = execute(kc, "print(1)"), execute(kc, "print(2)")
    from cellbox.kernel.kernel import ROOT_POWERS
    from cellbox.sandbox.cgroups import UNBOUNDED_MEMORY, memory_cgroup_root

    unbounded = f"cellbox: note: memory: the session's bound of 4G does not hold: {UNBOUNDED_MEMORY}\n"
    assert first.stream("stderr") == ""
    assert first.notes == (
        "cellbox: note: this kernel's cells run with isolation none: they can read your files, use the network "
        "and signal your other programs (see `cellbox doctor`)\n"
    ) + (f"cellbox: note: {ROOT_POWERS}\n" if os.geteuid() == 0 else "") + (
        unbounded if memory_cgroup_root() is None else ""
    )
    if os.geteuid() == 0:
        assert "root's powers: they can read and change any file" in ROOT_POWERS
    assert "\n".join(first.metadata["cellbox"]["kernel_notes"]) == first.notes.rstrip("\n")
    assert (first.stream(), second.stream(), second.stream("stderr"), second.notes) == ("1\n", "2\n", "", "")


def test_banner_lists_the_isolation_layers_cells_get(tmp_path: Path) -> None:
    from cellbox.sandbox.isolation import Isolation, describe

    expected = describe(Isolation(mode="auto"))
    with running_kernel("cellbox", cwd=str(tmp_path), extra=["--CellboxKernel.isolation=auto"]) as (_km, kc):
        kc.kernel_info()
        banner = kc.get_shell_msg(timeout=30)["content"]["banner"]
    assert expected[0].upper() + expected[1:] in banner.splitlines()
    assert expected.startswith("isolation auto: ")


def test_settings_in_the_kernel_arguments_set_the_session_limits(tmp_path: Path) -> None:
    extra = ["--CellboxKernel.wall_time=12", "--CellboxKernel.memory=768M", "--CellboxKernel.output=64K"]
    with running_kernel("cellbox", cwd=str(tmp_path), extra=extra) as (_km, kc):
        assert execute(kc, "%limits").stream() == "wall 12 s, cpu 30 s, memory 768M, output 64K\n"
        limits = execute(kc, "pass").metadata["cellbox"]["limits"]
        assert (limits["wall_time"], limits["memory"], limits["output"]) == (12.0, 768 * 2**20, 64 * 2**10)


def test_the_session_limits_and_the_ceiling_follow_a_setting_changed_after_they_were_made() -> None:
    # Both are made once and kept while the settings stay the same (every cell asks for them).
    from types import SimpleNamespace

    from cellbox.kernel.kernel import CellboxKernel

    traits = CellboxKernel.class_traits(config=True)
    kernel = SimpleNamespace(**{name: trait.default_value for name, trait in traits.items()})
    session = CellboxKernel.session_limits.fget  # type: ignore[attr-defined]
    ceiling = CellboxKernel.ceiling_limits.fget  # type: ignore[attr-defined]
    kernel.session_limits = session(kernel)
    assert (kernel.session_limits.memory, ceiling(kernel).wall_time) == (2 * 2**30, 3600.0)
    assert session(kernel) is kernel.session_limits
    kernel.memory, kernel.ceiling = "768M", "wall=90"
    kernel.session_limits = session(kernel)
    assert (kernel.session_limits.memory, ceiling(kernel).wall_time) == (768 * 2**20, 90.0)


def test_a_module_removed_from_disk_stays_imported_as_in_a_long_lived_kernel(
    shared: tuple[KernelManager, BlockingKernelClient, Path],
) -> None:
    _km, kc, notebook = shared
    (notebook / "shapes.py").write_text("class Square:\n    side = 2\n")
    assert execute(kc, "import shapes\nsquare = shapes.Square()").status == "ok"
    (notebook / "shapes.py").unlink()
    result = execute(kc, "print(square.side, shapes.Square.side)")
    assert (result.stream(), result.stream("stderr")) == ("2 2\n", "")


def _kernel_pid(km: KernelManager) -> int:
    return int(km.provisioner.process.pid)  # type: ignore[union-attr]


def test_terminated_kernel_removes_its_task_directory(tmp_path: Path) -> None:
    with running_kernel("cellbox", cwd=str(tmp_path)) as (km, kc):
        task = _task_directory(kc)
        os.kill(_kernel_pid(km), signal.SIGTERM)
        deadline = time.monotonic() + 20
        while task.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not task.exists()


def test_next_kernel_removes_the_task_directory_of_a_killed_one(tmp_path: Path) -> None:
    with running_kernel("cellbox", cwd=str(tmp_path)) as (km, kc):
        task = _task_directory(kc)
        os.kill(_kernel_pid(km), signal.SIGKILL)
        km.provisioner.process.wait()  # type: ignore[union-attr]
        assert task.exists()
        with running_kernel("cellbox", cwd=str(tmp_path)):
            assert not task.exists()


def test_a_cell_that_deletes_the_task_directory_does_not_break_the_next(tmp_path: Path) -> None:
    with running_kernel("cellbox", cwd=str(tmp_path)) as (_km, kc):
        execute(kc, "import os, shutil\nshutil.rmtree(os.path.dirname(os.environ['HOME']))")
        assert execute(kc, "print('next cell')").stream() == "next cell\n"


def test_isolation_setting_puts_cells_in_the_sandboxs_layers(tmp_path: Path) -> None:
    from cellbox.sandbox.isolation import probe

    support = probe()
    # A root kernel keeps its cells at uid 0, in a user namespace with no capabilities.
    expected_uid = os.getuid()
    code = (
        "import os, socket\nprint(os.getuid())\nnumber = 41\n"
        "try:\n    socket.create_connection(('192.0.2.1', 80), timeout=2)\nexcept OSError:\n    print('no network')"
    )
    # The cells run as the kernel's own user (uid 0 without capabilities, as root): no folder needs opening up.
    notebook = tmp_path / "shared"
    notebook.mkdir()
    with running_kernel("cellbox", cwd=str(notebook), extra=["--CellboxKernel.isolation=auto"]) as (_km, kc):
        first = execute(kc, code)
        assert first.status == "ok", first.content
        lines = first.stream().splitlines()
        assert lines[0] == str(expected_uid)
        if support.available("net"):
            assert lines[1] == "no network"
        layers = first.metadata["cellbox"]["isolation"]
        assert [layer for layer in ("net", "pid", "fs", "user", "landlock") if support.available(layer)] == [
            layer for layer in ("net", "pid", "fs", "user", "landlock") if layer in layers
        ]
        notes = first.metadata["cellbox"]["notes"]
        assert first.stream("stderr") == ""
        assert first.notes == (f"cellbox: note: {', '.join(sorted(notes))}\n" if notes else "")
        second = execute(kc, "print(number + 1)")
        assert second.stream() == "42\n"
        assert second.stream("stderr") == ""


def test_cell_that_cannot_start_says_why(tmp_path: Path) -> None:
    with running_kernel("cellbox", cwd=str(tmp_path)) as (_km, kc):
        tmp_path.rename(tmp_path.with_name("moved"))
        result = execute(kc, "print(1)")
        assert (result.content["ename"], result.content["evalue"]) == (
            "SandboxError",
            f"working directory {tmp_path} does not exist; create it or pass another",
        )


def test_root_kernel_cells_write_a_closed_root_notebook_without_root_powers(
    tmp_path: Path, require_tool: Callable[..., str]
) -> None:
    from cellbox.sandbox.isolation import probe

    require_tool("bwrap", install="apt-get install bubblewrap")
    support = probe()
    if not (support.as_root and support.available("user")):
        pytest.skip("the kernel keeps uid 0 without capabilities only when it runs as root with the user layer")
    closed = tmp_path / "closed"
    closed.mkdir(mode=0o700)
    code = (
        "import os\nopen('written.txt', 'w').write('ok')\n"
        "caps = [l.split()[1] for l in open('/proc/self/status') if l.startswith('CapEff')]\n"
        "print(os.getuid(), caps[0], open('/etc/shadow').read() == '')\n"
        "try:\n    os.mknod('disk', 0o600 | 0o060000, os.makedev(8, 0))\nexcept OSError as exc:\n"
        "    print(type(exc).__name__)"
    )
    with running_kernel("cellbox", cwd=str(closed)) as (_km, kc):
        result = execute(kc, code)
        assert result.stream() == "0 0000000000000000 True\nPermissionError\n", result.errors
    assert (closed / "written.txt").read_text() == "ok"


def test_a_thread_left_running_ends_with_its_cell(kc: BlockingKernelClient) -> None:
    code = "import threading, time\nthreading.Thread(target=time.sleep, args=(300,)).start()\nprint('on')"
    result = execute(kc, code)
    assert result.status == "ok"
    # Said beside the cell where graders do not look, and in the reply: never on the cell's stderr.
    note = "cellbox: 1 thread was still running when the cell ended, and stopped with it"
    assert (result.stream(), result.stream("stderr"), result.notes) == ("on\n", "", f"{note}\n")
    assert result.metadata["cellbox"]["kernel_notes"] == [note]
    assert result.metadata["cellbox"]["wall_time"] < 30  # the cell did not wait for the thread


def test_forkserver_start_runs_cells_forked_with_the_same_results(tmp_path: Path) -> None:
    extra = ["--CellboxKernel.start_method=forkserver"]
    with running_kernel("cellbox", cwd=str(tmp_path), extra=extra) as (_km, kc):
        deadline = time.monotonic() + 60
        forked = False
        while not forked and time.monotonic() < deadline:  # cells before the server is ready are spawned
            forked = "forkserver" in execute(kc, "pass").metadata["cellbox"]["isolation"]
            time.sleep(0.5)
        assert forked
        # The shell is the session's, as in a long-lived kernel: what one cell does to it the next sees.
        execute(kc, "import IPython\nIPython.marked = 1\nget_ipython().marked = 1")
        seen = execute(kc, "print(hasattr(IPython, 'marked'), hasattr(get_ipython(), 'marked'), _dh == [_dh[0]])")
        assert (seen.stream(), "forkserver" in seen.metadata["cellbox"]["isolation"]) == ("True True True\n", True)
        execute(kc, "import numpy as np\nvalues = np.arange(4)")
        result = execute(kc, "import matplotlib.pyplot as plt\nplt.plot(values ** 2)\nprint(values.sum())")
        assert result.stream() == "6\n"
        assert [sorted(c["data"]) for c in result.of("display_data")] == [["image/png", "text/plain"]]
        assert "forkserver" in result.metadata["cellbox"]["isolation"]
        stopped = execute(kc, "%%limits wall=1\nwhile True:\n    pass")
        assert stopped.content["ename"] == "CellTimeoutError"
        assert execute(kc, "print(values.max())").stream() == "3\n"


RESTORE_CHECK = """
import json, os, sys
os.environ["MPLBACKEND"] = "agg"
from cellbox.kernel import cellrunner
channel = cellrunner.Channel(",".join(map(str, (os.pipe()[1], os.pipe()[0]))))
shell = cellrunner._new_shell(channel)
history = ["", "!echo one", "x = 2"]
# Input 1 as its child reported it; input 2 was never reported (its child was killed).
cellrunner._sync_history(shell, history, ["", "reported = 1\\n", None])
print(json.dumps([shell.user_ns["In"], shell.user_ns["_i2"], shell.history_manager.input_hist_raw]))
"""


def test_history_uses_each_input_as_its_child_transformed_it_and_transforms_the_rest() -> None:
    import json
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", RESTORE_CHECK], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [["", "reported = 1", "x = 2"], "x = 2", ["", "!echo one", "x = 2"]]


def test_shell_commands_and_magics_in_history_read_as_ipython_transformed_them(kc: BlockingKernelClient) -> None:
    execute(kc, "!true")
    number = execute(kc, "print(len(In) - 2)").stream().strip()
    seen = execute(kc, f"print(In[{number}])").stream()
    assert seen == "get_ipython().system('true')\n"


SPEC_SIZE = """
import glob, os
print(max(os.path.getsize(path) for path in glob.glob(os.path.join(os.environ["TMPDIR"], "cellbox-cell-*.json"))))
"""


def test_history_is_the_kernels_after_a_stopped_cell_and_an_undo_and_the_spec_does_not_grow(tmp_path: Path) -> None:
    # A cell's spec names the history by length and digest; a shell whose In is not the kernel's (the cell
    # before was stopped, or undone) asks for it. Under ipykernel a stopped cell's input stays in In too.
    with running_kernel("cellbox", cwd=str(tmp_path)) as (_km, kc):
        assert execute(kc, "a = 1").status == "ok"
        assert execute(kc, "%%limits wall=1\nimport time\ntime.sleep(30)").content["ename"] == "CellTimeoutError"
        seen = execute(kc, "print(In[1:], _i2 == In[2], _ii)").stream()
        assert seen == "['a = 1', 'import time\\ntime.sleep(30)', 'print(In[1:], _i2 == In[2], _ii)'] True a = 1\n"
        assert execute(kc, "b = 2").status == "ok"
        assert execute(kc, "%undo").stream().startswith("Undid 1 cell")
        assert execute(kc, "print(len(In), In[4], In[5], 'b' in dir())").stream() == "7 b = 2 %undo False\n"
        long_comment = "# " + "x" * 2000 + "\n"
        first = int(execute(kc, long_comment + SPEC_SIZE).stream())
        for _ in range(20):
            assert execute(kc, long_comment + "pass").status == "ok"
        later = int(execute(kc, long_comment + SPEC_SIZE).stream())
        assert later - first < 200  # the 20 inputs of 2 KB each are not in it
        check = f"print(len(In), In[-3] == _i27 == {long_comment + 'pass'!r})"
        assert execute(kc, check).stream() == "30 True\n"
