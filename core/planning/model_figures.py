"""What the time planner needs of a model's shape, from its config alone (no weights): parameter counts, the FLOPs of
a token and the bytes of its KV cache.

The config is the checkpoint's own ``config.json`` fields (core/models/shapes.py, no hub needed), or a locally built
tiny model's (``model.tiny``). Counts follow the decoder layout transformers builds for the Llama and Qwen2 classes:
per layer the q, k, v, o projections (k and v of ``num_key_value_heads``) and the gated MLP's three matrices, then the
embedding and, when untied, the LM head.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelFigures:
    params: int  # every parameter, tied weights once
    matmul_params: int  # parameters a token multiplies through: the layers' matrices and the LM head
    layers: int
    attn_dim: int  # heads x head_dim: the width of q (and of the attention's T x T products)
    kv_dim: int  # key/value heads x head_dim

    @property
    def weight_bytes(self) -> int:
        """bf16 weights: what a decode step reads once and what a gather or a weight sync moves."""
        return 2 * self.params

    @property
    def kv_bytes_per_token(self) -> int:
        """bf16 K and V of one token over every layer (vLLM's cache in the model's dtype)."""
        return 2 * 2 * self.layers * self.kv_dim

    def forward_flops(self, context: float) -> float:
        """FLOPs of one token's forward at ``context`` tokens of causal context: 2 per matrix parameter, and
        the attention's QK^T and AV products, 2 x 2 x attn_dim per context token per layer."""
        return 2.0 * self.matmul_params + 4.0 * self.layers * self.attn_dim * context


def figures(config) -> ModelFigures:
    """The figures of a transformers ``config`` of a decoder-only model (Llama, Qwen2 classes)."""
    h, inter, n = config.hidden_size, config.intermediate_size, config.num_hidden_layers
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or h // heads
    kv = getattr(config, "num_key_value_heads", None) or heads
    attn, kv_dim = heads * head_dim, kv * head_dim
    bias = attn + 2 * kv_dim if getattr(config, "attention_bias", config.model_type == "qwen2") else 0
    per_layer = h * attn + 2 * h * kv_dim + attn * h + bias + 3 * h * inter + 2 * h  # + two RMSNorm weights
    embed = config.vocab_size * h
    head = 0 if config.tie_word_embeddings else embed
    return ModelFigures(params=n * per_layer + embed + head + h, matmul_params=n * (per_layer - 2 * h - bias) + embed,
                        layers=n, attn_dim=attn, kv_dim=kv_dim)


