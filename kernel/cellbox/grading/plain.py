"""Plain data across the grading boundary: values as exact built-in types, with holes for everything else.

Both sides of the boundary use this module: the trusted test process
(:mod:`cellbox.grading.bridge`) imports it, and the grader copies it into each
submission's process as ``cellbox_plain`` (:mod:`cellbox.grading.worker`).
Standard library only.

A value is sent as ``(value, holes)``:

* ``value`` holds only exact built-in types (``None``, ``bool``, ``int``,
  ``float``, ``complex``, ``str``, ``bytes``, and ``list``, ``tuple``,
  ``dict``, ``set``, ``frozenset`` of them), which is all execnet's
  serializer carries.  A subclass of a built-in is converted to its built-in
  value by the built-in's own method (``int.__int__``, ``str.__str__``...), so
  an overridden ``__eq__`` or ``__str__`` does not travel; a ``bytearray``
  becomes ``bytes``.
* ``holes`` lists ``(path, descriptor)`` for each part that is not plain
  data (an object of the submission's own class, a function, a recursive
  list): ``path`` is the list indices and dict keys leading to it, and the
  place in ``value`` holds ``None``.  What the descriptor is belongs to the
  caller (``other``): a reference to an object kept on the sending side, or a
  numpy array's bytes.

:func:`decode` puts the holes back, each made by the receiver's ``make``.  It
never calls a method of a received value: everything it touches is built by
the unserializer from the wire.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["encode", "decode", "ATOMS", "MAX_DEPTH", "PlainError"]

ATOMS = (type(None), bool, int, float, complex, str, bytes)
MAX_DEPTH = 200  # nesting deeper than this becomes a hole (the recursion limit is near)
Hole = tuple[tuple[Any, ...], Any]


class PlainError(ValueError):
    """A received value and its holes do not fit together (a malformed message)."""


def _atom(obj: Any) -> Any:
    """The built-in value of a subclass of an atom type, through the built-in's own method."""
    if isinstance(obj, bool):
        return bool(obj)
    if isinstance(obj, int):
        return int.__int__(obj)
    if isinstance(obj, float):
        return float.__float__(obj)
    if isinstance(obj, complex):
        return complex.__complex__(obj)
    if isinstance(obj, str):
        return str.__str__(obj)
    return bytes.__bytes__(obj)


_NOT_PLAIN = object()


def _key(obj: Any, depth: int = 0) -> Any:
    """A dict key or set member as plain data (atoms, and tuples and frozensets of them), else ``_NOT_PLAIN``."""
    if type(obj) in ATOMS:
        return obj
    if isinstance(obj, ATOMS):
        return _atom(obj)
    if isinstance(obj, (tuple, frozenset)) and depth < MAX_DEPTH:
        items = [
            _key(item, depth + 1)
            for item in (tuple.__iter__(obj) if isinstance(obj, tuple) else frozenset.__iter__(obj))
        ]
        if any(item is _NOT_PLAIN for item in items):
            return _NOT_PLAIN
        return tuple(items) if isinstance(obj, tuple) else frozenset(items)
    return _NOT_PLAIN


class _Encoder:
    def __init__(self, other: Callable[[Any], Any]) -> None:
        self.other = other
        self.holes: list[Hole] = []
        self.open: set[int] = set()  # ids of the containers being walked (a cycle becomes a hole)

    def hole(self, obj: Any, path: tuple[Any, ...]) -> None:
        self.holes.append((path, self.other(obj)))

    def walk(self, obj: Any, path: tuple[Any, ...]) -> Any:
        kind = type(obj)
        if kind in ATOMS:
            return obj
        if isinstance(obj, ATOMS):
            return _atom(obj)
        if isinstance(obj, bytearray):
            return bytes(obj)
        if not isinstance(obj, (list, tuple, dict, set, frozenset)) or len(path) >= MAX_DEPTH or id(obj) in self.open:
            self.hole(obj, path)
            return None
        self.open.add(id(obj))
        try:
            return self.container(obj, path)
        finally:
            self.open.discard(id(obj))

    def container(self, obj: Any, path: tuple[Any, ...]) -> Any:
        if isinstance(obj, dict):
            items = list(dict.items(obj))
            keys = [_key(key) for key, _ in items]
            if any(key is _NOT_PLAIN for key in keys):
                self.hole(obj, path)
                return None
            return {key: self.walk(value, (*path, key)) for key, (_, value) in zip(keys, items, strict=True)}
        if isinstance(obj, (set, frozenset)):
            members = [_key(item) for item in (set.__iter__(obj) if isinstance(obj, set) else frozenset.__iter__(obj))]
            if any(item is _NOT_PLAIN for item in members):
                self.hole(obj, path)
                return None
            return set(members) if isinstance(obj, set) else frozenset(members)
        items = list(list.__iter__(obj) if isinstance(obj, list) else tuple.__iter__(obj))
        out_items = [self.walk(item, (*path, index)) for index, item in enumerate(items)]
        return out_items if isinstance(obj, list) else tuple(out_items)


def encode(obj: Any, other: Callable[[Any], Any]) -> tuple[Any, list[Hole]]:
    """``obj`` as ``(value, holes)``; ``other(part)`` gives the descriptor of each part that is not plain.

    Raises:
        whatever ``other`` raises for a part that may not cross (the trusted
        side raises :class:`TypeError` for an object of its own).
    """
    encoder = _Encoder(other)
    value = encoder.walk(obj, ())
    return value, encoder.holes


def _fill(value: Any, holes: list[Hole], make: Callable[[Any], Any]) -> Any:
    for path, descriptor in holes:
        if not path:
            return make(descriptor)
    groups: dict[Any, list[Hole]] = {}
    for path, descriptor in holes:
        groups.setdefault(path[0], []).append((path[1:], descriptor))
    filled: Any
    if type(value) is dict:
        filled = dict(value)
    elif type(value) in (list, tuple):
        filled = list(value)
    else:
        raise PlainError(f"a hole inside a {type(value).__name__}")
    for key, inner in groups.items():
        if type(filled) is list and not (type(key) is int and 0 <= key < len(filled)):
            raise PlainError(f"a hole at index {key!r} of a sequence of {len(filled)}")
        if type(filled) is dict and key not in filled:
            raise PlainError(f"a hole at a missing key {key!r}")
        filled[key] = _fill(filled[key], inner, make)
    return tuple(filled) if type(value) is tuple else filled


def decode(value: Any, holes: Any, make: Callable[[Any], Any]) -> Any:
    """Put the holes back into ``value``: each is ``make(descriptor)``.

    Raises:
        PlainError: ``holes`` is not a list of ``(path, descriptor)`` that fits ``value``.
    """
    if not holes:
        return value
    if type(holes) not in (list, tuple):
        raise PlainError("holes must be a list")
    checked: list[Hole] = []
    for hole in holes:
        if type(hole) not in (list, tuple) or len(hole) != 2 or type(hole[0]) not in (list, tuple):
            raise PlainError("a hole must be a (path, descriptor) pair")
        checked.append((tuple(hole[0]), hole[1]))
    return _fill(value, checked, make)
