"""The submission's side of the grading boundary: runs the student's code on request, answers in plain data.

This file runs inside the sandboxed submission process, never in the grader or
in the trusted test process.  The grader copies it into each task's library
as ``cellbox_worker``, beside ``cellbox_plain`` (:mod:`cellbox.grading.plain`)
and ``cellbox_gateway_base`` (execnet's ``gateway_base``, which needs only the
standard library).  The process is started as::

    python -I -B -u -c BOOT LIB ROOT      (fd 3: a socket to the trusted process)

``BOOT`` (:data:`cellbox.grading.connection.WORKER_BOOT`) puts ``LIB`` first on
``sys.path`` and the submission's folder ``ROOT`` after the standard library,
so a student's ``json.py`` or ``random.py`` never replaces a module this
worker or the standard library needs.  Then :func:`main` serves an execnet
gateway on fd 3; the trusted side runs ``WORKER.serve(channel)`` there and
sends requests, one at a time, as plain data::

    (op, args, released_ref_ids)  ->  (status, payload, stdout, stderr)

``op`` is ``hello``, ``import``, ``get``, ``setattr``, ``call``, ``dunder``,
``isinstance``, ``issubclass``, ``new`` or ``value``; a target is
``("path", module, attributes)`` (a module-level name, found again after a
restart) or ``("ref", id)`` (an object this process keeps in :attr:`Worker.objects`).
``status`` is ``ok`` (payload: a value as ``(value, holes)``, see
:mod:`cellbox.grading.plain`), ``raised`` (payload: what was raised, as a
dict), ``missing`` (no such module), ``stop`` (``StopIteration``) or
``error`` (a request this worker cannot read).  What the student's code
prints during a request comes back with the answer.

Nothing here is trusted by the grader: the trusted side reads only plain
data from this process, and a submission that rewrites this module can only
make its own tests fail.
"""

from __future__ import annotations

import builtins
import importlib
import io
import os
import socket
import sys
import traceback
import types
from typing import Any

try:  # in the submission's process, beside this file
    import cellbox_gateway_base as gateway_base  # type: ignore[import-not-found]
    import cellbox_plain as plain  # type: ignore[import-not-found]
except ImportError:  # imported as part of cellbox (type checks, docs)
    from . import plain  # type: ignore[no-redef]

    gateway_base = None

OUTPUT_KEPT = 1_000_000  # characters of print output kept per request (each stream)
MESSAGE_KEPT = 4000  # characters of an exception's message
TRACEBACK_KEPT = 8000  # characters of an exception's traceback
NUMPY_KINDS = "biufcSU"  # dtype kinds that cross as arrays: bool, int, uint, float, complex, bytes, str
DUNDERS: dict[str, Any] = {
    "__repr__": repr,
    "__str__": str,
    "__len__": len,
    "__bool__": bool,
    "__iter__": iter,
    "__next__": next,
    "__dir__": lambda obj: sorted(name for name in dir(obj) if not name.startswith("__")),
    "__getitem__": lambda obj, key: obj[key],
    "__setitem__": lambda obj, key, value: obj.__setitem__(key, value),
    "__delitem__": lambda obj, key: obj.__delitem__(key),
    "__contains__": lambda obj, item: item in obj,
}

WORKER: Worker | None = None


class _SocketIO:
    """execnet's IO over a connected socket (fd 3): exact reads, whole writes."""

    def __init__(self, sock: socket.socket, execmodel: Any) -> None:
        self.sock = sock
        self.execmodel = execmodel

    def read(self, numbytes: int) -> bytes:
        buf = b""
        while len(buf) < numbytes:
            data = self.sock.recv(numbytes - len(buf))
            if not data:
                raise EOFError(f"expected {numbytes} bytes, got {len(buf)}")
            buf += data
        return buf

    def write(self, data: bytes) -> None:
        self.sock.sendall(data)

    def close_read(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RD)
        except OSError:
            pass

    def close_write(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    def wait(self) -> None:
        return None

    def kill(self) -> None:
        return None


class _Capped(io.StringIO):
    """A stdout or stderr that keeps the first :data:`OUTPUT_KEPT` characters."""

    def write(self, text: str) -> int:
        room = OUTPUT_KEPT - self.tell()
        if room > 0:
            super().write(str(text)[:room])
        return len(text)


class _Shell:
    """``get_ipython()`` of a graded notebook: magics and shell escapes are not run (the grader left them out)."""

    user_ns: dict[str, Any] = {}

    def run_line_magic(self, name: str, line: str, *args: Any, **kwargs: Any) -> None:
        return None

    def run_cell_magic(self, name: str, line: str, cell: str, *args: Any, **kwargs: Any) -> None:
        return None

    def system(self, command: str) -> None:
        return None

    def getoutput(self, command: str, *args: Any, **kwargs: Any) -> list[str]:
        return []


_SHELL = _Shell()


def display(*objects: Any, **options: Any) -> None:
    """IPython's ``display`` as a graded notebook sees it: each object's text form, printed."""
    for obj in objects:
        print(repr(obj))


def get_ipython() -> _Shell:
    """IPython's ``get_ipython`` as a graded notebook sees it (see :class:`_Shell`)."""
    return _SHELL


def _kind(obj: Any) -> str:
    if isinstance(obj, types.ModuleType):
        return "module"
    if isinstance(obj, type):
        return "exception_class" if issubclass(obj, BaseException) else "class"
    if isinstance(obj, (types.FunctionType, types.BuiltinFunctionType, types.MethodType)):
        return "function"
    return "object"


def _builtin_base(cls: type) -> str:
    """The nearest built-in exception class of ``cls`` (``ValueError`` for ``class Broke(ValueError)``)."""
    for base in cls.__mro__:
        if base.__module__ == "builtins" and issubclass(base, BaseException):
            return base.__name__
    return "Exception"


def _safe(function: Any, default: str) -> str:
    try:
        return str(function())
    except BaseException:  # noqa: BLE001 - a student's __str__ may raise anything
        return default


class Worker:
    """Runs requests against the submission's modules and keeps the objects the trusted side refers to.

    Args:
        root: the submission's folder (paths in tracebacks are shown relative to it).
        lib: this worker's folder (its frames are left out of tracebacks).
    """

    def __init__(self, root: str, lib: str) -> None:
        self.root = root.rstrip("/") + "/"
        self.lib = lib.rstrip("/") + "/"
        self.objects: dict[int, Any] = {}
        self.numpy = False

    # ------------------------------------------------------------ values

    def keep(self, obj: Any) -> int:
        self.objects[id(obj)] = obj
        return id(obj)

    def describe(self, obj: Any) -> tuple[Any, ...]:
        """A hole's descriptor: an array's bytes, a numpy scalar's value, or a reference with what it is."""
        numpy = sys.modules.get("numpy")
        if numpy is not None and isinstance(obj, (numpy.ndarray, numpy.generic)):
            dtype = obj.dtype
            if dtype.kind in NUMPY_KINDS and dtype.fields is None and not dtype.hasobject:
                if isinstance(obj, numpy.generic):
                    return ("value", obj.item())
                if self.numpy:
                    return ("ndarray", dtype.str, list(obj.shape), numpy.ascontiguousarray(obj).tobytes())
        return self.reference(obj)

    def reference(self, obj: Any) -> tuple[Any, ...]:
        """A reference to ``obj``, kept here, with what it is (kind, type, name)."""
        cls = type(obj)
        info = {
            "kind": _kind(obj),
            "type": _safe(lambda: cls.__qualname__, "?"),
            "module": _safe(lambda: cls.__module__, "?"),
            "callable": callable(obj),
        }
        if info["kind"] in ("module", "class", "exception_class", "function"):
            info["name"] = _safe(lambda: obj.__name__, "?")
            info["qualname"] = _safe(lambda: getattr(obj, "__qualname__", obj.__name__), "?")
            info["of"] = _safe(lambda: getattr(obj, "__module__", None) or "", "")
        if info["kind"] == "exception_class":
            info["builtin"] = _builtin_base(obj)
        return ("ref", self.keep(obj), info)

    def encode(self, obj: Any) -> tuple[Any, Any]:
        return plain.encode(obj, self.describe)

    def decode(self, encoded: Any) -> Any:
        value, holes = encoded
        return plain.decode(value, holes, self._made)

    def _made(self, descriptor: Any) -> Any:
        kind = descriptor[0]
        if kind == "ref":
            return self.objects[descriptor[1]]
        if kind == "path":
            return self.resolve(descriptor)
        if kind == "ndarray":
            import numpy

            _, dtype, shape, data = descriptor
            return numpy.frombuffer(data, dtype=numpy.dtype(dtype)).reshape(shape).copy()
        raise ValueError(f"an argument of unknown kind {kind!r}")

    def resolve(self, target: Any) -> Any:
        if target[0] == "ref":
            return self.objects[target[1]]
        _, module, attributes = target
        obj = importlib.import_module(module)
        for name in attributes:
            obj = getattr(obj, name)
        return obj

    # ------------------------------------------------------------ errors

    def raised(self, exc: BaseException) -> dict[str, Any]:
        cls = type(exc)
        args: Any = None
        try:
            value, holes = plain.encode(exc.args, self.describe)
            args = None if holes else value
        except BaseException:  # noqa: BLE001
            pass
        return {
            "type": cls.__name__,
            "qualname": cls.__qualname__,
            "module": cls.__module__,
            "builtin": _builtin_base(cls),
            "message": _safe(lambda: exc, "<the exception's str() failed>")[:MESSAGE_KEPT],
            "args": args,
            "traceback": self.traceback(exc)[-TRACEBACK_KEPT:],
        }

    def traceback(self, exc: BaseException) -> str:
        """The traceback without this worker's frames, paths relative to the submission's folder."""
        tb = exc.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename.startswith(self.lib):
            tb = tb.tb_next
        try:
            lines = traceback.format_exception(type(exc), exc, tb)
        except BaseException:  # noqa: BLE001
            return ""
        kept = [line for line in lines if "<frozen importlib._bootstrap" not in line]
        return "".join(kept).replace(self.root, "")

    # ------------------------------------------------------------ requests

    def handle(self, request: Any) -> tuple[Any, ...]:
        """Answer one request (see the module docstring); what the code prints is captured."""
        try:
            op, args, released = request
            for ref in released:
                self.objects.pop(ref, None)
            method = getattr(self, f"op_{op}")
        except (TypeError, ValueError, AttributeError) as exc:
            return ("error", f"a request this worker cannot read: {exc}", "", "")
        out, err = _Capped(), _Capped()
        saved = sys.stdout, sys.stderr
        sys.stdout, sys.stderr = out, err
        try:
            status, payload = method(*args)
        except ModuleNotFoundError as exc:
            wanted = args[0] if op == "import" else None
            missing = exc.name is not None and wanted is not None and (wanted + ".").startswith(exc.name + ".")
            status, payload = ("missing", str(exc)) if missing else ("raised", self.raised(exc))
        except StopIteration:
            status, payload = "stop", None
        except BaseException as exc:  # noqa: BLE001 - SystemExit too: it is the student's answer
            status, payload = "raised", self.raised(exc)
        finally:
            sys.stdout, sys.stderr = saved
        return (status, payload, out.getvalue(), err.getvalue())

    def op_hello(self, numpy: bool) -> tuple[str, Any]:
        self.numpy = bool(numpy)
        return "ok", (os.getpid(), [])

    def op_import(self, name: str) -> tuple[str, Any]:
        module = importlib.import_module(name)
        names = getattr(module, "__all__", None)
        if not isinstance(names, (list, tuple)) or not all(isinstance(n, str) for n in names):
            names = [n for n in vars(module) if not n.startswith("_")]
        info = {
            "package": hasattr(module, "__path__"),
            "names": [str.__str__(n) for n in names],
            # A notebook's module is named __main__ (as under a kernel); its spec keeps the name it is imported by.
            "name": _safe(lambda: module.__spec__.name if module.__spec__ else module.__name__, name),
        }
        return "ok", (info, [])

    def op_get(self, target: Any, name: str) -> tuple[str, Any]:
        return "ok", self.encode(getattr(self.resolve(target), name))

    def op_setattr(self, target: Any, name: str, value: Any) -> tuple[str, Any]:
        setattr(self.resolve(target), name, self.decode(value))
        return "ok", (None, [])

    def op_call(self, target: Any, args: Any, kwargs: Any) -> tuple[str, Any]:
        return "ok", self.encode(self.resolve(target)(*self.decode(args), **self.decode(kwargs)))

    def op_dunder(self, target: Any, name: str, args: Any) -> tuple[str, Any]:
        result = DUNDERS[name](self.resolve(target), *self.decode(args))
        if name in ("__repr__", "__str__"):
            result = str.__str__(result)  # what repr() and str() return is a str by then
        return "ok", self.encode(result)

    def op_isinstance(self, target: Any, cls: Any) -> tuple[str, Any]:
        return "ok", (bool(isinstance(self.resolve(target), self.resolve(cls))), [])

    def op_issubclass(self, target: Any, cls: Any) -> tuple[str, Any]:
        return "ok", (bool(issubclass(self.resolve(target), self.resolve(cls))), [])

    def op_new(self, value: Any) -> tuple[str, Any]:
        return "ok", (None, [((), self.reference(self.decode(value)))])

    def op_value(self, target: Any) -> tuple[str, Any]:
        return "ok", self.encode(self.resolve(target))

    def serve(self, channel: Any) -> None:
        """Answer requests on ``channel`` until it closes (called by the trusted side's ``remote_exec``)."""
        for request in channel:
            answer = self.handle(request)
            try:
                channel.send(answer)
            except Exception as exc:  # noqa: BLE001 - a value execnet cannot write (a lone surrogate in a str)
                channel.send(("error", f"the answer could not be sent: {type(exc).__name__}: {exc}"[:500], "", ""))


def main(fd: int, root: str) -> None:
    """Serve the trusted side on the socket at ``fd`` until it goes away.

    Called by the boot line; ``builtins`` gets ``display`` and ``get_ipython``
    first, as a notebook's cells have them under a kernel.
    """
    global WORKER
    builtins.display = display  # type: ignore[attr-defined]
    builtins.get_ipython = get_ipython  # type: ignore[attr-defined]
    WORKER = Worker(root, os.path.dirname(os.path.abspath(__file__)))
    sys.argv = ["submission"]
    sys.set_int_max_str_digits(0)  # execnet writes a large int as its digits; the trusted side sets its own limit
    execmodel = gateway_base.get_execmodel("thread")
    gateway_base.serve(_SocketIO(socket.socket(fileno=fd), execmodel), id="submission")
