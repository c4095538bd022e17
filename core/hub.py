"""The Hugging Face Hub, read in one place: a dataset (``datasets.load_dataset``, core/data/) or a model
(``from_pretrained``, core/models/) that cannot be reached or does not exist there is an input error naming its id,
with the two ways out (``HF_HUB_OFFLINE=1`` over the hub cache, or a local file or model dir), instead of a
traceback after the libraries' retries.

The libraries say so in several types, often wrapped: ``datasets`` raises the builtin ``ConnectionError`` ("Couldn't
reach ... on the Hub") and ``DatasetNotFoundError``; ``huggingface_hub`` raises ``OfflineModeIsEnabled`` (a
``ConnectionError``), ``LocalEntryNotFoundError`` (nothing cached and no network) and ``RepositoryNotFoundError``;
transformers wraps those in an ``OSError``. :func:`hub_failure` reads the whole chain of causes.
"""
from __future__ import annotations

import contextlib
import os

from core.errors import InputError


class HubError(InputError):
    """A dataset or model the Hugging Face Hub cannot give: unreachable (offline, nothing cached) or not there."""


def hub_failure(error: BaseException) -> str | None:
    """``"unreachable"`` or ``"not found"`` when ``error`` (or an exception it was raised from) is the hub
    libraries' way of saying so; None for every other error."""
    from huggingface_hub.errors import LocalEntryNotFoundError, RepositoryNotFoundError

    try:
        from datasets.exceptions import DatasetNotFoundError
    except ImportError:  # pragma: no cover (datasets is a dependency; a model load does not need it)
        DatasetNotFoundError = RepositoryNotFoundError
    seen, e = set(), error
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, (RepositoryNotFoundError, DatasetNotFoundError)):
            return "not found"
        if isinstance(e, (ConnectionError, TimeoutError, LocalEntryNotFoundError)) or \
                type(e).__name__ in ("ConnectError", "ConnectTimeout", "gaierror"):  # httpx / socket, by name
            return "unreachable"
        e = e.__cause__ or e.__context__
    return None


def message(kind: str, key: str, name: str, failure: str, error: BaseException) -> str:
    """What to tell the user about ``kind`` (``dataset`` or ``model``) ``name``, set by config key ``key``."""
    first = str(error).strip().splitlines()[0] if str(error).strip() else ""
    why = f"{type(error).__name__}: {first}" if first else type(error).__name__
    repo = "--repo-type dataset " if kind == "dataset" else ""
    local = ("data.source=file data.path=PATH (a .jsonl, .jsonl.gz, .json or .parquet file; data.eval_path for the "
             "held-out rows)" if kind == "dataset" else
             f"{key}=DIR (a local model dir holding config.json, the weights and the tokenizer)")
    if failure == "not found":
        head = (f"{key}={name}: no {kind} of that id on the Hugging Face Hub, or it is gated or private "
                f"(hf auth login) ({why})")
    else:
        offline = "HF_HUB_OFFLINE=1 is set" if os.environ.get("HF_HUB_OFFLINE") else \
            "set HF_HUB_OFFLINE=1 to fail at once instead of retrying"
        head = (f"{key}={name}: the {kind} could not be read from the Hugging Face Hub and is not in its cache "
                f"({why}); {offline}, and fill the cache where there is a network (hf download {repo}{name})")
    return f"{head}; or use {local}"


@contextlib.contextmanager
def reading(kind: str, key: str, name) -> None:
    """Run a hub read of ``kind`` (``dataset`` or ``model``) ``name`` (config key ``key``): a failure the hub
    libraries report as unreachable or not found becomes a :class:`HubError` (:func:`message`); every other
    error passes unchanged."""
    try:
        yield
    except Exception as e:
        failure = hub_failure(e)
        if failure is None:
            raise
        raise HubError(message(kind, key, str(name), failure, e)) from e
