"""Padding-free forwards through the Hugging Face module: the real tokens of a micro-batch in one row.

A rollout batch is mostly padding once completions differ in length (left padding of the shorter
prompts, right padding after each EOS). The ecosystem's answer, used here as they use it (veRL
``use_remove_padding``, OpenRLHF ``--packing_samples``, TRL ``padding_free``): every row's real tokens
go into one row ``[1, M]`` with position ids restarting at 0 per sequence and no attention mask, and
transformers keeps attention inside each sequence itself, with variable-length flash attention
(``flash_attention_2``/``_3``: sequence boundaries from the position ids) or with a block-diagonal causal
mask (``sdpa``, ``eager``: ``masking_utils.find_packed_sequence_indices``). Every position-wise op (norms,
projections, MLP, LM head) then runs on real tokens only.

Which tokens run: each row's real prompt tokens, then the response tokens whose hidden state is read
(``run_resp``). A hidden state at position ``p`` predicts token ``p + 1``, so the policy runs response
token ``t`` only if token ``t + 1`` is real (the EOS scores nothing and does not run), and the critic
runs every real response token (Open-Instruct reads a value one step after the EOS).

Exactness: the same log-probs, values and gradients as the padded forward to float rounding
(tests/core/test_packing.py, fp32 on CPU under sdpa and eager; bf16 by ``make gpu-smoke``). That holds
for the model types whose mask transformers builds from packed position ids and that the tests cover
(:data:`PACKED_MODEL_TYPES`); :func:`unsupported_reason` says why anything else runs padded.

When (config ``packing``, :func:`packs`): ``auto`` packs where attention is variable-length
(flash-attn), as veRL, OpenRLHF and TRL do, since only there packing is free of cost; under sdpa/eager
the mask is ``[M, M]`` and attention computes every pair of the packed row, masked or not, which outweighs
the position-wise saving unless padding dominates (the CPU demo's update: 0.25 s padded, 0.55 s packed,
docs/performance.md). ``true`` packs wherever it is exact (sdpa/eager included), ``false`` never.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

log = logging.getLogger(__name__)

# Model types whose packed forward is tested equal to the padded one (tests/core/test_packing.py).
PACKED_MODEL_TYPES = frozenset({"llama", "qwen2"})
# Attention implementations that keep packed sequences apart from the position ids alone.
PACKED_ATTENTION = frozenset({"sdpa", "eager", "flash_attention_2", "flash_attention_3"})
# ... and those among them that attend per sequence (no [M, M] work): where packing=auto packs.
VARLEN_ATTENTION = frozenset({"flash_attention_2", "flash_attention_3"})
MODES = ("auto", True, False)
LAYOUT = ("packed forwards expect the rollout layout: non-empty prompts, left-padded to the prompt length (the "
          "last prompt column of every row a real token)")
_REPORTED: set[str] = set()  # why a forward ran padded, logged once per reason


def unsupported_reason(model) -> str | None:
    """None if a packed forward of ``model`` equals its padded forward, else the reason it runs padded."""
    cfg = model.config
    if cfg.model_type not in PACKED_MODEL_TYPES:
        return f"model_type={cfg.model_type!r} (packing is tested for {sorted(PACKED_MODEL_TYPES)})"
    attn = getattr(cfg, "_attn_implementation", None) or "eager"
    if attn not in PACKED_ATTENTION:
        return f"attn_implementation={attn!r} (packed sequences need one of {sorted(PACKED_ATTENTION)})"
    return None


def packs(model, mode) -> bool:
    """Whether forwards of ``model`` run packed under the config value ``mode`` (``auto``, true, false)."""
    if mode is False:
        return False
    reason = unsupported_reason(model)
    if reason is not None:
        if reason not in _REPORTED:
            _REPORTED.add(reason)
            log.info("packing=%s: running padded forwards for this model: %s", mode, reason)
        return False
    return mode is True or model.config._attn_implementation in VARLEN_ATTENTION


def varlen_kwargs(model, cu_seqlens: torch.Tensor, max_length: int) -> dict:
    """The sequence boundaries of a packed row as the keyword arguments transformers hands to variable-length
    flash attention (``FlashAttentionKwargs``: ``cu_seq_lens_q/k``, ``max_length_q/k``; transformers 5.x
    ``_flash_attention_forward`` takes its varlen branch when all four are given). Without them every layer
    derives the boundaries from the position ids again (``prepare_fa_kwargs_from_position_ids``: a nonzero, a
    max and the flash-attn call's int conversion, each a host sync, per layer). ``{}`` for sdpa/eager, whose
    block-diagonal mask transformers builds once per forward from the position ids."""
    if getattr(model.config, "_attn_implementation", None) not in VARLEN_ATTENTION:
        return {}
    return {"cu_seq_lens_q": cu_seqlens, "cu_seq_lens_k": cu_seqlens, "max_length_q": max_length,
            "max_length_k": max_length}


def cu_seqlens(lens: torch.Tensor) -> torch.Tensor:
    """Cumulative lengths ``[N + 1]`` (int32, flash-attn's type) of sequences of ``lens [N]`` packed in a row."""
    return torch.nn.functional.pad(lens.cumsum(0), (1, 0)).to(torch.int32)


def position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions ``[N, T]`` that skip left padding: the first real token of each row is position 0."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


@dataclass
class PackedRows:
    """One packed row and where each response slot's hidden state sits in it."""

    input_ids: torch.Tensor  # [1, M] the tokens that run, row after row
    position_ids: torch.Tensor  # [1, M] restarting at 0 per row
    source: torch.Tensor  # [J] packed index of the hidden state read for each scored slot
    scored: torch.Tensor  # [N, R] bool: the response slots that get a value (J of them)
    cu_seqlens: torch.Tensor  # [N + 1] int32: where each row starts in the packed row, then M
    max_length: int  # tokens of the longest row (on the host: flash-attn takes it as an int)

    def attention_kwargs(self, model) -> dict:
        """The boundaries for ``model``'s forward (:func:`varlen_kwargs`; empty unless flash attention)."""
        return varlen_kwargs(model, self.cu_seqlens, self.max_length)


def pack(input_ids: torch.Tensor, attention_mask: torch.Tensor, prompt_length: int,
         run_resp: torch.Tensor) -> PackedRows:
    """Pack a left-padded rollout batch ``[N, T]`` (prompt ``P = prompt_length`` columns, then responses).

    ``run_resp [N, R-1]``: which response tokens ``P .. T-2`` run (a contiguous prefix per row). Response
    slot ``t`` reads the hidden state at position ``P + t - 1``: the last prompt token for ``t = 0``, else
    response token ``t - 1``, so it is scored when that token runs."""
    P, (N, T) = prompt_length, input_ids.shape
    if P == 0:
        raise ValueError(LAYOUT)
    prompt = attention_mask[:, :P].bool()  # [N, P]
    run = torch.cat([prompt, run_resp.bool()], 1)  # [N, T-1]
    lens = run.sum(1)  # [N] tokens of each row that run
    # the one host sync of a packed forward: the layout check, the row's length and the longest sequence
    ok, M, longest = torch.stack([prompt[:, -1].all().long(), lens.sum(), lens.max()]).tolist()
    if not ok:
        raise ValueError(LAYOUT)
    starts = lens.cumsum(0) - lens  # [N] packed index of each row's first token
    row = torch.repeat_interleave(torch.arange(N, device=input_ids.device), lens)  # [M]
    pos = torch.arange(M, device=input_ids.device) - starts[row]  # [M]
    t = torch.arange(T - P, device=input_ids.device)  # [R]
    n_resp = run_resp.sum(1, keepdim=True)  # [N, 1] response tokens that run
    scored = t[None, :] <= n_resp  # [N, R] slot t reads response token t - 1 (or the last prompt token)
    source = (starts + prompt.sum(1) - 1)[:, None] + t[None, :]  # [N, R] packed index of position P + t - 1
    return PackedRows(input_ids=input_ids[:, :T - 1][run][None], position_ids=pos[None],
                      source=source[scored], scored=scored, cu_seqlens=cu_seqlens(lens), max_length=longest)


def unpack(values: torch.Tensor, packed: PackedRows) -> torch.Tensor:
    """``values [J]`` (one per scored slot) -> ``[N, R]``, zero on the slots not scored."""
    out = values.new_zeros(packed.scored.shape)  # [N, R]
    return out.masked_scatter(packed.scored, values)
