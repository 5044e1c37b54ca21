"""Plain data across the grading boundary (no process): what crosses as a value, what stays an object.

The encoding both sides share (:mod:`cellbox.grading.plain`), the worker's
descriptors (:mod:`cellbox.grading.worker`) and how the trusted side rebuilds
them (:mod:`cellbox.grading.bridge`), including numpy arrays, and the malformed
answers a hostile worker could send.
"""

from __future__ import annotations

from collections import OrderedDict, namedtuple
from typing import Any

import numpy
import pytest

from cellbox.grading import plain
from cellbox.grading.bridge import Bridge, ProcessSpec, ProtocolError, RemoteObject
from cellbox.grading.worker import Worker
from cellbox.sandbox.isolation import Isolation
from cellbox.sandbox.limits import Limits


class Liar(int):
    def __eq__(self, other: object) -> bool:
        return True

    __hash__ = int.__hash__


class Shouty(str):
    def __str__(self) -> str:
        return "LOUD"


def refs(obj: Any) -> tuple[Any, Any]:
    return plain.encode(obj, lambda part: ("ref", id(part)))


def test_builtin_values_cross_as_they_are() -> None:
    value = {"a": [1, 2.5, 3j, None, True, b"x", "y"], (1, 2): {frozenset({1}), 3}, "t": (1, (2,))}
    assert refs(value) == (value, [])


def test_subclasses_cross_as_their_builtin_values_without_their_methods() -> None:
    Pair = namedtuple("Pair", "a b")
    value, holes = refs([Liar(3), Shouty("quiet"), Pair(1, 2), OrderedDict(a=1), bytearray(b"ab")])
    assert holes == []
    assert value == [3, "quiet", (1, 2), {"a": 1}, b"ab"]
    assert [type(item) for item in value] == [int, str, tuple, dict, bytes]
    assert value[0] != 4  # the Liar's __eq__ did not cross


def test_objects_cycles_and_unhashable_keys_become_holes_at_their_path() -> None:
    obj = object()
    cycle: list[Any] = [1]
    cycle.append(cycle)
    value, holes = refs({"o": obj, "c": cycle, "k": {obj: 1}})
    assert value == {"o": None, "c": [1, None], "k": None}
    assert [path for path, _ in holes] == [("o",), ("c", 1), ("k",)]


def test_decode_puts_each_hole_back_and_keeps_tuples_tuples() -> None:
    value, holes = refs(({"a": [object()]}, object()))
    made = plain.decode(value, holes, lambda descriptor: "made")
    assert made == ({"a": ["made"]}, "made") and type(made) is tuple


@pytest.mark.parametrize(
    "holes",
    [
        [((5,), "x")],  # index past the end
        [(("missing",), "x")],  # not a key of the dict
        [((0, 0), "x")],  # inside an atom
        ["not a pair"],
        "not a list",
    ],
)
def test_holes_that_do_not_fit_are_a_plain_error(holes: Any) -> None:
    with pytest.raises(plain.PlainError):
        plain.decode({"a": [1]} if holes != [((0, 0), "x")] else [1], holes, lambda descriptor: None)


@pytest.fixture
def bridge() -> Bridge:
    spec = ProcessSpec(
        python="python",
        lib="/nowhere",
        root="/nowhere",
        task="/nowhere",
        limits=Limits(),
        isolation=Isolation(mode="none"),
        env={},
    )
    return Bridge(spec, numpy=True)  # never started: these tests only decode


def test_numpy_arrays_and_scalars_cross_as_arrays_and_values(bridge: Bridge) -> None:
    worker = Worker("/root", "/lib")
    worker.numpy = True
    array = numpy.arange(6, dtype=numpy.float32).reshape(2, 3)[:, ::2]  # not contiguous
    value = bridge.value("ok", worker.encode({"a": array, "n": numpy.int64(7)}), "test")
    assert isinstance(value["a"], numpy.ndarray) and value["a"].dtype == numpy.float32
    assert value["a"].tolist() == [[0.0, 2.0], [3.0, 5.0]] and value["a"].flags.writeable
    assert value["n"] == 7 and type(value["n"]) is int


def test_an_object_array_stays_an_object(bridge: Bridge) -> None:
    worker = Worker("/root", "/lib")
    worker.numpy = True
    value = bridge.value("ok", worker.encode(numpy.array([object()], dtype=object)), "test")
    assert isinstance(value, RemoteObject)


@pytest.mark.parametrize(
    "descriptor",
    [
        ("ndarray", "|O", [1], b"\0" * 8),  # objects would be unpickled: refused
        ("ndarray", "<f8", [-1], b""),  # a negative shape
        ("mystery", 1),
        ("ref", "not an id", {}),
    ],
)
def test_a_malformed_answer_is_a_protocol_error(bridge: Bridge, descriptor: Any) -> None:
    with pytest.raises(ProtocolError):
        bridge.value("ok", (None, [((), descriptor)]), "test")


def test_the_students_exception_is_one_local_class_under_its_builtin_base(bridge: Bridge) -> None:
    info = {
        "type": "Overdrawn",
        "qualname": "Overdrawn",
        "module": "bank",
        "builtin": "ValueError",
        "message": "only 5",
        "args": ("only 5",),
        "traceback": "Traceback ...\nOverdrawn: only 5",
    }
    raised = bridge.exception(info, "bank.withdraw(...)")
    assert isinstance(raised, ValueError) and str(raised) == "only 5"
    assert type(raised) is bridge.exception_class("bank", "Overdrawn", "ValueError")
    assert raised.__notes__ == ["in the submission's process:\nTraceback ...\nOverdrawn: only 5"]


def test_system_exit_from_the_submission_is_not_a_system_exit_here(bridge: Bridge) -> None:
    raised = bridge.exception(
        {"type": "SystemExit", "module": "builtins", "builtin": "SystemExit", "message": "0"}, "f(...)"
    )
    assert not isinstance(raised, SystemExit) and str(raised) == "SystemExit(0) raised by the submission in f(...)"
