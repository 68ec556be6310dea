"""Bounded file input and checked file output: every failure is a one-line SpecError naming the path or option."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from initadvisor.errors import SpecError, UsageError

FIGURES = (".png", ".svg", ".pdf")  # what matplotlib writes for --png, --svg, --plot


def read_bounded(path: str | Path, limit: int, what: str = "file") -> bytes:
    """At most `limit` bytes of a regular file; devices, FIFOs and sockets are refused before reading (a FIFO
    would block, /dev/urandom never ends), so a read is bounded in size and time."""
    fname = str(path)
    try:
        fd = os.open(fname, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        raise SpecError("no such file", fname) from None
    except IsADirectoryError:
        raise SpecError(f"is a directory, not a {what}", fname) from None
    except OSError as e:
        raise SpecError(f"cannot read: {e.strerror}", fname) from None
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise SpecError(f"is a directory, not a {what}", fname)
        if not stat.S_ISREG(st.st_mode):
            raise SpecError(f"not a regular file (a device, pipe or socket), expected a {what}", fname)
        if st.st_size > limit:
            raise SpecError(f"file too large ({st.st_size} bytes; a {what} is at most {limit})", fname)
        raw = os.read(fd, limit + 1)
    except OSError as e:
        raise SpecError(f"cannot read: {e.strerror}", fname) from None
    finally:
        os.close(fd)
    if len(raw) > limit:
        raise SpecError(f"file too large (over {limit} bytes; a {what} is at most {limit})", fname)
    return raw


def write_output(path: str | Path, data: str | bytes, option: str) -> None:
    """Write a command's output file; a directory, a missing folder or an unwritable path is one line."""
    check_output(path, option)
    try:
        Path(path).write_bytes(data.encode("utf-8") if isinstance(data, str) else data)
    except OSError as e:
        raise UsageError(f"cannot write {path}: {e.strerror or e}", option) from None


def check_output(path: str | Path, option: str, suffixes: tuple[str, ...] = ()) -> None:
    """Fail before any work when `path` cannot be an output file (checked again when written)."""
    p = Path(path)
    why = None
    if str(path) == "" or p.is_dir():
        why = f"{path} is a directory, expected a file name"
    elif p.exists() and not p.is_file():
        why = f"{path} is not a regular file"
    elif not p.parent.is_dir():
        why = f"folder {p.parent} does not exist"
    elif p.exists() and not os.access(p, os.W_OK) or not p.exists() and not os.access(p.parent, os.W_OK):
        why = f"{path} is not writable"
    elif suffixes and p.suffix.lower() not in suffixes:
        why = f"{path}: unsupported file type {p.suffix or '(none)'!r} (expected {', '.join(suffixes)})"
    if why:
        raise UsageError(why, option)
