"""What a notebook expects of the kernel around its cells, differential against ipykernel in the same run.

One cellbox kernel and one ipykernel kernel serve the whole module (each test uses names of its own): the
same cells run on both, and what they print must be the same.  Grouped by what a course notebook does:
``__main__`` (pickle, multiprocessing, shelve, typing), the shell's identity (the checks pandas, rich and
tqdm make), ``!cmd`` and ``%%script``, subshells, interrupts a cell handles, and work an earlier cell left
running (cellbox only: under ipykernel such work keeps running).
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import threading
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from jupyter_client.blocking.client import BlockingKernelClient
from jupyter_client.manager import KernelManager

from cellbox.kernel.leftwork import ended_message
from kernelkit import Result, execute, plain, running_kernel


@dataclass
class Kernel:
    name: str
    km: KernelManager
    kc: BlockingKernelClient

    def run(self, code: str, **options: Any) -> Result:
        return execute(self.kc, code, **options)

    def out(self, code: str) -> str:
        """The stdout of ``code``, which must succeed."""
        result = self.run(code)
        assert result.status == "ok", (self.name, code, [plain("\n".join(e["traceback"])) for e in result.errors])
        return result.stream()


@pytest.fixture(scope="module")
def kernels(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Kernel, Kernel]]:
    """(cellbox, ipykernel), each in a notebook folder of its own, both with the user's shell bash (if any)."""
    with pytest.MonkeyPatch.context() as patch, ExitStack() as stack:
        bash = shutil.which("bash")
        if bash:
            patch.setenv("SHELL", bash)
        started = []
        for name in ("cellbox", "python3"):
            folder = tmp_path_factory.mktemp(f"notebook-{name}")
            km, kc = stack.enter_context(running_kernel(name, cwd=str(folder)))
            started.append(Kernel(name, km, kc))
        yield started[0], started[1]


def same_output(kernels: tuple[Kernel, Kernel], *cells: str) -> list[str]:
    """Run ``cells`` on both kernels; assert each printed the same; return cellbox's outputs."""
    ours, theirs = kernels
    got = [ours.out(cell) for cell in cells]
    expected = [theirs.out(cell) for cell in cells]
    assert got == expected
    return got


# --------------------------------------------------------------------------- __main__

DEFINE = (
    "from dataclasses import dataclass, field\nfrom typing import ClassVar\n"
    "@dataclass\nclass Point:\n    x: int\n    y: int\n    kind: 'ClassVar[str]' = 'point'\n"
    "def square(n):\n    return n * n\n"
    "def mirror(p: 'Point') -> 'Point':\n    return Point(p.y, p.x)\n"
)


def test_notebook_classes_and_functions_pickle_by_reference_in_later_cells(kernels: tuple[Kernel, Kernel]) -> None:
    pickled = (
        "import pickle, typing, dataclasses\n"
        "print(pickle.loads(pickle.dumps(Point(1, 2))), pickle.loads(pickle.dumps(square))(3))\n"
        "print(typing.get_type_hints(mirror), [f.name for f in dataclasses.fields(Point)])"
    )
    pools = (
        "import multiprocessing, concurrent.futures as cf\n"
        "with multiprocessing.Pool(2) as pool:\n    print(pool.map(square, range(4)))\n"
        "with cf.ProcessPoolExecutor(2) as ex:\n"
        "    print(list(ex.map(square, range(4))), ex.submit(mirror, Point(1, 2)).result())"
    )
    shelved = (
        "import shelve\nwith shelve.open('points') as db:\n    db['p'] = Point(3, 4)\n"
        "with shelve.open('points') as db:\n    print(db['p'])"
    )
    outputs = same_output(kernels, DEFINE, pickled, pools, shelved)
    assert outputs[1:] == [
        "Point(x=1, y=2) 9\n{'p': <class '__main__.Point'>, 'return': <class '__main__.Point'>} ['x', 'y']\n",
        "[0, 1, 4, 9]\n[0, 1, 4, 9] Point(x=2, y=1)\n",
        "Point(x=3, y=4)\n",
    ]


def test_main_is_the_notebook_namespace_and_the_runner_is_out_of_sight(kernels: tuple[Kernel, Kernel]) -> None:
    code = (
        "import sys, __main__\n"
        "print(sys.modules['__main__'] is __main__, __main__.__dict__ is globals(), __main__.__name__)\n"
        "print(hasattr(__main__, '__file__'), [n for n in ('main', 'run', 'Channel') if n in vars(__main__)])"
    )
    assert same_output(kernels, code) == ["True True __main__\nFalse []\n"]


# --------------------------------------------------------------------------- the shell's identity

IDENTITY = (
    "ip = get_ipython()\n"
    "print(type(ip).__name__, str(type(ip)), 'zmq' in str(type(ip)).lower())\n"
    "print('IPKernelApp' in ip.config, hasattr(ip, 'kernel'), ip.has_trait('kernel'))\n"
    "print(ip.kernel.get_parent()['header']['msg_type'], ip.get_parent()['header']['msg_type'])\n"
    "import rich.console\nprint(rich.console._is_jupyter(), rich.get_console().is_jupyter)"
)


def test_shell_answers_the_checks_libraries_make_as_ipykernels(kernels: tuple[Kernel, Kernel]) -> None:
    assert same_output(kernels, IDENTITY) == [
        "ZMQInteractiveShell <class 'ipykernel.zmqshell.ZMQInteractiveShell'> True\n"
        "True True True\nexecute_request execute_request\nTrue True\n"
    ]


def test_kernel_parent_names_the_request_the_cell_answers(kernels: tuple[Kernel, Kernel]) -> None:
    ours, _theirs = kernels
    result = ours.run("print(get_ipython().kernel.get_parent()['header']['msg_id'])")
    assert result.stream() == result.reply["parent_header"]["msg_id"] + "\n"


def test_kernel_connection_file_is_named_without_its_folder(kernels: tuple[Kernel, Kernel]) -> None:
    ours, _theirs = kernels
    expected = os.path.basename(ours.km.connection_file)
    assert ours.out("print(get_ipython().config.IPKernelApp.connection_file)") == expected + "\n"


def test_pandas_prints_a_wide_frame_as_under_ipykernel(kernels: tuple[Kernel, Kernel]) -> None:
    if importlib.util.find_spec("pandas") is None:
        pytest.skip("pandas is not installed (pip install pandas): its display checks cannot be compared")
    code = (
        "import pandas as pd, numpy as np\n"
        "frame = pd.DataFrame(np.arange(360).reshape(12, 30))\n"
        "print(pd.get_option('display.max_columns'), len(str(frame).splitlines()))"
    )
    # 20 columns at most and no wrapping, as in a notebook (a terminal: 0, and the frame wraps).
    assert same_output(kernels, code) == ["20 29\n"]


# tqdm.auto's notebook bar (a widget): tests/test_kernel_widgets.py.


# --------------------------------------------------------------------------- !cmd and %%script


def test_bang_commands_run_in_the_users_shell(kernels: tuple[Kernel, Kernel]) -> None:
    if shutil.which("bash") is None:
        pytest.skip("bash is not installed: the user's shell is sh, as ipykernel's then")
    # Brace expansion and the time keyword are bash's (sh prints {a,b} and runs a time program, if any).
    code = "import os\n!echo {a,b}\n!type time\nprint(os.path.basename(os.environ['SHELL']))"
    assert same_output(kernels, code) == ["a b\r\ntime is a shell keyword\r\nbash\n"]


def test_script_with_a_missing_program_sets_its_out_variable_to_empty_text(kernels: tuple[Kernel, Kernel]) -> None:
    for kernel in kernels:
        kernel.run("%%script no-such-program-here --out captured --err complaints\necho hi")
    assert same_output(kernels, "print(repr(captured), repr(complaints))") == ["'' ''\n"]


# --------------------------------------------------------------------------- subshells


def test_kernel_info_offers_no_subshells_and_a_subshell_request_is_refused(kernels: tuple[Kernel, Kernel]) -> None:
    from cellbox.kernel.kernel import SUBSHELLS_REFUSED

    ours, _theirs = kernels
    ours.kc.kernel_info()
    info = ours.kc.get_shell_msg(timeout=30)["content"]
    assert "kernel subshells" not in info["supported_features"]
    request = ours.kc.session.msg("create_subshell_request", {})
    ours.kc.control_channel.send(request)
    reply = ours.kc.control_channel.get_msg(timeout=30)
    assert reply["parent_header"]["msg_id"] == request["header"]["msg_id"]
    assert (reply["content"]["status"], reply["content"]["evalue"]) == ("error", SUBSHELLS_REFUSED)
    assert ours.out("print('still one shell')") == "still one shell\n"


# --------------------------------------------------------------------------- the debugger

_CELL_FILE = re.compile(r"^> \S+\.py\(", re.MULTILINE)  # where the cell's source was written differs by kernel


def _debugged(kernel: Kernel, code: str, answers: list[str]) -> tuple[str, list[str], str, list[str]]:
    replies = iter(answers)
    prompts: list[str] = []

    def answer(request: dict[str, Any]) -> str:
        prompts.append(request["prompt"])
        return next(replies, "q")

    result = kernel.run(code, answer=answer)
    text = _CELL_FILE.sub("> <cell>.py(", plain(result.stream()))
    return result.status, prompts, text, [error["ename"] for error in result.errors]


def test_debug_and_pdb_reach_the_failed_frames_as_under_ipykernel(kernels: tuple[Kernel, Kernel]) -> None:
    failing = "def invert_debug(x):\n    return 1 / x\ninvert_debug(0)"
    seen = []
    for kernel in kernels:
        kernel.run(failing)
        post_mortem = _debugged(kernel, "%debug", ["p x", "q"])
        assert kernel.out("%pdb on") == "Automatic pdb calling has been turned ON\n"
        automatic = _debugged(kernel, failing.replace("(0)", "(0.0)"), ["p x", "q"])
        assert kernel.out("%pdb off") == "Automatic pdb calling has been turned OFF\n"
        seen.append((post_mortem, automatic))
    assert seen[0] == seen[1]
    post_mortem, automatic = seen[0]
    assert post_mortem[:2] == ("ok", ["ipdb> ", "ipdb> "]) and post_mortem[2].endswith("\n0\n")
    assert (automatic[0], automatic[3]) == ("error", ["ZeroDivisionError"]) and automatic[2].endswith("\n0.0\n")


# --------------------------------------------------------------------------- interrupts

# The handler works for a second (well inside the kernel's 5 s interrupt grace) before it saves.
HANDLER_WORK = "time.sleep(1)"
CHECKPOINT = (
    "import time\ntry:\n    print('started', flush=True)\n    time.sleep(60)\n"
    f"except KeyboardInterrupt:\n    {HANDLER_WORK}\n    checkpoint = 'saved'\n    print('saved')"
)


def _interrupt_when_started(km: KernelManager, times: int) -> Any:
    def during(msg: dict[str, Any]) -> None:
        if msg["msg_type"] == "stream" and "started" in msg["content"]["text"]:
            for n in range(times):
                threading.Timer(0.3 + 0.7 * n, km.interrupt_kernel).start()

    return during


def test_an_interrupt_lets_the_cells_handler_finish_and_keeps_its_state(kernels: tuple[Kernel, Kernel]) -> None:
    for kernel in kernels:
        result = kernel.run(CHECKPOINT, during=_interrupt_when_started(kernel.km, 1))
        assert (result.status, result.stream(), result.errors) == ("ok", "started\nsaved\n", []), kernel.name
    ours, _theirs = kernels
    assert same_output(kernels, "print(checkpoint)") == ["saved\n"]
    assert ours.run("pass").status == "ok"


def test_an_interrupt_handler_that_raises_answers_with_its_own_error(kernels: tuple[Kernel, Kernel]) -> None:
    code = CHECKPOINT.replace(HANDLER_WORK, "handler_ran = True").replace(
        "print('saved')", "raise ValueError('stopped early')"
    )
    for kernel in kernels:
        result = kernel.run(code, during=_interrupt_when_started(kernel.km, 1))
        assert [error["ename"] for error in result.errors] == ["ValueError"], kernel.name
        assert (result.content["ename"], result.content["evalue"]) == ("ValueError", "stopped early"), kernel.name
    assert same_output(kernels, "print(handler_ran)") == ["True\n"]


def test_a_second_interrupt_stops_the_handler_at_once(kernels: tuple[Kernel, Kernel]) -> None:
    slow_handler = CHECKPOINT.replace(HANDLER_WORK, "time.sleep(300)").replace("checkpoint", "never_saved")
    for kernel in kernels:
        result = kernel.run(slow_handler, during=_interrupt_when_started(kernel.km, 2), timeout=60)
        assert (result.status, result.content["ename"], result.stream()) == ("error", "KeyboardInterrupt", "started\n")
        gone = kernel.run("never_saved")
        assert gone.content["ename"] == "NameError", kernel.name


# --------------------------------------------------------------------------- work an earlier cell left

LEAVE_WORK = (
    "import concurrent.futures as cf, multiprocessing, subprocess, time\n"
    "def cube(n):\n    return n ** 3\n"
    "processes = cf.ProcessPoolExecutor(2)\nprint(list(processes.map(cube, range(3))))\n"
    "pool = multiprocessing.Pool(2)\nprint(pool.map(cube, range(3)))\n"
    "pending = pool.apply_async(time.sleep, (60,))\nslow_items = pool.imap(time.sleep, [60, 60])\n"
    "threads = cf.ThreadPoolExecutor(2)\nslow = threads.submit(time.sleep, 60)\n"
    "child = subprocess.Popen(['sleep', '60'])\nquick = subprocess.Popen(['true'])\nquick.wait()\n"
    "worker = multiprocessing.Process(target=time.sleep, args=(60,))\nworker.start()"
)


@pytest.fixture(scope="module")
def left_work(kernels: tuple[Kernel, Kernel]) -> tuple[Kernel, int]:
    """The cellbox kernel after a cell that left pools, executors and processes running; and that cell's number."""
    ours, _theirs = kernels
    result = ours.run(LEAVE_WORK)
    assert result.status == "ok" and result.stream() == "[0, 1, 8]\n[0, 1, 8]\n", result.errors
    return ours, int(result.content["execution_count"])


@pytest.mark.parametrize(
    ("code", "what"),
    [
        ("processes.submit(cube, 2)", "this ProcessPoolExecutor's workers"),
        ("list(processes.map(cube, range(3)))", "this ProcessPoolExecutor's workers"),
        ("pool.map(cube, range(3))", "this Pool's workers"),
        ("pool.apply_async(cube, (2,)).get()", "this Pool's workers"),
        ("pending.get()", "the worker processes of this result"),
        ("list(slow_items)", "the worker processes of this result"),
        ("slow.result()", "this Future's work"),
        ("cf.wait([slow]); slow.result()", "this Future's work"),
    ],
)
def test_work_left_by_an_earlier_cell_fails_at_once_naming_that_cell(
    left_work: tuple[Kernel, int], code: str, what: str
) -> None:
    ours, cell = left_work
    result = ours.run(code, timeout=60)
    assert (result.content["ename"], result.content["evalue"]) == ("CellWorkEndedError", ended_message(what, cell))


def test_processes_an_earlier_cell_left_report_the_kill_that_ended_them(left_work: tuple[Kernel, int]) -> None:
    ours, _cell = left_work
    code = "print(child.poll(), child.wait(), quick.returncode, worker.is_alive(), worker.exitcode)"
    assert ours.out(code) == "-9 -9 0 False -9\n"


def test_an_event_loop_task_waiting_on_work_of_an_earlier_cell_fails_at_once(kernels: tuple[Kernel, Kernel]) -> None:
    ours, _theirs = kernels
    leave = (
        "import asyncio, time\nloop = asyncio.get_running_loop()\n"
        "in_thread = loop.run_in_executor(None, time.sleep, 60)\nnap = asyncio.ensure_future(asyncio.sleep(0.2))\n"
        "await asyncio.sleep(0)"
    )
    left = ours.run(leave)
    assert left.status == "ok", left.errors
    later = ours.run("await nap\nawait asyncio.wait_for(in_thread, 30)", timeout=60)
    # The task of the loop itself goes on (its state is the cell's); what it waited for in a thread ended.
    assert (later.content["ename"], later.content["evalue"]) == (
        "CellWorkEndedError",
        ended_message("this Future's work", int(left.content["execution_count"])),
    )


def test_a_thread_pool_of_an_earlier_cell_takes_new_work(kernels: tuple[Kernel, Kernel]) -> None:
    made = (
        "import concurrent.futures as cf\nshared_pool = cf.ThreadPoolExecutor(2)\n"
        "print(sum(shared_pool.map(abs, [-1, -2])))"
    )
    later = "print(list(shared_pool.map(abs, [-3, -4, -5])))"
    assert same_output(kernels, made, later, later) == ["3\n", "[3, 4, 5]\n", "[3, 4, 5]\n"]


# --------------------------------------------------------------------------- time at a prompt

WALL = 5.0  # the wall-clock limit of the prompt test's cells, seconds
WAIT_CAP = 8.0  # seconds of waiting at prompts that its session does not count against it


def _answer_after(seconds: float) -> Any:
    def answer(request: dict[str, Any]) -> str:
        threading.Event().wait(seconds)
        return "forty-two"

    return answer


@pytest.mark.slow
def test_time_at_a_prompt_is_off_the_wall_clock_up_to_the_sessions_cap(
    kernels: tuple[Kernel, Kernel], tmp_path: Path
) -> None:
    code = "answer = input('? ')\nprint(answer)"
    extra = [f"--CellboxKernel.wall_time={WALL:g}", f"--CellboxKernel.input_wait_cap={WAIT_CAP:g}"]
    _ours, theirs = kernels
    expected = theirs.run(code, answer=_answer_after(WALL + 2))
    with running_kernel("cellbox", cwd=str(tmp_path), extra=extra) as (_km, kc):
        # The student answers after the cell's wall limit: the wait did not count, as under ipykernel (no limit).
        waited = execute(kc, code, answer=_answer_after(WALL + 2))
        assert (waited.status, waited.stream()) == (expected.status, expected.stream()) == ("ok", "forty-two\n")
        # 7 of the session's 8 s are spent: the next long wait runs into the wall limit at about 5 + 1 s.
        capped = execute(kc, code, answer=_answer_after(WALL + 4))
        assert capped.content["ename"] == "CellTimeoutError", capped.content
        assert execute(kc, "print(answer)").stream() == "forty-two\n"
