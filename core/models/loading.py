"""Models and tokenizers: load by hub name or local dir, or build a tiny one locally (then cached).

A tiny model is built from a config of the same architecture class as the real recipe (Qwen2 for
Qwen, Llama for Llama/Tulu) with a character-level tokenizer built here, saved to a local folder and
loaded back through the same ``from_pretrained`` path that loads a 7B model on a cluster.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import string
from pathlib import Path
from typing import Any, Callable

import torch
from omegaconf import OmegaConf

from core import paths
from core.training.device import DTYPES, fork_rng

# Special tokens per architecture family, named as the real tokenizers name them so chat templates
# and EOS handling exercise the same code paths as on a cluster.
_SPECIALS = {
    "qwen2": {"pad": "<|endoftext|>", "eos": "<|im_end|>", "bos": None, "extra": ["<|im_start|>"]},
    "llama": {"pad": "<|finetune_right_pad_id|>", "eos": "<|eot_id|>", "bos": "<|begin_of_text|>",
              "extra": ["<|start_header_id|>", "<|end_header_id|>", "<|end_of_text|>"]},
}
_CHAT_TEMPLATES = {
    "qwen2": (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    ),
    "llama": (
        "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
        "{{ m['content'] }}<|eot_id|>{% endfor %}"
        "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
    ),
}
_CONFIG_CLASSES = {"qwen2": "Qwen2Config", "llama": "LlamaConfig"}
# The architecture classes a tiny model can be built from locally (``model.arch``).
ARCHITECTURES = tuple(_CONFIG_CLASSES)


def _specials(arch: str) -> dict:
    if arch not in _SPECIALS:
        raise ValueError(f"model.arch={arch!r} is not buildable locally; choose one of {sorted(_SPECIALS)}")
    return _SPECIALS[arch]


def build_char_tokenizer(arch: str):
    """A character-level fast tokenizer: printable ASCII, newline, tab, plus the arch's specials.

    Anything outside that alphabet maps to ``<unk>``; decoding concatenates characters exactly.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    sp = _specials(arch)
    specials = [t for t in [sp["pad"], sp["eos"], sp["bos"], *sp["extra"], "<unk>"] if t]
    chars = [c for c in string.printable if c not in "\r\x0b\x0c"]
    vocab = {tok: i for i, tok in enumerate(specials + chars)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", pad_token=sp["pad"], eos_token=sp["eos"],
        bos_token=sp["bos"], additional_special_tokens=sp["extra"], padding_side="left",
        clean_up_tokenization_spaces=False,
    )
    fast.chat_template = _CHAT_TEMPLATES[arch]
    return fast


def tiny_fields(tiny) -> dict:
    """``model.tiny`` as plain Python containers all the way down. ``dict(node)`` of a DictConfig keeps its nested
    values DictConfig, and transformers 5's config classes (strict dataclasses, huggingface_hub's validators) refuse a
    DictConfig where a field wants a dict (``rope_parameters``)."""
    if OmegaConf.is_config(tiny):
        return OmegaConf.to_container(tiny, resolve=True)
    if isinstance(tiny, dict):
        return {k: tiny_fields(v) for k, v in tiny.items()}
    if isinstance(tiny, (list, tuple)):
        return [tiny_fields(v) for v in tiny]
    return tiny


def tiny_config(model_cfg):
    """The ``transformers`` config of the tiny model ``model_cfg`` (``arch``, ``tiny``) builds, without building it."""
    return _tiny_config(model_cfg.arch, model_cfg.tiny, build_char_tokenizer(model_cfg.arch))


def _tiny_config(arch: str, tiny, tokenizer):
    import transformers

    cls = getattr(transformers, _CONFIG_CLASSES[arch])
    # the tokenizer's size rounded up to a multiple of 8, as real vocabularies are padded, unless the
    # config gives a real model's (a real-shaped model with random weights: make gpu-smoke)
    fields = {"vocab_size": (len(tokenizer) + 7) // 8 * 8, **tiny_fields(tiny)}
    return cls(pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
               bos_token_id=tokenizer.bos_token_id, **fields)


def _digest(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:12]


@contextlib.contextmanager
def _file_lock(path: Path):
    """Exclusive lock so concurrent jobs (Hydra multirun, torchrun ranks) build a cache entry once."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def cache_entry(kind: str, key: Any) -> Path:
    """``<cache>/<kind>/<digest(key)>``: where :func:`cached_build` puts the entry of ``key`` (built or not)."""
    return paths.cache_dir() / kind / _digest(key)


def cached_build(kind: str, key: Any, build: Callable[[Path], None]) -> Path:
    """Return :func:`cache_entry` of ``key``, running ``build(tmp_dir)`` once if it is missing.

    The folder appears atomically (built in a temporary sibling, then renamed), so a killed build
    leaves no half-written entry behind.
    """
    final = cache_entry(kind, key)
    root = final.parent
    if (final / "DONE").exists():
        return final
    with _file_lock(root / f".{final.name}.lock"):
        if (final / "DONE").exists():
            return final
        tmp = root / f".{final.name}.tmp{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        build(tmp)
        (tmp / "key.json").write_text(json.dumps(key, indent=1, sort_keys=True, default=str))
        (tmp / "DONE").write_text("")
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
    return final


def save_from_any_rank(model, out: Path) -> None:
    """``model.save_pretrained(out)`` on whichever rank runs it: a cache entry is built by the rank that takes its
    lock, and transformers 5 writes weights from rank 0 alone when a process group is up (distributed/mixin.py
    ``should_save_on_this_rank``), which left another rank's entry marked done without them."""
    model.should_save_on_this_rank = lambda is_main_process: True  # this instance only
    model.save_pretrained(out)


def build_tiny_model_dir(arch: str, tiny: dict, seed: int) -> Path:
    """Build (once, then cached) a randomly initialised tiny model + tokenizer of class ``arch``."""
    from transformers import AutoModelForCausalLM

    def build(out: Path) -> None:
        tok = build_char_tokenizer(arch)
        cfg = _tiny_config(arch, tiny, tok)
        with fork_rng(torch.device("cpu")):  # built on the CPU
            torch.manual_seed(seed)
            model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
        save_from_any_rank(model, out)
        tok.save_pretrained(out)

    return cached_build("models", {"arch": arch, "tiny": tiny_fields(tiny), "seed": seed, "v": 1}, build)


def model_dir(model_cfg) -> str:
    """The ``from_pretrained`` path for ``model_cfg``: its hub name/local dir, or a built tiny model."""
    if model_cfg.name_or_path:
        return str(model_cfg.name_or_path)
    if not model_cfg.tiny:
        raise ValueError("model.name_or_path is empty and model.tiny is not set: nothing to load")
    return str(build_tiny_model_dir(model_cfg.arch, tiny_fields(model_cfg.tiny), model_cfg.init_seed))


def model_source_problem(key: str, name_or_path: str | None, tokenizer: bool = False) -> str | None:
    """Why ``name_or_path`` cannot be loaded, told apart from a bad hub name: a local path (absolute, ``.``,
    ``~``, or an existing dir) must be a dir holding a readable ``config.json`` and weights (:func:`weights_problem`),
    and with ``tokenizer`` (a policy's dir, where its tokenizer loads from) a tokenizer. A hub name (``org/name``) is
    left to ``from_pretrained``: its cache or the network decide."""
    if not name_or_path:
        return None
    path = Path(str(name_or_path)).expanduser()
    local = path.is_absolute() or str(name_or_path).startswith((".", "~")) or path.exists()
    if not local:
        return None
    if not path.is_dir():
        return f"{key}={name_or_path}: no such local directory (a hub name looks like org/name)"
    if not (path / "config.json").exists():
        return f"{key}={name_or_path}: the directory has no config.json, so it is not a saved model"
    try:
        json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        return f"{key}={name_or_path}: {path / 'config.json'} is not valid JSON ({e}); expected a saved model's config"
    problem = weights_problem(path)
    if problem is None and tokenizer and not any((path / f).exists() for f in TOKENIZER_FILES):
        problem = (f"holds no tokenizer (none of {', '.join(TOKENIZER_FILES)}); save one beside the model "
                   f"(tokenizer.save_pretrained(dir))")
    return f"{key}={name_or_path}: the directory {problem}" if problem else None


# Files a saved tokenizer is loaded from (AutoTokenizer.from_pretrained: a fast tokenizer's tokenizer.json, a
# SentencePiece model, or a BPE vocabulary).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tokenizer_config.json")
# Index files of sharded weights (transformers' SAFE_WEIGHTS_INDEX_NAME and WEIGHTS_INDEX_NAME).
WEIGHT_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")


def weights_problem(path: Path) -> str | None:
    """What a local model dir lacks of its weights, or None: ``*.safetensors`` or ``*.bin`` files, or a shard index
    (``model.safetensors.index.json``) whose every shard is there. Said as a predicate of "the directory"."""
    for index in WEIGHT_INDEXES:
        if (path / index).exists():
            try:
                shards = set(json.loads((path / index).read_text())["weight_map"].values())
            except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as e:
                return f"has an unreadable weight index {index} ({type(e).__name__}: {e})"
            missing = sorted(s for s in shards if not (path / s).is_file())
            return f"lacks {len(missing)} of the {len(shards)} shards {index} lists: {', '.join(missing[:4])}" \
                if missing else None
    if any(path.glob("*.safetensors")) or any(path.glob("*.bin")):
        return None
    return (f"holds config.json but no weights (no *.safetensors, *.bin or {' / '.join(WEIGHT_INDEXES)}; "
            f"it holds {', '.join(sorted(p.name for p in path.iterdir())[:8])}); save the model with "
            f"model.save_pretrained(dir), or copy its weight files there")


def vocabulary(model_cfg) -> tuple[int, str] | None:
    """``(vocab_size, where it was read)`` of the model ``model_cfg`` describes, without building it: a local dir's
    ``config.json`` (``vocab_size``, or its ``text_config``'s), a hub name's in the local Hugging Face cache, or the
    tiny model's size as :func:`_tiny_config` sets it (``model.tiny.vocab_size``, else the character tokenizer's,
    padded to 8). None for a hub name not cached here (its config is from_pretrained's to fetch) or a config that
    says nothing."""
    name = model_cfg.name_or_path
    if not name:
        if not model_cfg.tiny or model_cfg.arch not in _SPECIALS:
            return None
        given = model_cfg.tiny.get("vocab_size")
        if given:
            return int(given), "model.tiny.vocab_size"
        return (len(build_char_tokenizer(model_cfg.arch)) + 7) // 8 * 8, f"the tiny {model_cfg.arch} model"
    config = Path(str(name)).expanduser() / "config.json"
    if not config.is_file():
        config = _cached_hub_config(str(name))
    if config is None or model_source_problem("model.name_or_path", name):
        return None
    data = json.loads(config.read_text(encoding="utf-8"))
    size = data.get("vocab_size") or (data.get("text_config") or {}).get("vocab_size")
    return (int(size), str(config)) if isinstance(size, int) else None


def _cached_hub_config(name: str) -> Path | None:
    """The ``config.json`` of hub model ``name`` in the local Hugging Face cache, if it is there (no network)."""
    from huggingface_hub import try_to_load_from_cache

    try:
        found = try_to_load_from_cache(name, "config.json")
    except ValueError:  # not a valid repo id (a path that does not exist)
        return None
    return Path(found) if isinstance(found, str) else None


def load_tokenizer(path: str):
    """The tokenizer at ``path`` (``model.name_or_path``), left-padded, its pad token the EOS when it has none; a hub
    name the hub cannot give is a :class:`core.hub.HubError`."""
    from transformers import AutoTokenizer

    from core.hub import reading

    with reading("model", "model.name_or_path", path):
        tok = AutoTokenizer.from_pretrained(path)
    tok.padding_side = "left"  # generation pads prompts on the left
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def load_causal_lm(path: str, model_cfg):
    """``AutoModelForCausalLM.from_pretrained`` with dtype (``model.dtype``), attention and gradient
    checkpointing from config. Under ZeRO-3, call it inside ``core.training.backend.Backend.placed``."""
    from transformers import AutoModelForCausalLM

    attn = model_cfg.attn_implementation
    require_attention(attn)
    from core.hub import reading

    with reading("model", "model.name_or_path", path):
        model = AutoModelForCausalLM.from_pretrained(path, dtype=DTYPES[model_cfg.dtype], attn_implementation=attn)
    return with_checkpointing(model, model_cfg)


def with_checkpointing(model, model_cfg):
    """``model`` with gradient checkpointing (non-reentrant, no KV cache) when ``model.gradient_checkpointing``.
    It runs only in train mode (transformers checks ``self.training``): see :func:`for_training`."""
    if model_cfg.gradient_checkpointing:
        if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.x: the old name warns (FutureWarning)
            model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:  # the floor of pyproject.toml (transformers 5.0) has only the old name
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.config.use_cache = False
    return model


def for_training(model, disable_dropout: bool):
    """``model`` in train mode, dropout off when ``disable_dropout`` (config ``train.disable_dropout``).
    ``from_pretrained`` returns eval mode, where transformers skips gradient checkpointing (and dropout); the
    loops' no-grad passes and generation switch to eval and back (:func:`core.models.logprobs.chunked_logprobs`)."""
    if disable_dropout:
        _disable_dropout(model)
    return model.train()


def _disable_dropout(model) -> None:
    """Every dropout probability 0: ``nn.Dropout`` modules, as Open-Instruct's ``disable_dropout_in_model`` and
    TRL's ``disable_dropout_in_model`` do, and the attention dropout transformers' attention modules read from
    their own ``attention_dropout`` attribute (Llama, Qwen2: copied from the config at build, 0.0 in the real
    checkpoints), which those functions leave on."""
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
        if isinstance(getattr(m, "attention_dropout", None), float):
            m.attention_dropout = 0.0
    for k in ("attention_dropout", "hidden_dropout", "dropout"):
        if hasattr(model.config, k):
            setattr(model.config, k, 0.0)


# Where each flash-attention kernel comes from, for the message: transformers imports FA2 from ``flash_attn`` and FA3
# from ``flash_attn_interface`` (5.17; 5.0 looked for a ``flash_attn_3`` module), built from flash-attention's hopper/.
FLASH_PACKAGES = {"2": "flash-attn (the gpu extra: pip install -e '.[gpu]')",
                  "3": "flash-attn-3 (flash-attention's hopper/ build; not in the gpu extra)"}


def flash_attention_problem(attn: str) -> str | None:
    """Why transformers would not run ``model.attn_implementation=attn`` here, or None (also for non-flash ones). Asked
    as transformers asks it when a model loads: its own ``is_flash_attn_2_available`` / ``is_flash_attn_3_available``
    (transformers/utils/import_utils.py; 5.17 wants the ``flash_attn`` module of flash-attn >= 2.3.3, or the
    ``flash_attn_interface`` module of flash-attn-3, and a CUDA device), so a kernel that moves package between
    transformers releases is found where that release finds it. Its fallback to a hub kernel (the ``kernels``
    package, 5.17) is not counted: that downloads code while the model loads."""
    import transformers
    from transformers import utils

    version = attn.removeprefix("flash_attention_")
    check = getattr(utils, f"is_flash_attn_{version}_available", None) if attn.startswith("flash_attention_") else None
    if check is None or check():
        return None
    return (f"model.attn_implementation={attn}: transformers {transformers.__version__} finds no usable "
            f"flash-attention {version} here (transformers.utils.is_flash_attn_{version}_available() is false: it "
            f"needs {FLASH_PACKAGES.get(version, 'its package')} installed and a CUDA device), or use "
            f"model.attn_implementation=sdpa")


def require_attention(attn: str) -> None:
    """Raise :class:`ImportError` with :func:`flash_attention_problem`'s reason before a model loads with ``attn``."""
    problem = flash_attention_problem(attn)
    if problem:
        raise ImportError(problem)
