"""A folder our run saved, readable by a source env's older transformers (tests/fidelity drivers; never in .venv)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from transformers import PreTrainedTokenizerFast


def v4_folder(src: Path, dst: Path) -> Path:
    """``src`` (``save_pretrained`` of our run: config, weights, transformers 5's tokenizer) as ``dst``: the same config
    and weights, and the same ``tokenizer.json``, chat template and specials as a transformers 4
    ``PreTrainedTokenizerFast`` (4.x cannot read v5's ``TokenizersBackend`` class, nor its list of extra special
    tokens, which 4.x reads as a dict: it becomes ``additional_special_tokens``)."""
    dst.mkdir(exist_ok=True)
    for name in ("config.json", "model.safetensors"):
        shutil.copy(src / name, dst / name)
    conf = json.loads((src / "tokenizer_config.json").read_text())
    tok = PreTrainedTokenizerFast(tokenizer_file=str(src / "tokenizer.json"), padding_side=conf["padding_side"],
                                  additional_special_tokens=conf.get("extra_special_tokens") or [],
                                  clean_up_tokenization_spaces=conf["clean_up_tokenization_spaces"],
                                  **{k: conf.get(k) for k in ("pad_token", "eos_token", "bos_token", "unk_token")})
    tok.chat_template = (src / "chat_template.jinja").read_text()
    tok.save_pretrained(dst)
    return dst
