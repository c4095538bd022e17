"""Fixtures for the reward-model tests: a tiny Llama built once, and a composed rm config."""
from __future__ import annotations

import pytest
from core.config import schema

TINY = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "max_position_embeddings": 512, "tie_word_embeddings": True}


@pytest.fixture(scope="session")
def tiny_llama_dir():
    from core.models.loading import build_tiny_model_dir

    return str(build_tiny_model_dir("llama", TINY, 0))


@pytest.fixture(scope="session")
def model_cfg():
    return schema.node(schema.ModelConfig, {"name_or_path": None, "arch": "llama", "tiny": TINY, "dtype": "float32",
                             "attn_implementation": "sdpa", "gradient_checkpointing": False})
