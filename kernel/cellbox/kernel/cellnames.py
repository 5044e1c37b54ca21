"""The file name of a cell's code, computed as ipykernel and JupyterLab's debugger compute it.

JupyterLab's debugger finds the cell a stopped frame belongs to by hashing
the cell's text itself: ``tmpFilePrefix + murmur2(code, hashSeed) +
tmpFileSuffix``, with the three values the kernel gave in its ``debugInfo``
reply (``hashMethod: "Murmur2"``).  cellbox names every cell so (the cell's
shell compiles it under that name, :class:`cellbox.kernel.cellshell.CellCompiler`),
and the kernel answers ``dumpCell`` with the same name.  Stdlib only: a
cell's process and the kernel both use it.
"""

from __future__ import annotations

import os

__all__ = ["HASH_SEED", "SUFFIX", "murmur2", "cell_file_name"]

# ipykernel's seed (ipykernel/compiler.py get_tmp_hash_seed) and suffix, which debugInfo names.
HASH_SEED = 0xC70F6907
SUFFIX = ".py"
_M = 0x5BD1E995
_MASK = 0xFFFFFFFF


def murmur2(text: str, seed: int = HASH_SEED) -> int:
    """MurmurHash2 (32-bit, x86) of ``text`` encoded as UTF-8, as ipykernel's ``murmur2_x86`` computes it.

    Austin Appleby's MurmurHash2: four bytes at a time (little-endian), the
    last one to three bytes folded in, then the final mix.
    """
    data = text.encode("utf-8")
    length = len(data)
    h = (seed ^ length) & _MASK
    end = length & ~3
    for i in range(0, end, 4):
        k = int.from_bytes(data[i : i + 4], "little")
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = ((h * _M) & _MASK) ^ k
    tail = data[end:]
    if tail:
        h ^= int.from_bytes(tail, "little")
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h


def cell_file_name(code: str, folder: str) -> str:
    """The file name of a cell whose text is ``code``, in ``folder`` (a path, no trailing separator)."""
    return f"{folder}{os.sep}{murmur2(code)}{SUFFIX}"
