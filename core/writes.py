"""Writes of a run's output that fail as a full disk really fails them: whatever the writer raises.

A full file system does not always say ``OSError(ENOSPC)``: torch 2.13's ``torch.save`` reports it as ``RuntimeError:
[enforce fail at inline_container.cc:672] . unexpected pos ...`` (its zip writer checks the position it reached), and
safetensors and DeepSpeed raise their own types. So a write here treats any exception of the writer as a failed
write: what it wrote is taken back (an appended row cut off, a temporary file removed) so the file holds what it held
before, and :class:`WriteError` names the path, the error and the free space left (docs/reliability.md "Full disks").
"""
from __future__ import annotations

import os
import shutil
from contextlib import contextmanager
from pathlib import Path

from core.errors import InputError


class WriteError(InputError):
    """A write of the run's output failed (a full disk, a quota, an I/O error); what was there before is intact."""


def size_text(n: int) -> str:
    """``n`` bytes in the unit that shows them: ``3.9 MiB``, ``1.20 GiB``."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}" if unit == "GiB" else f"{n / scale:.1f} {unit}"
    return f"{n} B"


def free_bytes(path: Path) -> int:
    """Free bytes on the file system holding ``path`` (its nearest existing parent)."""
    path = Path(path)
    while not path.exists() and path != path.parent:
        path = path.parent
    return shutil.disk_usage(path).free


def free_text(path: Path) -> str:
    return f"{size_text(free_bytes(path))} free on the file system of {Path(path).parent}"


def failed(path: Path, error: BaseException, what: str) -> WriteError:
    """The :class:`WriteError` of a write of ``path`` that raised ``error``; ``what`` says what is intact now."""
    return WriteError(f"writing {path} failed ({type(error).__name__}: {str(error).strip()[:300]}); {what}; "
                      f"{free_text(path)}: free space on that file system and rerun with resume=auto")


@contextmanager
def appending(path: Path):
    """Append to ``path`` inside this context: if the write raises, the file is cut back to its length before (a
    file it created is removed) and :class:`WriteError` raised, so no half-written row is left."""
    path = Path(path)
    before = path.stat().st_size if path.exists() else None
    try:
        yield
    except Exception as e:
        if before is None:
            path.unlink(missing_ok=True)
        else:
            os.truncate(path, before)
        raise failed(path, e, "the row is taken back and the rows before it are intact") from e


def replace_text(path: Path, text: str) -> None:
    """``path`` holds ``text``, written to a temporary sibling and renamed over it (atomic); if the write raises, the
    temporary file is removed, ``path`` is as it was, and :class:`WriteError` is raised."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    except Exception as e:
        tmp.unlink(missing_ok=True)
        raise failed(path, e, f"{path.name} is as it was") from e
