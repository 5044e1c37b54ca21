"""The trusted test process: pytest, the instructor's tests and the reporter, with the submission out of reach.

Started by the grader (:func:`cellbox.grading.task.grade_submission`) through
the sandbox, as the grader's user and with the grader's Python environment::

    python -I -B -u -m cellbox.grading.trusted CONFIG.json -- PYTEST_ARGS...

``CONFIG.json`` (written by the grader) says how to start the submission's
process (:class:`~cellbox.grading.bridge.ProcessSpec`), which module names it
offers, where the tests are, and the default timeout per test.  This process
starts the submission's process at once (it boots while pytest starts),
makes its modules importable for the tests (:mod:`cellbox.grading.bridge`),
and runs ``pytest.main`` with :class:`TimeoutPlugin`; the grader's reporter
(``-p cellbox.grading.reporter``) writes the evidence to the grader.  No code
of the submission is imported or run here.

``--collect`` instead collects the tests once per grading run, with no
submission at all: every module a test imports that is not found here is a
:class:`Placeholder`.  The node ids collected that way are the tests each
submission's run must collect (:meth:`cellbox.grading.task.Suite.find`).
"""

from __future__ import annotations

import json
import sys
import types
from collections.abc import Iterator
from typing import Any

__all__ = ["main", "TimeoutPlugin", "Placeholder", "placeholder_finder", "timeout_of"]

INT_DIGITS = 300_000  # digits of an int the submission may send (about 0.4 s to convert; Python's default is 4300)
TIMEOUT_MARKER = (
    "timeout(seconds): fail the test when its calls into the submission take more than this many seconds in all "
    "(cellbox grade: the submission's process is killed and started again for the next test)"
)


def timeout_of(item: Any, default: float | None) -> float | None:
    """Seconds a test may spend in the submission: its ``timeout`` marker, else ``default`` (``None``: no limit)."""
    marker = item.get_closest_marker("timeout")
    if marker is None:
        return default
    value = marker.args[0] if marker.args else marker.kwargs.get("timeout", default)
    try:
        seconds = float(value) if value is not None else None
    except (TypeError, ValueError):
        return default
    return seconds if seconds and seconds > 0 else None


class TimeoutPlugin:
    """Gives each test's requests to the submission a deadline (setup, call and teardown together)."""

    def __init__(self, bridge: Any, default: float | None) -> None:
        self.bridge = bridge
        self.default = default

    def pytest_configure(self, config: Any) -> None:
        config.addinivalue_line("markers", TIMEOUT_MARKER)

    def pytest_runtest_protocol(self, item: Any, nextitem: Any) -> None:
        # Registered after pytest's runner, so called before it; returning None lets it run the test.
        self.bridge.set_deadline(timeout_of(item, self.default))

    def pytest_runtest_logfinish(self, nodeid: str, location: Any) -> None:
        self.bridge.set_deadline(None)

    def pytest_sessionfinish(self, session: Any, exitstatus: int) -> None:
        from . import reporter

        outcomes = self.bridge.close()
        reporter.send_runs([outcome.to_json() if outcome is not None else None for outcome in outcomes])


class Placeholder(types.ModuleType):
    """What a test imports from the submission while the tests are only collected: anything, doing nothing."""

    def __init__(self, name: str = "placeholder") -> None:
        super().__init__(name)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return Placeholder(f"{self.__name__}.{name}")

    def __call__(self, *args: Any, **kwargs: Any) -> Placeholder:
        return Placeholder(f"{self.__name__}()")

    def __iter__(self) -> Iterator[Any]:
        return iter(())

    def __getitem__(self, key: Any) -> Placeholder:
        return Placeholder(f"{self.__name__}[]")


class ImportsPlugin:
    """While the tests are only collected: reports the top-level names they imported that this Python lacks."""

    def __init__(self, finder: Any) -> None:
        self.finder = finder

    def pytest_collection_finish(self, session: Any) -> None:
        from . import reporter

        reporter.send_imports(sorted(self.finder.names))


def placeholder_finder(tests: str) -> Any:
    """A finder, last on ``sys.meta_path``, giving a :class:`Placeholder` for imports written in the tests.

    Its ``names`` are the top-level names it answered for a test file (the
    modules the grader's Python lacks: the submission's, or a missing library).
    """
    import importlib.abc
    import importlib.machinery

    from .bridge import _imported_from

    folder = tests.rstrip("/") + "/"

    class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
        names: set[str] = set()

        def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
            if "." not in fullname and not _imported_from(folder):
                return None
            self.names.add(fullname.partition(".")[0])
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

        def create_module(self, spec: Any) -> types.ModuleType:
            module = Placeholder(spec.name)
            module.__path__ = []  # type: ignore[attr-defined]
            return module

        def exec_module(self, module: types.ModuleType) -> None:
            return None

    return _Finder()


def main(argv: list[str] | None = None) -> int:
    """Run the tests (or only collect them); return pytest's exit status."""
    args = list(sys.argv[1:] if argv is None else argv)
    collect = args[:1] == ["--collect"]
    if collect:
        args.pop(0)
    with open(args.pop(0), encoding="utf-8") as handle:
        config = json.load(handle)
    if args[:1] == ["--"]:
        args.pop(0)
    plugins: list[Any] = []
    # execnet sends a large int as its digits: let an honest factorial(2000) through, keep the conversion short.
    sys.set_int_max_str_digits(INT_DIGITS)
    if collect:
        finder = placeholder_finder(config["tests"])
        sys.meta_path.append(finder)
        plugins.append(ImportsPlugin(finder))
    else:
        from .bridge import Bridge, ProcessSpec, install

        bridge = Bridge(ProcessSpec.from_json(config["process"]))
        bridge.start()  # boots while pytest is imported and collects
        install(bridge, config["offered"], config["tests"], config.get("named"), config.get("withheld", []))
        plugins.append(TimeoutPlugin(bridge, config.get("test_timeout")))
    import pytest

    return int(pytest.main(args, plugins=plugins))


if __name__ == "__main__":
    raise SystemExit(main())
