"""A checkpoint folder's manifest: every file's size and SHA-256, written last, and the check made before a resume.

On a shared file system a folder that was renamed into place whole can still read back short (a client that
cached a truncated file, a server that lost a write); its ``COMPLETE`` mark (core/training/checkpoint.py) says only
that the writer finished. The manifest records what the writer wrote, so a reader can tell. The hashing is split
over the ranks (each hashes every ``world``-th file, rank 0 writes the manifest), so a sharded DeepSpeed checkpoint
of hundreds of GiB is hashed in parallel by the processes that wrote it; the same split checks it on resume.
Neither TRL (Hugging Face Trainer) nor veRL records or checks checksums: both load whatever the newest folder holds.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from core.training import distributed

MANIFEST = "MANIFEST.json"
_CHUNK = 1 << 24  # bytes read per update: 16 MiB


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _files(folder: Path) -> list[str]:
    """Every file below ``folder`` (relative, sorted; the manifest and the COMPLETE mark left out)."""
    folder = Path(folder)
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*")
                  if p.is_file() and p.name not in (MANIFEST, "COMPLETE"))


def write_manifest(folder: Path, step: int) -> None:
    """``MANIFEST.json`` in ``folder``: ``step`` and each file's ``size`` and ``sha256``, written atomically, last.
    Collective: call once every rank's files are in (it waits for them), rank 0 lists and writes."""
    distributed.barrier()  # every rank's files are written before rank 0 lists them
    names = distributed.broadcast_object(_files(folder) if distributed.is_main() else None)
    rank, world = distributed.rank(), distributed.world()
    share = {n: {"size": (Path(folder) / n).stat().st_size, "sha256": sha256(Path(folder) / n)}
             for n in names[rank::world]}
    parts = distributed.gather_objects(share)
    if distributed.is_main():
        files = {n: part[n] for part in parts for n in part}
        body = {"step": step, "bytes": sum(f["size"] for f in files.values()), "files": dict(sorted(files.items()))}
        tmp = Path(folder) / f".{MANIFEST}.tmp"
        tmp.write_text(json.dumps(body, indent=1))
        os.replace(tmp, Path(folder) / MANIFEST)


def read_manifest(folder: Path) -> dict | None:
    try:
        return json.loads((Path(folder) / MANIFEST).read_text())
    except (OSError, ValueError):
        return None


def manifest_bytes(folder: Path) -> int:
    """The bytes a checkpoint's manifest records (0 when it has none)."""
    body = read_manifest(folder)
    return int(body["bytes"]) if body else 0


def verify(folder: Path, rank: int = 0, world: int = 1) -> str | None:
    """What is wrong with ``folder`` against its manifest, or None: a manifest missing or unreadable, a listed file
    missing or of another size (every file, on every rank: a stat is cheap), and the SHA-256 of this rank's share of
    the files (every ``world``-th from ``rank``)."""
    body = read_manifest(folder)
    if body is None or not isinstance(body.get("files"), dict):
        return f"no readable {MANIFEST} (written last: the write did not finish)"
    for i, (name, want) in enumerate(body["files"].items()):
        path = Path(folder) / name
        if not path.is_file():
            return f"{name} is missing"
        size = path.stat().st_size
        if size != want["size"]:
            return f"{name} holds {size} bytes, the manifest {want['size']}"
        if i % world == rank and sha256(path) != want["sha256"]:
            return f"{name} does not match its SHA-256"
    return None
