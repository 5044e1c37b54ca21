"""The ``cellbox`` kernelspec: its kernel.json, its logos, and ``cellbox install``.

``pip install`` of the project already puts a spec named ``cellbox`` into
``<prefix>/share/jupyter/kernels/cellbox`` (hatchling shared-data, see
pyproject.toml); those files are written by :func:`write_spec`, so the two
stay the same.  ``cellbox install`` writes more specs, for example one whose
cells get a 10 s wall-clock limit::

    cellbox install --user --name cellbox-short --display-name "Python 3 (cellbox, 10 s)" --wall 10

The argv starts with ``python``, which jupyter_client replaces with the
interpreter it runs under (its ``KernelManager`` does so for a leading
``python``), so the spec survives a moved or rebuilt environment.  The flags
after it (:data:`cellbox.sandbox.importpath.KERNEL_FLAGS`: ``-E -P``) keep the
notebook folder, where the kernel starts and which its cells write, off the
kernel's import path, and ``PYTHONPATH`` out of it.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import struct
import sys
import zlib
from pathlib import Path
from typing import Any

from .sandbox.importpath import KERNEL_FLAGS
from .sandbox.isolation import MODES
from .sandbox.limits import DEFAULT_CEILING, LimitError, Limits, format_size, limits_text

__all__ = ["kernel_json", "write_spec", "logo_png", "LOGO_SVG", "add_parser", "DEFAULT_NAME"]

DEFAULT_NAME = "cellbox"
DEFAULT_DISPLAY_NAME = "Python 3 (cellbox)"

# The logo: a dark blue tile holding a white box whose lower part is filled
# with an orange "cell".  Coordinates are fractions of the side.
_TILE = (0.06, 0.06, 0.94, 0.94, 0.18)  # x0, y0, x1, y1, corner radius
_BOX = (0.24, 0.24, 0.76, 0.76, 0.07)
_CELL = (0.33, 0.50, 0.67, 0.67, 0.03)
_STROKE = 0.07
_BLUE = (0x1F, 0x3A, 0x5F)
_WHITE = (0xFF, 0xFF, 0xFF)
_ORANGE = (0xF2, 0x8C, 0x28)

LOGO_SVG = """<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 100 100" width="100" height="100">
  <rect x="6" y="6" width="88" height="88" rx="18" fill="#1f3a5f"/>
  <rect x="27.5" y="27.5" width="45" height="45" rx="5" fill="none" stroke="#ffffff" stroke-width="7"/>
  <rect x="33" y="50" width="34" height="17" rx="3" fill="#f28c28"/>
</svg>
"""


def _inside(x: float, y: float, box: tuple[float, float, float, float, float]) -> bool:
    """Whether point (x, y) lies in a rounded rectangle."""
    x0, y0, x1, y1, r = box
    if not (x0 <= x <= x1 and y0 <= y <= y1):
        return False
    cx = min(max(x, x0 + r), x1 - r)
    cy = min(max(y, y0 + r), y1 - r)
    return math.hypot(x - cx, y - cy) <= r


def _colour_at(x: float, y: float) -> tuple[tuple[int, int, int], bool]:
    """The logo's colour at (x, y), and whether the point is on the logo at all."""
    if not _inside(x, y, _TILE):
        return (0, 0, 0), False
    if _inside(x, y, _CELL):
        return _ORANGE, True
    x0, y0, x1, y1, r = _BOX
    outer = (x0 - _STROKE / 2, y0 - _STROKE / 2, x1 + _STROKE / 2, y1 + _STROKE / 2, r + _STROKE / 2)
    inner = (x0 + _STROKE / 2, y0 + _STROKE / 2, x1 - _STROKE / 2, y1 - _STROKE / 2, max(r - _STROKE / 2, 0.0))
    if _inside(x, y, outer) and not _inside(x, y, inner):
        return _WHITE, True
    return _BLUE, True


def logo_png(size: int, samples: int = 4) -> bytes:
    """The logo as a ``size`` x ``size`` RGBA PNG, anti-aliased by ``samples``² supersampling.

    Written with zlib and struct only (PNG spec, ISO/IEC 15948: IHDR, IDAT, IEND).
    """
    rows = bytearray()
    for py in range(size):
        rows.append(0)  # filter type 0 (none) for this scanline
        for px in range(size):
            total = [0, 0, 0]
            covered = 0
            for sy in range(samples):
                for sx in range(samples):
                    colour, on = _colour_at((px + (sx + 0.5) / samples) / size, (py + (sy + 0.5) / samples) / size)
                    if on:
                        covered += 1
                        for i in range(3):
                            total[i] += colour[i]
            if covered:
                rows.extend(round(c / covered) for c in total)
            else:
                rows.extend((0, 0, 0))
            rows.append(round(255 * covered / samples**2))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", size, size, 8, 6, 0, 0, 0)  # 8-bit RGBA
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(bytes(rows), 9))
        + chunk(b"IEND", b"")
    )


# Limits set up per spawned run (a tmpfs, a memory cgroup), which a session's forked cells cannot have.
SESSION_WIDE_LIMITS = ("disk", "resident")


def _limit_argv(limits: Limits) -> list[str]:
    """``--CellboxKernel.NAME=VALUE`` for every limit that differs from the defaults."""
    argv = []
    for name, value in limits.as_dict().items():
        if value == getattr(Limits(), name):
            continue
        if name == "shared_memory":
            raise LimitError(
                "--shared-memory: a kernel's /tmp and /dev/shm are its session's, sized once: "
                "use --ceiling shared_memory=SIZE"
            )
        if name in SESSION_WIDE_LIMITS:
            raise LimitError(
                f"--{name}: not a limit of a kernel's cells (they share their session's sandbox); "
                "it holds for `cellbox run` and `cellbox grade`"
            )
        trait = "max_processes" if name == "processes" else name
        if name in ("memory", "output", "file_size"):
            value = "none" if value is None else format_size(value)
        elif isinstance(value, float):
            value = f"{value:g}"
        argv.append(f"--CellboxKernel.{trait}={value}")
    return argv


def _ceiling_argv(words: list[str], session_memory: str | None) -> list[str]:
    """``--CellboxKernel.ceiling=...`` and ``--CellboxKernel.session_memory=...`` from ``cellbox install``'s flags.

    Raises:
        LimitError: a word is not NAME=VALUE or a value is bad (checked here, not at the kernel's start).
    """
    from .kernel.magics import ceiling_from_text

    argv = []
    if words:
        text = " ".join(words)
        ceiling_from_text(text, source="--ceiling")
        argv.append(f"--CellboxKernel.ceiling={text}")
    if session_memory is not None:
        Limits().updated({"resident": session_memory}, source="--session-memory")
        argv.append(f"--CellboxKernel.session_memory={session_memory}")
    return argv


def kernel_json(
    display_name: str = DEFAULT_DISPLAY_NAME,
    limits: Limits | None = None,
    settings: list[str] | None = None,
    executable: str = "python",
) -> dict[str, Any]:
    """The kernel.json content for a spec whose cells get ``limits`` by default.

    ``settings`` are more ``--CellboxKernel.NAME=VALUE`` arguments (isolation, network).
    ``executable`` leads the argv: ``python`` for the spec shipped inside the
    environment (jupyter_client puts its own interpreter there, so the spec
    survives a moved environment), the absolute path of this interpreter for a
    spec installed elsewhere (as ``ipykernel install`` does): a Jupyter of
    another environment then starts this one, where cellbox is.  Either way
    the interpreter gets :data:`~cellbox.sandbox.importpath.KERNEL_FLAGS`, so
    nothing in the folder the kernel starts in is imported by it.
    """
    argv = [executable, *KERNEL_FLAGS, "-m", "cellbox.kernel", "-f", "{connection_file}"]
    argv += _limit_argv(limits or Limits()) + list(settings or [])
    return {
        "argv": argv,
        "display_name": display_name,
        "language": "python",
        "interrupt_mode": "signal",
        # JupyterLab enables its debugger for kernels whose spec says so (DebuggerService.isAvailable), as
        # ipykernel's spec does where debugpy is installed; the kernel's kernel_info says the same (debugger.py).
        "metadata": {"debugger": importlib.util.find_spec("debugpy") is not None},
    }


def write_spec(
    directory: str | os.PathLike[str],
    display_name: str = DEFAULT_DISPLAY_NAME,
    limits: Limits | None = None,
    settings: list[str] | None = None,
    executable: str = "python",
) -> Path:
    """Write kernel.json and the logos into ``directory`` (created if missing); return it."""
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    spec = kernel_json(display_name, limits, settings, executable)
    (path / "kernel.json").write_text(json.dumps(spec, indent=1) + "\n", encoding="utf-8")
    (path / "logo-32x32.png").write_bytes(logo_png(32))
    (path / "logo-64x64.png").write_bytes(logo_png(64))
    (path / "logo-svg.svg").write_text(LOGO_SVG, encoding="utf-8")
    return path


# --------------------------------------------------------------------------- cellbox install


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``cellbox install`` (called by :func:`cellbox.cli.build_parser`)."""
    from .options import add_limit_options

    parser = subparsers.add_parser(
        "install",
        help="install a Jupyter kernelspec for the cellbox kernel",
        description="Install a kernelspec that starts the cellbox kernel with these default limits. "
        "Without --user/--sys-prefix/--prefix it goes to the system-wide Jupyter data directory.",
        epilog="exit status: 0 installed; 2 bad input or a folder that cannot be written",
    )
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--user", action="store_true", help="install for the current user only")
    where.add_argument("--sys-prefix", action="store_true", help=f"install into this environment ({sys.prefix})")
    where.add_argument("--prefix", metavar="PREFIX", help="install into PREFIX/share/jupyter/kernels")
    parser.add_argument("--name", default=DEFAULT_NAME, help=f"kernelspec name (default: {DEFAULT_NAME})")
    parser.add_argument("--display-name", help="name shown in Jupyter (default: 'Python 3 (NAME)')")
    add_limit_options(parser)
    group = parser.add_argument_group("isolation (see `cellbox doctor`)")
    group.add_argument(
        "--isolation",
        choices=MODES,
        help="isolation layers for every cell: none, auto (every layer this machine has) or strict (default: auto)",
    )
    group.add_argument("--network", action="store_true", help="with isolation on, let cells use the network")
    ceilings = parser.add_argument_group("ceiling (what no %%limits line can lift; docs/reference/settings.md)")
    ceilings.add_argument(
        "--ceiling",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="the most a cell's %%limits may ask for, one limit each time, such as --ceiling memory=2G "
        f"--ceiling processes=100 (default: {limits_text(DEFAULT_CEILING)})",
    )
    ceilings.add_argument(
        "--session-memory",
        metavar="SIZE",
        help="memory the whole session may hold: cells, snapshots, /tmp and /dev/shm (a memory cgroup, where "
        "the machine gives one), e.g. 2G, or none (default: 4G)",
    )
    parser.add_argument(
        "--start-method",
        choices=("spawn", "forkserver"),
        help="how each cell's process starts: forkserver (forked from a warm server of the session) or "
        "spawn (a new interpreter per cell, about 0.2 s a cell) (default: forkserver)",
    )
    parser.set_defaults(func=_cmd_install)


def _cmd_install(args: argparse.Namespace) -> int:
    import tempfile

    from jupyter_client.kernelspec import KernelSpecManager

    from .cli import UsageError
    from .options import limits_from_args

    if not args.name or not all(c.isalnum() or c in "-._" for c in args.name):
        raise UsageError(f"--name {args.name!r}: use letters, digits, '-', '.' and '_' only")
    limits = limits_from_args(args)
    settings = [f"--CellboxKernel.isolation={args.isolation}"] if args.isolation else []
    settings += ["--CellboxKernel.network=True"] if args.network else []
    settings += [f"--CellboxKernel.start_method={args.start_method}"] if args.start_method else []
    settings += _ceiling_argv(args.ceiling, args.session_memory)
    display = args.display_name or ("Python 3 (cellbox)" if args.name == DEFAULT_NAME else f"Python 3 ({args.name})")
    with tempfile.TemporaryDirectory() as tmp:
        source = write_spec(Path(tmp) / args.name, display, limits, settings, sys.executable)
        try:
            dest = KernelSpecManager().install_kernel_spec(
                str(source),
                args.name,
                user=args.user,
                prefix=sys.prefix if args.sys_prefix else args.prefix,
            )
        except PermissionError as exc:
            raise UsageError(f"cannot write {exc.filename}: permission denied; use --user or --sys-prefix") from None
    print(f"Installed kernelspec {args.name} ({display}) in {dest}")
    chosen = KernelSpecManager().find_kernel_specs().get(args.name)
    if chosen and os.path.realpath(chosen) != os.path.realpath(dest):
        # Jupyter takes the first spec of a name on its search path (jupyter --paths; in a
        # virtualenv its own share/jupyter comes before the user's, JUPYTER_PREFER_ENV_PATH).
        print(
            f"cellbox: note: Jupyter will start the kernelspec {args.name} in {chosen}, which comes before this one "
            "on its search path: install with --sys-prefix (or the same --prefix) to change that one, or give "
            "this one another --name",
            file=sys.stderr,
        )
    return 0


if __name__ == "__main__":
    # Regenerate the spec shipped with the package: python -m cellbox.kernelspec share/jupyter/kernels/cellbox
    print(write_spec(sys.argv[1] if len(sys.argv) > 1 else "share/jupyter/kernels/cellbox"))
