"""What grading costs: ``cellbox grade`` against two plain loops over the same submissions.

Makes N small submissions (default 50; a correct ``fib`` module each) and a
five-test instructor suite, then grades them three ways, each with two at once
(``--jobs 2`` / a two-thread pool):

* **cellbox**: ``cellbox grade --jobs 2`` (a task directory and a fresh venv per
  submission, the sandbox, the grader's reporter, the reports);
* **(a) shared venv**: the plain, unsandboxed loop: one ``pytest`` per
  submission with this interpreter (pytest already installed, plugin
  autoloading off as in cellbox), the submission on ``PYTHONPATH``: the floor;
* **(b) naive venv**: per submission ``python -m venv``, ``pip install pytest``
  (from pip's cache after the first one, or the index), then ``pytest``.

Then one small call across the grading boundary: ``adder.add(1, 2)`` from
this process through a stand-in (:mod:`cellbox.grading.bridge`) into a
sandboxed submission process (isolation ``auto``), ``--calls`` times; prints
the median and the 90th percentile in milliseconds.

The submissions are split into chunks (default 5) and the three ways take
turns chunk by chunk, so that a busy moment on the machine hits all three
alike.  Prints, for each, the median seconds per submission, the summed wall
time, and ratios.  Run it with::

    .venv/bin/python benchmarks/grading.py [--submissions 50] [--naive 50] [--calls 2000]

``--naive`` grades only that many submissions the naive way (it is slow);
its per-submission median is still comparable.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TESTS = """
import fib

def test_base_cases():
    assert fib.fib(0) == 0
    assert fib.fib(1) == 1

def test_ten():
    assert fib.fib(10) == 55

def test_twenty():
    assert fib.fib(20) == 6765

def test_two():
    assert fib.fib(2) == 1

def test_three():
    assert fib.fib(3) == 2
"""
FIB = """
def fib(n):
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return a
"""
JOBS = 2


def make(root: Path, count: int, chunks: int) -> tuple[Path, list[list[Path]]]:
    """The suite, and ``count`` submissions in ``chunks`` folders of submissions."""
    tests = root / "tests"
    tests.mkdir(parents=True)
    (tests / "test_fib.py").write_text(TESTS)
    folders: list[list[Path]] = [[] for _ in range(chunks)]
    for index in range(count):
        folder = root / f"chunk{index % chunks}" / f"student{index:03d}"
        folder.mkdir(parents=True)
        (folder / "fib.py").write_text(FIB)
        folders[index % chunks].append(folder)
    return tests, folders


def timed_pool(function, items: list[Path]) -> tuple[list[float], float]:  # type: ignore[no-untyped-def]
    """Run ``function(item)`` for every item on a two-thread pool: per-item seconds and the total."""

    def one(item: Path) -> float:
        started = time.perf_counter()
        function(item)
        return time.perf_counter() - started

    started = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(JOBS) as pool:
        times = list(pool.map(one, items))
    return times, time.perf_counter() - started


def shared_venv(tests: Path):  # type: ignore[no-untyped-def]
    def grade(folder: Path) -> None:
        # The strict floor: no third-party plugins (as cellbox grade), no bytecode writes.
        env = {
            **os.environ,
            "PYTHONPATH": str(folder),
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
        }
        result = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tests)],
            cwd=folder,
            env=env,
            capture_output=True,
            text=True,
        )
        if result.returncode != 0:
            raise SystemExit(f"(a) failed for {folder.name}:\n{result.stdout}{result.stderr}")

    return grade


def naive_venv(tests: Path, scratch: Path):  # type: ignore[no-untyped-def]
    def grade(folder: Path) -> None:
        env_dir = scratch / f"venv-{folder.name}"
        try:
            subprocess.run([sys.executable, "-m", "venv", str(env_dir)], check=True, capture_output=True)
            python = str(env_dir / "bin" / "python")
            subprocess.run(
                [python, "-m", "pip", "install", "-q", "--disable-pip-version-check", "pytest"],
                check=True,
                capture_output=True,
            )
            result = subprocess.run(
                [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tests)],
                cwd=folder,
                env={**os.environ, "PYTHONPATH": str(folder)},
                capture_output=True,
                text=True,
            )
            if result.returncode != 0:
                raise SystemExit(f"(b) failed for {folder.name}:\n{result.stdout}{result.stderr}")
        finally:
            shutil.rmtree(env_dir, ignore_errors=True)

    return grade


def cellbox_grade(tests: Path, subs: Path, out: Path) -> tuple[list[float], float]:
    script = Path(sys.executable).with_name("cellbox")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "cellbox.cli"]
    started = time.perf_counter()
    subprocess.run(
        [*command, "grade", str(subs), "--tests", str(tests), "--out", str(out), "--jobs", str(JOBS)],
        check=True,
        capture_output=True,
    )
    total = time.perf_counter() - started
    rows = json.loads((out / "results.json").read_text())["submissions"]
    verdicts = {row["verdict"] for row in rows}
    if verdicts != {"verified"}:
        raise SystemExit(f"cellbox grade gave {verdicts}, expected only verified")
    return [row["duration"] for row in rows], total


def call_latency(calls: int, scratch: Path) -> list[float]:
    """Seconds of each of ``calls`` calls of ``adder.add(1, 2)`` into a sandboxed submission process."""
    from cellbox.grading import bridge as boundary
    from cellbox.grading.task import GRADE_ISOLATION, _venv_env
    from cellbox.grading.venvs import BaseLibrary, create_venv
    from cellbox.sandbox.environment import TaskDirectory
    from cellbox.sandbox.limits import Limits

    task = TaskDirectory.create(str(scratch), prefix="cellbox-bench-call-")
    root = task.work / "submission"
    root.mkdir()
    (root / "adder.py").write_text("def add(a, b):\n    return a + b\n")
    python = create_venv(task.path / "venv")
    with BaseLibrary.build() as base:
        lib = base.copy_to(task.path / "lib")
        spec = boundary.ProcessSpec(
            python=str(python),
            lib=str(lib),
            root=str(root),
            task=str(task.path),
            limits=Limits(wall_time=600, cpu_time=600),
            isolation=GRADE_ISOLATION,
            env=_venv_env(python.parent.parent),
        )
        bridge = boundary.Bridge(spec)
        bridge.start()
        boundary.install(bridge, ["adder"], str(Path(__file__).parent))
        try:
            import adder  # type: ignore[import-not-found]  # the stand-in

            add = adder.add
            if add(1, 2) != 3:
                raise SystemExit("adder.add(1, 2) did not give 3")
            times = []
            for _ in range(calls):
                started = time.perf_counter()
                add(1, 2)
                times.append(time.perf_counter() - started)
        finally:
            bridge.close()
            task.remove()
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--submissions", type=int, default=50)
    parser.add_argument("--naive", type=int, default=50, help="how many to grade the naive way (b)")
    parser.add_argument("--chunks", type=int, default=5, help="turns the three ways take")
    parser.add_argument("--calls", type=int, default=2000, help="calls across the boundary to time")
    args = parser.parse_args()
    print(
        f"{platform.python_implementation()} {platform.python_version()}, {os.cpu_count()} cores, "
        f"{args.submissions} submissions, {JOBS} at once, {args.chunks} chunks"
    )
    names = ("cellbox grade", "(a) shared venv, plain pytest", "(b) new venv + pip install + pytest")
    figures: dict[str, tuple[list[float], float]] = {name: ([], 0.0) for name in names}
    naive_per_chunk = -(-args.naive // args.chunks)

    def add(name: str, result: tuple[list[float], float]) -> None:
        times, total = figures[name]
        figures[name] = (times + result[0], total + result[1])

    with tempfile.TemporaryDirectory(prefix="cellbox-bench-") as scratch:
        root = Path(scratch)
        tests, chunks = make(root, args.submissions, args.chunks)
        for index, folders in enumerate(chunks):
            add(names[0], cellbox_grade(tests, folders[0].parent, root / f"out{index}"))
            add(names[1], timed_pool(shared_venv(tests), folders))
            add(names[2], timed_pool(naive_venv(tests, root), folders[:naive_per_chunk]))
        report(figures, names)
        if args.calls:
            times = sorted(call_latency(args.calls, root))
            median, p90 = 1000 * statistics.median(times), 1000 * times[int(0.9 * len(times))]
            print(
                f"one call across the boundary (adder.add(1, 2), isolation auto): median {median:.3f} ms, "
                f"90th percentile {p90:.3f} ms, n={len(times)}"
            )


def report(figures: dict[str, tuple[list[float], float]], names: tuple[str, ...]) -> None:
    floor = statistics.median(figures[names[1]][0])
    ours = statistics.median(figures[names[0]][0])
    print(f"{'':38} {'median s/submission':>20} {'total s':>9} {'n':>4} {'median / (a)':>13}")
    for name in names:
        times, total = figures[name]
        median = statistics.median(times)
        print(f"{name:38} {median:20.3f} {total:9.1f} {len(times):4d} {median / floor:13.2f}")
    naive = statistics.median(figures[names[2]][0])
    print(
        f"cellbox overhead over (a): {ours - floor:.3f} s per submission (median); (b) / cellbox: {naive / ours:.1f}x"
    )


if __name__ == "__main__":
    main()
