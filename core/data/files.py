"""Local data files read by what they hold, not by their name alone: a file whose content is not the format its
extension promises is refused naming the file, the format found in it and what its extension is read as (a JSON
array given as ``.jsonl``, CSV given as ``.json``, Parquet given as ``.jsonl``, an empty file, a ``.gz`` that is not
gzip...), before any model is built (the loops read their rows first: recipes/rl.py, recipes/rm.py ``setup``).

Formats read (docs/byo.md): JSON Lines (``.jsonl``, one object per line), the same gzip-compressed (``.jsonl.gz``),
a JSON array of row objects (``.json``) and Parquet (``.parquet``).
"""
from __future__ import annotations

import codecs
import gzip
import json
import zlib
from pathlib import Path

from core.errors import InputError


class DataError(InputError):
    """Bad data configuration or a missing file; raised before any model is built."""


# extension -> what a file of that extension is read as (its format, named in the messages)
FORMATS = {".jsonl.gz": "gzip-compressed JSON Lines", ".jsonl": "JSON Lines (one JSON object per line)",
           ".json": "a JSON array of row objects", ".parquet": "Parquet"}
# format found in a file's content -> the extension it would be read under
EXTENSION_OF = {"jsonl": ".jsonl", "json array": ".json", "gzip": ".jsonl.gz", "parquet": ".parquet"}
HEAD = 1 << 16  # bytes looked at to tell the format
JSONL = ("jsonl", "JSON Lines (its first line is one JSON object)")


class Rows(list):
    """The rows of a file, each knowing where it is in it (``where(i)``: ``<file> line 7``), so a message about a
    row's value names the file and line (core/data/prompts.py ``load_split``)."""

    def __init__(self, rows: list[dict], path: Path, places: list[str]):
        super().__init__(rows)
        self.path, self.places = path, places

    def where(self, i: int) -> str:
        return f"{self.path} {self.places[i]}"


def extension(name: str) -> str | None:
    """The readable extension ``name`` ends with (``.jsonl.gz`` before ``.gz``), else None."""
    return next((ext for ext in FORMATS if name.endswith(ext)), None)


def sniff(head: bytes) -> tuple[str, str]:
    """``(kind, description)`` of a file's first bytes: ``empty``, ``gzip``, ``parquet``, ``zip``, ``binary``,
    ``json array``, ``jsonl`` (a first line that is a JSON object), ``json object``, ``csv``, ``tsv`` or ``text``."""
    if not head.strip():
        return "empty", "nothing (the file is empty)"
    for magic, kind, what in ((b"\x1f\x8b", "gzip", "gzip-compressed data"), (b"PAR1", "parquet", "a Parquet file"),
                              (b"PK\x03\x04", "zip", "a zip archive (an .xlsx workbook is one)")):
        if head.startswith(magic):
            return kind, what
    try:  # a character cut at the end of the head is left for the next read, not called binary
        text = codecs.getincrementaldecoder("utf-8")().decode(head, final=len(head) < HEAD)
    except UnicodeDecodeError:
        return "binary", f"binary data, not UTF-8 text (it starts with bytes {head[:8]!r})"
    text = text.lstrip("\ufeff \t\r\n")
    first = text.splitlines()[0] if text else ""
    if text.startswith("["):
        return "json array", "a JSON array (its content starts with '[')"
    if text.startswith("{") and "\n" not in text and len(head) >= HEAD:  # a first row longer than the head
        return JSONL
    if text.startswith("{"):
        try:
            one = json.loads(first)
        except json.JSONDecodeError:
            return "json object", "one JSON object spread over several lines (its first line is '{')"
        if isinstance(one, dict):
            return JSONL
    sep = "\t" if "\t" in first else "," if "," in first else None
    if sep:
        return ("tsv" if sep == "\t" else "csv"), f"{'TSV' if sep == chr(9) else 'CSV'} text (its first line " \
                                                  f"is {first[:80]!r})"
    return "text", f"plain text, not JSON (it starts {first[:80]!r})"


def mismatch(path: Path, key: str, ext: str, found: tuple[str, str]) -> DataError:
    """The refusal of a file ``path`` (named by ``key``) whose content ``found`` is not what ``ext`` is read as."""
    kind, what = found
    fix = f"rename it to end in {EXTENSION_OF[kind]}" if kind in EXTENSION_OF else \
        "convert it to JSON Lines: one {\"prompt\": ..., \"answer\": ...} object per line, named .jsonl"
    return DataError(f"{key}={path}: the file holds {what}, but a {ext} file is read as {FORMATS[ext]}; {fix}")


def read_rows(path: Path, key: str = "data.path") -> Rows:
    """The rows of the local file ``path`` (named by config ``key`` in messages), its format told by its extension
    and checked against its content; each row knows its line (:class:`Rows`)."""
    if not path.exists():
        raise DataError(f"{key}: data file not found: {path}")
    if path.is_dir():
        raise DataError(f"{key}={path}: a directory, expected a data file ({', '.join(FORMATS)})")
    ext = extension(path.name)
    with open(path, "rb") as fh:
        found = sniff(fh.read(HEAD))
    if ext is None:
        raise DataError(f"{key}: unsupported file type {path} (expected .jsonl, .jsonl.gz, .json or .parquet); the "
                        f"file holds {found[1]}")
    if found[0] == "empty":
        raise DataError(f"{key}={path}: the file is empty; expected {FORMATS[ext]} holding the rows")
    if ext == ".jsonl.gz":
        return _gzip_rows(path, key, found)
    if ext == ".json" and found[0] in ("json array", "json object", "jsonl"):
        return _json_array(path, key, found)
    if EXTENSION_OF.get(found[0]) != ext:
        raise mismatch(path, key, ext, found)
    if ext == ".parquet":
        return _parquet_rows(path, key)
    with open(path, encoding="utf-8") as fh:
        return _lines(fh, path, key)


def _gzip_rows(path: Path, key: str, found: tuple[str, str]) -> list[dict]:
    """A ``.jsonl.gz`` file: gzip around JSON Lines, each layer checked."""
    if found[0] != "gzip":
        raise DataError(f"{key}={path}: the file is not gzip-compressed (it holds {found[1]}); "
                        + (f"rename it to end in {EXTENSION_OF[found[0]]}" if found[0] in EXTENSION_OF else
                           "write it as JSON Lines, gzip-compressed"))
    try:
        with gzip.open(path, "rb") as fh:
            inner = sniff(fh.read(HEAD))
        if inner[0] != "jsonl":
            raise DataError(f"{key}={path}: the gzip-compressed content is {inner[1]}, but a .jsonl.gz file is "
                            f"read as {FORMATS['.jsonl.gz']}")
        with gzip.open(path, "rt", encoding="utf-8") as fh:
            return _lines(fh, path, key)
    except (gzip.BadGzipFile, EOFError, zlib.error) as e:
        raise DataError(f"{key}={path}: a truncated or corrupt gzip file ({e})") from None


def _lines(fh, path: Path, key: str) -> Rows:
    try:
        numbered = [(n, _json_line(line, path, n, key)) for n, line in enumerate(fh, 1) if line.strip()]
    except UnicodeDecodeError as e:
        raise DataError(f"{key}={path}: not UTF-8 text ({e.reason} at byte {e.start} of a line)") from None
    inner = " of its decompressed text" if path.name.endswith(".gz") else ""
    return Rows([row for _, row in numbered], path, [f"line {n}{inner}" for n, _ in numbered])


def _json_line(line: str, path: Path, n: int, key: str) -> dict:
    try:
        row = json.loads(line)
    except json.JSONDecodeError as e:
        raise DataError(f"{key}: {path} line {n} is not valid JSON ({e.msg} at column {e.colno}): "
                        f"{line.strip()[:80]!r}") from None
    if not isinstance(row, dict):
        raise DataError(f"{key}: {path} line {n} is a JSON {type(row).__name__}, expected an object (one row)")
    return row


def _json_array(path: Path, key: str, found: tuple[str, str]) -> list[dict]:
    """A ``.json`` file: one JSON array of row objects (JSON Lines, or one object, named as such)."""
    try:
        rows = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        if found[0] == "jsonl" and e.msg == "Extra data":  # one object per line: JSON Lines
            raise mismatch(path, key, ".json", found) from None
        raise DataError(f"{key}: {path} line {e.lineno} column {e.colno} is not valid JSON: {e.msg}") from None
    except UnicodeDecodeError as e:
        raise DataError(f"{key}={path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    if isinstance(rows, dict):
        raise DataError(f"{key}={path}: the file holds one JSON object (keys {sorted(rows)[:8]}), but a .json file is "
                        f"read as {FORMATS['.json']}: [{{\"prompt\": ..., \"answer\": ...}}, ...]")
    bad = next((i for i, r in enumerate(rows) if not isinstance(r, dict)), None)
    if bad is not None:
        raise DataError(f"{key}={path}: item {bad} of the JSON array is a {type(rows[bad]).__name__} "
                        f"({json.dumps(rows[bad])[:60]}), expected an object (one row)")
    if not rows:
        raise DataError(f"{key}={path}: the JSON array is empty; expected one object per row")
    return Rows(rows, path, [f"item {i} of its array" for i in range(len(rows))])


def _parquet_rows(path: Path, key: str) -> list[dict]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        rows = pq.read_table(path).to_pylist()
    except (pa.ArrowException, OSError) as e:
        raise DataError(f"{key}={path}: not a readable Parquet file ({e})") from None
    return Rows(rows, path, [f"row {i}" for i in range(len(rows))])
