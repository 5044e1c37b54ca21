"""A session's resources do not grow with the number of cells, as under ipykernel's one process.

Each cell runs in a fork of the last one's image; a library that clears a cache
at every fork (matplotlib's fonts) would open its files again in every cell
while its other caches keep the old ones.  First the at-fork rule on its own (in
a plain Python child), then a real kernel rendering mathtext cell after cell.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from kernelkit import execute, running_kernel

# What each child of the at-fork check prints: the cache's size after the fork, and whether the other handler ran.
AT_FORK_CHECK = textwrap.dedent(
    """
    import functools, os
    from cellbox.sandbox import atfork
    atfork.install()

    @functools.lru_cache
    def font(name):
        return open(os.devnull)

    ran = []
    os.register_at_fork(after_in_child=font.cache_clear)
    os.register_at_fork(after_in_child=lambda: ran.append("reset"))
    font("a")

    def child(fork):
        pid = fork()
        if pid == 0:
            print(font.cache_info().currsize, ran, flush=True)
            os._exit(0)
        os.waitpid(pid, 0)

    child(atfork.chain_fork)
    child(os.fork)
    child(atfork.chain_fork)
    """
)


def test_a_cache_cleared_at_fork_is_kept_at_the_chains_forks_and_cleared_at_the_notebooks() -> None:
    lines = subprocess.run(
        [sys.executable, "-c", AT_FORK_CHECK], capture_output=True, text=True, check=True, timeout=60
    ).stdout.splitlines()
    # The chain's forks keep the cache (one entry) and still run every other handler; os.fork clears it.
    assert lines == ["1 ['reset']", "0 ['reset']", "1 ['reset']"]


def test_register_at_fork_refuses_what_os_register_at_fork_refuses() -> None:
    check = (
        "from cellbox.sandbox import atfork\natfork.install()\nimport os\n"
        "for bad in ({}, {'before': 1}):\n"
        "    try:\n        os.register_at_fork(**bad)\n    except TypeError as e:\n        print('TypeError')\n"
    )
    out = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.split() == ["TypeError", "TypeError"]


# --------------------------------------------------------------------------- a real session

matplotlib = pytest.importorskip("matplotlib")

CELLS = 60
SETUP = "import io, os\nimport matplotlib\nmatplotlib.use('Agg')\nfrom matplotlib import mathtext\n"
# A new formula in every cell, as a SymPy lecture's: each one parsed and rendered to PNG.
RENDER = (
    "buf = io.BytesIO()\n"
    "mathtext.math_to_image(r'$\\frac{x^{%d}}{\\sqrt{y}} + \\int_0^1 \\alpha\\,d\\beta$', buf, format='png', dpi=100)\n"
    "print(len(os.listdir('/proc/self/fd')), sum(1 for _ in open('/proc/self/maps')))"
)

# A cell that forks: the font cache's size in the child, and whether the cell's own still holds fonts.
NOTEBOOK_FORK = (
    "from matplotlib import font_manager\nsize = font_manager._get_font.cache_info\nr, w = os.pipe()\n"
    "pid = os.fork()\nif pid == 0:\n    os.write(w, str(size().currsize).encode())\n    os._exit(0)\n"
    "os.waitpid(pid, 0)\nprint(size().currsize > 0, os.read(r, 9))"
)


def session_descriptors(kernel_pid: int) -> int:
    """Open fds of every process of the kernel's session (the keeper, its snapshots, the spare)."""
    total = 0
    for process in psutil.Process(kernel_pid).children(recursive=True):
        try:
            total += process.num_fds()
        except psutil.Error:
            continue
    return total


def settled_session_descriptors(kernel_pid: int, looks: int = 10, gap: float = 0.1) -> int:
    """The fewest fds the session held over ``looks`` looks ``gap`` seconds apart (seconds, psutil).

    The keeper settles a cell after its reply: it kills the snapshot past the undo depth and forks the next
    spare a moment later, so one look can catch a dying snapshot beside the new one. The fewest over a second
    is what the chain itself holds.
    """
    seen = []
    for _ in range(looks):
        seen.append(session_descriptors(kernel_pid))
        time.sleep(gap)
    return min(seen)


@pytest.mark.slow
def test_sixty_cells_of_mathtext_keep_descriptors_maps_and_the_session_flat(tmp_path: Path) -> None:
    counts: dict[int, tuple[int, int]] = {}
    session: dict[int, int] = {}
    with running_kernel("cellbox", cwd=str(tmp_path)) as (km, kc):
        assert execute(kc, SETUP).status == "ok"
        kernel_pid = km.provisioner.process.pid  # type: ignore[union-attr]
        for cell in range(1, CELLS + 1):
            result = execute(kc, RENDER % cell)
            assert result.status == "ok", (cell, result.traceback)
            fds, maps = map(int, result.stream().split())
            counts[cell] = (fds, maps)
            session[cell] = settled_session_descriptors(kernel_pid) if cell in (5, CELLS) else 0
        # A notebook's own fork still clears matplotlib's font cache, as under ipykernel.
        forked = execute(kc, NOTEBOOK_FORK)
    assert forked.stream().strip() == "True b'0'"
    fifth, last = counts[5], counts[CELLS]
    # Before, every cell held 18 more descriptors than the one before it (its fonts opened again).
    assert last[0] <= fifth[0] + 3, counts
    # The maps of the process grow by its heap alone, not by a file per cell.
    assert last[1] <= fifth[1] + CELLS // 2, counts
    # The chain is as deep as the undo depth, whatever the notebook's length.
    assert session[CELLS] <= session[5] + 10, session
