"""The trusted side of the grading boundary: stand-ins for the submission's modules, whose calls run elsewhere.

Runs in the trusted test process (:mod:`cellbox.grading.trusted`), beside
pytest, the instructor's tests and the reporter, which never import or run
submission code.  The submission runs in its own sandboxed process
(:class:`~cellbox.grading.connection.Connection`, started through
:func:`cellbox.sandbox.start` with the grading limits and isolation), running
:mod:`cellbox.grading.worker` behind an execnet gateway on a socket; requests
and answers are plain data (:mod:`cellbox.grading.plain`).

What a test sees:

* ``import mean`` (or ``from mean import mean``) of a module the submission
  offers gives a :class:`StandInModule` (:class:`SubmissionFinder`, last on
  ``sys.meta_path``: the standard library, the grader's modules and the
  tests' own helpers are found first, so a submission cannot shadow them);
* a value the submission returns is a copy in exact built-in types (a
  subclass of a built-in arrives as its built-in value, a numpy array as a
  numpy array); anything else is a :class:`RemoteObject`, whose attributes,
  calls, ``len``, iteration, indexing and ``repr`` run in the submission's
  process, and which equals only itself: ``==`` never asks the submission;
* an exception the submission raises is raised here: a built-in exception as
  itself, the submission's own exception class as a local class of the same
  name deriving from the nearest built-in one and from :class:`SubmissionError`
  (``from bank import Overdrawn`` gives that same class, so ``pytest.raises``
  works), ``SystemExit`` as :class:`SubmissionExit`;
* a call that runs past the test's deadline (:meth:`Bridge.set_deadline`)
  kills the submission's process and raises :class:`SubmissionTimeout`; the
  next request starts a new process.

The channel only carries plain data one way and requests the other: this
side never unpickles, evals or runs anything the submission sends, and
execnet refuses a remote execution request from the worker's side.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import threading
import time
import types
import weakref
from collections.abc import Iterator, Sequence
from typing import Any

from execnet import gateway_base

from ..sandbox.outcome import Outcome
from . import plain
from .connection import ENDED_WAIT, Connection, ProcessSpec, offered_modules
from .imports import refused

_NUMPY_KINDS = "biufcSU"  # dtype kinds that cross as arrays (as in the worker)

__all__ = [
    "Bridge",
    "Connection",
    "ProcessSpec",
    "RemoteObject",
    "StandInModule",
    "SubmissionFinder",
    "SubmissionError",
    "SubmissionExit",
    "SubmissionGone",
    "SubmissionImportError",
    "SubmissionTimeout",
    "ProtocolError",
    "new",
    "value_of",
    "submission_module",
    "submission_tmp_path",
    "offered_modules",
]


class SubmissionError(Exception):
    """Something the submission did, seen in the trusted process; the base of the submission's own exceptions."""


class SubmissionImportError(SubmissionError, ImportError):
    """Importing one of the submission's modules raised, exited or ended its process."""


class SubmissionExit(SubmissionError):
    """The submission's code raised ``SystemExit`` (or ``KeyboardInterrupt``) during a call."""


class SubmissionGone(SubmissionError):
    """The submission's process ended during a request, or an object belonged to an earlier process."""


class ProtocolError(SubmissionError):
    """The submission's process answered something that is not an answer (a broken or forged message)."""


class SubmissionTimeout(BaseException):
    """A call into the submission ran past the test's timeout; the submission's process was killed.

    A ``BaseException``, as pytest's own ``Failed`` is: a test's ``except
    Exception`` does not swallow it.
    """


class Bridge:
    """The trusted process's one link to the submission: requests, deadlines, restarts, values.

    Args:
        spec: how to start the submission's process.
        numpy: whether numpy is importable here (arrays then cross as arrays).
    """

    def __init__(self, spec: ProcessSpec, numpy: bool | None = None) -> None:
        self.spec = spec
        self.numpy = importlib.util.find_spec("numpy") is not None if numpy is None else numpy
        self.connection: Connection | None = None
        self.generation = 0
        self.deadline: float | None = None
        self.timeout: float | None = None
        self.outcomes: list[Outcome | None] = []
        self._closing: list[threading.Thread] = []
        self.released: list[int] = []
        self._lock = threading.RLock()
        self._proxies: weakref.WeakValueDictionary[tuple[int, int], RemoteObject] = weakref.WeakValueDictionary()
        self._exceptions: dict[tuple[str, str], type[BaseException]] = {}

    # ------------------------------------------------------------ process

    def start(self) -> None:
        """Start a submission process now (it boots while the caller goes on)."""
        with self._lock:
            if self.connection is None:
                self.connection = Connection(self.spec, self.numpy)
                self.generation += 1
                self.released.clear()

    def _drop(self, kill: bool) -> Connection | None:
        connection, self.connection = self.connection, None
        if connection is not None:
            if kill:
                connection.kill()
            closing = threading.Thread(target=lambda: self.outcomes.append(connection.close()), daemon=True)
            closing.start()
            self._closing.append(closing)
        return connection

    def close(self) -> list[Outcome | None]:
        """Kill the current process; return the outcome of every process this bridge started."""
        with self._lock:
            connection, self.connection = self.connection, None
            if connection is not None:
                self.outcomes.append(connection.close())
            for closing in self._closing:
                closing.join(ENDED_WAIT)
            return list(self.outcomes)

    def set_deadline(self, seconds: float | None) -> None:
        """Give the requests from now on ``seconds`` in all (a test's timeout), or no deadline (``None``)."""
        self.timeout = seconds
        self.deadline = time.monotonic() + seconds if seconds else None

    # ------------------------------------------------------------ requests

    def ask(self, op: str, args: tuple[Any, ...], what: str, restart: bool = True) -> tuple[str, Any]:
        """One request to the submission; returns ``(status, payload)``; the code's output goes to this stdout/stderr.

        Raises:
            SubmissionTimeout: the deadline passed (the process was killed).
            SubmissionGone: the process ended during the request, or is gone and ``restart`` is false.
            ProtocolError: the answer is not one.
        """
        with self._lock:
            if self.deadline is not None and time.monotonic() >= self.deadline:
                raise SubmissionTimeout(f"timed out after {self.timeout:g} s: no time left for {what}")
            if self.connection is None:
                if not restart:
                    raise SubmissionGone(f"the submission's process has ended; {what} was not run")
                self.start()
            connection = self.connection
            assert connection is not None
            try:
                connection.connect()
            except BaseException as exc:
                ended = connection.ended(wait=0.5)
                self._drop(kill=True)
                raise SubmissionGone(
                    f"the submission's process did not start ({ended}: {exc!r}); {what} was not run"
                ) from None
            released, self.released = self.released, []
            remaining = None if self.deadline is None else max(self.deadline - time.monotonic(), 0.001)
            try:
                answer = connection.request((op, args, released), remaining)
            except gateway_base.Channel.TimeoutError:
                self._drop(kill=True)
                self.start()  # the next test's process boots now
                raise SubmissionTimeout(f"timed out after {self.timeout:g} s in {what}") from None
            except (EOFError, OSError, gateway_base.RemoteError):
                ended = connection.ended()
                self._drop(kill=True)
                raise SubmissionGone(f"the submission's process ended ({ended}) during {what}") from None
            except BaseException:
                # Interrupted while waiting: the answer could never be matched with its request.
                self._drop(kill=True)
                raise
        return self._answer(answer)

    def _answer(self, answer: Any) -> tuple[str, Any]:
        if type(answer) is not tuple or len(answer) != 4 or type(answer[0]) is not str:
            self._drop(kill=True)
            raise ProtocolError("the submission's process answered something that is not an answer")
        status, payload, out, err = answer
        if type(out) is str and out:
            sys.stdout.write(out)
        if type(err) is str and err:
            sys.stderr.write(err)
        return status, payload

    def result(self, op: str, args: tuple[Any, ...], what: str, path: tuple[Any, ...] | None = None) -> Any:
        """Ask, then turn the answer into a value here (or raise what the submission raised)."""
        status, payload = self.ask(op, args, what)
        return self.value(status, payload, what, path)

    def value(self, status: str, payload: Any, what: str, path: tuple[Any, ...] | None = None) -> Any:
        """The value of an ``ok`` answer; raise for the others.  ``path`` names a module-level object's place."""
        if status == "ok":
            try:
                value, holes = payload
                if path is not None and type(holes) is list and len(holes) == 1 and not holes[0][0]:
                    return self._made(holes[0][1], path)  # a module-level object: addressed by its name
                return plain.decode(value, holes, lambda descriptor: self._made(descriptor, None))
            except (TypeError, ValueError, KeyError, IndexError) as exc:
                raise ProtocolError(f"a malformed value from the submission ({exc})") from None
        if status == "raised":
            raise self.exception(payload, what)
        if status == "stop":
            raise StopIteration
        raise ProtocolError(f"the submission's process could not answer {what}: {str(payload)[:200]}")

    def _made(self, descriptor: Any, path: tuple[Any, ...] | None) -> Any:
        kind = descriptor[0]
        if kind == "value" and type(descriptor[1]) in plain.ATOMS:
            return descriptor[1]
        if kind == "ndarray" and self.numpy:
            return _array(descriptor)
        if kind != "ref" or type(descriptor[1]) is not int or type(descriptor[2]) is not dict:
            raise ProtocolError(f"an unknown kind of value {str(kind)[:40]!r}")
        _, ref, info = descriptor
        if info.get("kind") == "exception_class":
            return self.exception_class(str(info.get("of")), str(info.get("qualname")), str(info.get("builtin")))
        if path is not None and info.get("kind") in ("function", "class", "module"):
            return RemoteObject(self, ("path", *path), info, 0)
        key = (self.generation, ref)
        proxy = self._proxies.get(key)
        if proxy is None:
            proxy = RemoteObject(self, ("ref", ref), info, self.generation)
            self._proxies[key] = proxy
        return proxy

    def encode(self, obj: Any) -> tuple[Any, Any]:
        """An argument for the submission as plain data; its own objects go back as references.

        Raises:
            TypeError: a value that is neither plain data nor one of the submission's objects.
            SubmissionGone: a reference to an object of an earlier process.
        """
        return plain.encode(obj, self._describe_local)

    def _describe_local(self, obj: Any) -> Any:
        if isinstance(obj, RemoteObject):
            return obj._cbx_check()
        if isinstance(obj, StandInModule):
            return ("path", obj.__name__, ())
        if isinstance(obj, type) and obj in self._exceptions.values():
            return ("path", obj.__module__, tuple(obj.__qualname__.split(".")))
        numpy = sys.modules.get("numpy")
        if numpy is not None and isinstance(obj, (numpy.ndarray, numpy.generic)) and not obj.dtype.hasobject:
            if obj.dtype.kind in _NUMPY_KINDS and obj.dtype.fields is None:
                if isinstance(obj, numpy.generic):
                    return ("value", obj.item())
                return ("ndarray", obj.dtype.str, list(obj.shape), numpy.ascontiguousarray(obj).tobytes())
        raise TypeError(
            f"a {type(obj).__name__} cannot be given to the submission: only plain data "
            "(numbers, strings, bytes, lists, tuples, dicts, sets) and the submission's own objects cross"
        )

    # ------------------------------------------------------------ exceptions

    def exception_class(self, module: str, qualname: str, builtin: str) -> type[BaseException]:
        """The local class standing for the submission's exception class ``module.qualname`` (one per name)."""
        key = (module, qualname)
        cls = self._exceptions.get(key)
        if cls is None:
            base = getattr(__import__("builtins"), builtin, Exception)
            if not (isinstance(base, type) and issubclass(base, Exception)):
                base = Exception
            name = qualname.rpartition(".")[2] or "SubmissionException"
            try:
                cls = type(name, (SubmissionError, base), {"__module__": module, "__qualname__": qualname})
            except TypeError:  # a base whose layout cannot be mixed
                cls = type(name, (SubmissionError,), {"__module__": module, "__qualname__": qualname})
            self._exceptions[key] = cls
        return cls

    def exception(self, info: Any, what: str) -> BaseException:
        """The exception to raise here for what the submission raised (``info`` from the worker)."""
        if type(info) is not dict:
            return ProtocolError(f"a malformed exception from the submission during {what}")
        name, module, builtin = (str(info.get(key, "")) for key in ("type", "module", "builtin"))
        message = str(info.get("message", ""))
        if builtin in ("SystemExit", "KeyboardInterrupt", "GeneratorExit"):
            exc: BaseException = SubmissionExit(f"{name}({message}) raised by the submission in {what}")
        elif module == "builtins" and _is_builtin_exception(name):
            cls = getattr(__import__("builtins"), name)
            args = info.get("args")
            try:
                exc = cls(*args) if type(args) is tuple else cls(message)
            except Exception:  # noqa: BLE001 - an exception whose arguments do not rebuild it
                exc = cls(message)
        else:
            exc = self.exception_class(module, str(info.get("qualname", name)), builtin)(message)
        trace = str(info.get("traceback", "")).strip()
        if trace:
            exc.add_note(f"in the submission's process:\n{trace}")
        return exc


def _is_builtin_exception(name: str) -> bool:
    cls = getattr(__import__("builtins"), name, None)
    return isinstance(cls, type) and issubclass(cls, Exception)


def _array(descriptor: Any) -> Any:
    import numpy

    _, dtype_text, shape, data = descriptor
    dtype = numpy.dtype(str(dtype_text))
    if dtype.kind not in _NUMPY_KINDS or dtype.hasobject or dtype.fields is not None or type(data) is not bytes:
        raise ProtocolError(f"an array of dtype {dtype_text!r} cannot cross")
    if type(shape) is not list or not all(type(n) is int and n >= 0 for n in shape):
        raise ProtocolError("an array with a malformed shape")
    return numpy.frombuffer(data, dtype=dtype).reshape(shape).copy()


def _label(target: tuple[Any, ...], info: dict[str, Any]) -> str:
    if target[0] == "path":
        return ".".join([target[1], *target[2]])
    return f"a {info.get('type', 'object')} object"


class RemoteObject:
    """An object that lives in the submission's process.

    Attribute access, calls, ``len``, ``bool``, iteration, indexing, ``in``,
    ``str`` and ``repr`` run there, each one request, and their results come
    back as plain data or as other :class:`RemoteObject`.  It equals only
    itself (``==`` never asks the submission).  A class of the submission
    works with ``isinstance``/``issubclass`` against its objects.

    ``target`` is ``("path", module, attributes)`` for a module-level
    function, class or module (found again after a restart), else
    ``("ref", id)`` in the process of ``generation``.
    """

    __slots__ = ("_cbx_bridge", "_cbx_target", "_cbx_info", "_cbx_generation", "__weakref__")

    def __init__(self, bridge: Bridge, target: tuple[Any, ...], info: dict[str, Any], generation: int) -> None:
        object.__setattr__(self, "_cbx_bridge", bridge)
        object.__setattr__(self, "_cbx_target", target)
        object.__setattr__(self, "_cbx_info", info)
        object.__setattr__(self, "_cbx_generation", generation)

    def _cbx_check(self) -> tuple[Any, ...]:
        """The target, after checking that a reference belongs to the current process."""
        if self._cbx_target[0] == "ref" and self._cbx_generation != self._cbx_bridge.generation:
            raise SubmissionGone(
                f"{_label(self._cbx_target, self._cbx_info)} belonged to an earlier submission process "
                "(it was restarted after a timeout or a crash)"
            )
        return self._cbx_target

    def _cbx_ask(self, op: str, *args: Any, what: str, restart: bool = True) -> Any:
        bridge = self._cbx_bridge
        status, payload = bridge.ask(op, (self._cbx_check(), *args), what, restart)
        return bridge.value(status, payload, what)

    def _cbx_dunder(self, name: str, *args: Any, restart: bool = True) -> Any:
        encoded = self._cbx_bridge.encode(args)
        what = f"{name}() of {_label(self._cbx_target, self._cbx_info)}"
        return self._cbx_ask("dunder", name, encoded, what=what, restart=restart)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name.startswith("_cbx_"):
            raise AttributeError(name)  # special names are never looked up in the submission
        target = self._cbx_check()
        path = (target[1], (*target[2], name)) if target[0] == "path" else None
        bridge = self._cbx_bridge
        what = f"{_label(target, self._cbx_info)}.{name}"
        status, payload = bridge.ask("get", (target, name), what)
        return bridge.value(status, payload, what, path)

    def __setattr__(self, name: str, value: Any) -> None:
        encoded = self._cbx_bridge.encode(value)
        self._cbx_ask("setattr", name, encoded, what=f"setting {name} on {_label(self._cbx_target, self._cbx_info)}")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        bridge = self._cbx_bridge
        what = f"{_label(self._cbx_target, self._cbx_info)}(...)"
        return self._cbx_ask("call", bridge.encode(args), bridge.encode(kwargs), what=what)

    def __repr__(self) -> str:
        try:
            text = self._cbx_dunder("__repr__", restart=False)
        except BaseException as exc:  # noqa: BLE001 - a repr must not fail the report that shows it
            return f"<submission {self._cbx_info.get('type', 'object')} object (repr failed: {type(exc).__name__})>"
        return text if type(text) is str else "<submission object>"

    def __str__(self) -> str:
        text = self._cbx_dunder("__str__")
        return text if type(text) is str else repr(self)

    def __len__(self) -> int:
        size = self._cbx_dunder("__len__")
        if type(size) is not int:
            raise ProtocolError("len() of a submission object did not give an int")
        return size

    def __bool__(self) -> bool:
        return self._cbx_dunder("__bool__") is True

    def __iter__(self) -> Iterator[Any]:
        iterator = self._cbx_dunder("__iter__")
        if not isinstance(iterator, RemoteObject):
            return iter(iterator)
        return _RemoteIterator(iterator)

    def __getitem__(self, key: Any) -> Any:
        return self._cbx_dunder("__getitem__", key)

    def __setitem__(self, key: Any, value: Any) -> None:
        self._cbx_dunder("__setitem__", key, value)

    def __delitem__(self, key: Any) -> None:
        self._cbx_dunder("__delitem__", key)

    def __contains__(self, item: Any) -> bool:
        return self._cbx_dunder("__contains__", item) is True

    def __dir__(self) -> list[str]:
        names = self._cbx_dunder("__dir__")
        return [name for name in names if type(name) is str] if type(names) is list else []

    def __eq__(self, other: object) -> bool:
        return other is self

    def __ne__(self, other: object) -> bool:
        return other is not self

    def __hash__(self) -> int:
        return hash((self._cbx_generation, self._cbx_target))

    def __instancecheck__(self, obj: Any) -> bool:
        return self._cbx_check_type("isinstance", obj)

    def __subclasscheck__(self, cls: Any) -> bool:
        return self._cbx_check_type("issubclass", cls)

    def _cbx_check_type(self, op: str, other: Any) -> bool:
        if not isinstance(other, RemoteObject):
            return False  # a value here is a copy in built-in types: never an instance of the submission's class
        bridge = self._cbx_bridge
        what = f"{op}(..., {_label(self._cbx_target, self._cbx_info)})"
        status, payload = bridge.ask(op, (other._cbx_check(), self._cbx_check()), what)
        return bridge.value(status, payload, what) is True

    def __del__(self) -> None:
        try:
            bridge = self._cbx_bridge
            if self._cbx_target[0] == "ref" and self._cbx_generation == bridge.generation:
                bridge.released.append(self._cbx_target[1])
        except Exception:  # noqa: BLE001 - at interpreter exit anything may be gone
            pass


class _RemoteIterator:
    """Iteration over a submission object: each ``next`` is one request."""

    def __init__(self, iterator: RemoteObject) -> None:
        self.iterator = iterator

    def __iter__(self) -> _RemoteIterator:
        return self

    def __next__(self) -> Any:
        return self.iterator._cbx_dunder("__next__")


class StandInModule(types.ModuleType):
    """A module of the submission as the tests see it: each attribute is fetched from the submission's process.

    Functions, classes and submodules are kept once fetched (they are found
    again by name after a restart); plain values are fetched on every access,
    so a test sees the module's state as it is now.
    """

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        bridge: Bridge = self.__dict__["__cellbox_bridge__"]
        what = f"{self.__name__}.{name}"
        status, payload = bridge.ask("get", (("path", self.__name__, ()), name), what)
        if status == "raised" and isinstance(payload, dict) and payload.get("builtin") == "AttributeError":
            raise AttributeError(f"module {self.__name__!r} has no attribute {name!r}")
        value = bridge.value(status, payload, what, (self.__name__, (name,)))
        if isinstance(value, RemoteObject) or (isinstance(value, type) and issubclass(value, SubmissionError)):
            self.__dict__[name] = value
        return value


class SubmissionFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds the submission's modules for imports written in the tests (last on ``sys.meta_path``).

    Args:
        bridge: the link to the submission's process.
        offered: the submission's own modules (:func:`cellbox.grading.imports.own_modules`):
            any other name a test imports that this Python lacks is reported to the grader.
        tests: the tests' folder: only an import written in a file below it
            is answered, so an optional import inside pytest or a plugin never
            reaches the submission.
    """

    def __init__(
        self,
        bridge: Bridge,
        offered: list[str],
        tests: str,
        named: list[str] | None = None,
        withheld: Sequence[str] = (),
    ) -> None:
        self.bridge = bridge
        self.offered = frozenset(offered)
        self.tests = tests.rstrip("/") + "/"
        self.named = None if named is None else frozenset(named)
        self.withheld = frozenset(withheld)

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname.partition(".")[0] not in self.offered:
            if "." not in fullname and refused(fullname, self.named, self.withheld) and _imported_from(self.tests):
                # A module the tests expect from this Python, which lacks it: never the submission's answer.
                reporter = sys.modules.get("cellbox.grading.reporter")
                if reporter is not None:
                    reporter.send_missing_module(fullname)
            return None
        if "." not in fullname and not _imported_from(self.tests):
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = StandInModule(spec.name)
        module.__dict__["__cellbox_bridge__"] = self.bridge
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        name = module.__name__
        try:
            status, payload = self.bridge.ask("import", (name,), f"the import of {name}")
        except SubmissionGone as exc:
            raise SubmissionImportError(f"{exc}", name=name) from None
        if status == "missing":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        if status == "raised":
            raise _import_error(self.bridge.exception(payload, f"the import of {name}"), payload, name)
        info = self.bridge.value(status, payload, f"the import of {name}")
        if type(info) is not dict:
            raise ProtocolError(f"a malformed answer to the import of {name}")
        names = info.get("names")
        module.__all__ = [n for n in names if type(n) is str] if type(names) is list else []  # type: ignore[attr-defined]
        if info.get("package") is True:
            module.__path__ = []  # type: ignore[attr-defined]
        real = info.get("name")
        if type(real) is str and real != name and real.partition(".")[0] in self.offered:
            # An alias (a notebook's `submission`): the import gives the stand-in of the module it names,
            # as Python gives whatever the module put in sys.modules.
            sys.modules[name] = importlib.import_module(real)


def _import_error(raised: BaseException, info: dict[str, Any], name: str) -> SubmissionImportError:
    kind = str(info.get("type", "exception"))
    if isinstance(raised, SubmissionExit):
        text = f"{kind}({info.get('message', '')}) at the import of the submission's module {name}"
    else:
        text = f"{kind} at the import of the submission's module {name}: {info.get('message', '')}"
    error = SubmissionImportError(text, name=name)
    for note in getattr(raised, "__notes__", ()):
        error.add_note(note)
    return error


def _imported_from(folder: str) -> bool:
    """Whether the import being resolved was written in a file below ``folder`` (not in importlib or pytest)."""
    frame = sys._getframe(2)
    importlib_dir = os.path.dirname(importlib.__file__) + "/"
    while frame is not None:
        filename = frame.f_code.co_filename
        if not (filename.startswith("<frozen importlib") or filename.startswith(importlib_dir) or filename == __file__):
            return filename.startswith(folder)
        frame = frame.f_back  # type: ignore[assignment]
    return False


# ---------------------------------------------------------------- helpers for instructor tests

_BRIDGE: Bridge | None = None


def install(
    bridge: Bridge, offered: list[str], tests: str, named: list[str] | None = None, withheld: Sequence[str] = ()
) -> SubmissionFinder:
    """Make the submission's modules importable in this process through ``bridge`` (last on ``sys.meta_path``)."""
    global _BRIDGE
    _BRIDGE = bridge
    finder = SubmissionFinder(bridge, offered, tests, named, withheld)
    sys.meta_path.append(finder)
    return finder


def _bridge() -> Bridge:
    if _BRIDGE is None:
        raise RuntimeError("this helper of cellbox.grading.bridge works only inside cellbox grade")
    return _BRIDGE


def submission_module(name: str) -> Any:
    """A module as the submission's process has it (``os``, ``subprocess``...), for checks in its world.

    ``submission_module("os").path.exists(path)`` runs there: what the
    submission wrote, the processes it started and its environment are seen
    as it sees them.  Its code could have changed that module, so a check made
    this way is only as honest as the submission.  Outside ``cellbox grade``
    (the instructor's own plain ``pytest`` run, where the submission is
    imported into the test process) it is this process's module.

    Raises:
        ModuleNotFoundError: no such module there.
    """
    if _BRIDGE is None:
        return importlib.import_module(name)
    bridge = _bridge()
    module = StandInModule(name)
    module.__dict__["__cellbox_bridge__"] = bridge
    status, payload = bridge.ask("import", (name,), f"the import of {name}")
    if status == "missing":
        raise ModuleNotFoundError(f"No module named {name!r} in the submission's process", name=name)
    bridge.value(status, payload, f"the import of {name}")
    return module


def submission_tmp_path() -> str:
    """A new, empty folder in the submission's temporary folder (its path there), for files it reads or writes."""
    return str(submission_module("tempfile").mkdtemp(prefix="test-"))


def new(value: Any) -> RemoteObject:
    """A copy of ``value`` made in the submission's process, for a test that checks what a function does to it.

    ``lst = new([3, 1, 2]); sort_in_place(lst); assert value_of(lst) == [1, 2, 3]``.

    Raises:
        RuntimeError: not in a grading run.
    """
    bridge = _bridge()
    status, payload = bridge.ask("new", (bridge.encode(value),), "new()")
    made = bridge.value(status, payload, "new()")
    if not isinstance(made, RemoteObject):
        raise ProtocolError("new() did not give a submission object")
    return made


def value_of(obj: Any) -> Any:
    """The value of a submission object as plain data (what it holds now); plain data is returned as it is."""
    if not isinstance(obj, RemoteObject):
        return obj
    return obj._cbx_ask("value", what=f"value_of({_label(obj._cbx_target, obj._cbx_info)})")
