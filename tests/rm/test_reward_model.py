"""Scalar-head RM pieces: pair batches, packing, the Bradley-Terry loss, head init, LoRA, save/load."""
from __future__ import annotations

import math

import pytest
import torch

from core.models import reward_model as RM
from core.config import schema

PAIRS = [{"chosen": [5, 6, 7, 8], "rejected": [5, 6, 9], "margin": 0.5},
         {"chosen": [5, 10], "rejected": [5, 11, 12, 13, 14], "margin": 0.0}]


@pytest.mark.parametrize("side", ["left", "right"])
def test_pair_batch_reads_the_last_real_token_on_either_side(side):
    b = RM.pair_batch(PAIRS, pad_id=0, padding_side=side)
    assert b["input_ids"].shape == (4, 5)  # [chosen_1, chosen_2, rejected_1, rejected_2]
    seqs = [p["chosen"] for p in PAIRS] + [p["rejected"] for p in PAIRS]
    for row, s in enumerate(seqs):
        assert b["input_ids"][row, b["last"][row]].item() == s[-1]
        assert b["attention_mask"][row].sum().item() == len(s)
    assert b["margin"].tolist() == [0.5, 0.0]


def test_bt_loss_matches_the_formula_with_margin_and_centring():
    r = torch.tensor([2.0, 0.0, 1.0, 1.0])  # r_c = [2, 0], r_r = [1, 1]
    margin = torch.tensor([0.5, 0.0])
    cfg = schema.node(schema.RMLossConfig, use_margin=True, center_coef=0.01)
    loss, m = RM.bt_loss(r, margin, cfg)
    want = -(math.log(1 / (1 + math.exp(-0.5))) + math.log(1 / (1 + math.exp(1.0)))) / 2 + 0.01 * (9 + 1) / 2
    assert loss.item() == pytest.approx(want, rel=1e-6)
    assert m["accuracy"] == 0.5 and m["margin"] == pytest.approx(0.0)
    plain, _ = RM.bt_loss(r, margin, schema.node(schema.RMLossConfig))
    assert plain.item() == pytest.approx(-(math.log(torch.sigmoid(torch.tensor(1.0)).item())
                                           + math.log(torch.sigmoid(torch.tensor(-1.0)).item())) / 2, rel=1e-6)


def test_packed_rewards_equal_padded_rewards(tiny_llama_dir, model_cfg):
    model = RM.load_reward_model(tiny_llama_dir, model_cfg, "inv_hidden", pad_token_id=0).eval()
    padded = RM.sequence_rewards(model, RM.pair_batch(PAIRS, 0, "right"))
    left = RM.sequence_rewards(model, RM.pair_batch(PAIRS, 0, "left"))
    packed = RM.sequence_rewards(model, RM.packed_batch(PAIRS))
    torch.testing.assert_close(packed, padded, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(left, padded, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name,std", [("inv_sqrt_hidden", 1 / math.sqrt(33)), ("inv_hidden", 1 / 33)])
def test_fresh_head_is_initialised_with_the_source_std(tiny_llama_dir, model_cfg, name, std):
    torch.manual_seed(0)
    stds = [RM.load_reward_model(tiny_llama_dir, model_cfg, name).score.weight.std().item() for _ in range(20)]
    assert sum(stds) / len(stds) == pytest.approx(std, rel=0.15)


def _lora_cfg(targets="all-linear", task_type="SEQ_CLS"):
    return schema.node(schema.LoraConfig, rank=4, alpha=8, dropout=0.0, target_modules=targets, task_type=task_type)


def test_lora_gradients_reach_only_lora_and_the_head(tiny_llama_dir, model_cfg):
    model = RM.apply_lora(RM.load_reward_model(tiny_llama_dir, model_cfg, "inv_hidden", 0), _lora_cfg())
    names = RM.trainable_names(model)
    lora = [n for n in names if "lora_" in n]
    head = [n for n in names if "score" in n]
    assert lora and head and len(lora) + len(head) == len(names), names
    r = RM.sequence_rewards(model, RM.pair_batch(PAIRS, 0, "right"))
    RM.bt_loss(r, torch.zeros(2), schema.node(schema.RMLossConfig))[0].backward()
    with_grad = {n for n, p in model.named_parameters() if p.grad is not None and p.grad.abs().sum() > 0}
    assert with_grad and all("lora_" in n or "score" in n for n in with_grad)
    assert any("lora_B" in n for n in with_grad) and any("score" in n for n in with_grad)


def test_lora_without_task_type_adapts_the_head_and_freezes_its_random_base_weight(tiny_llama_dir, model_cfg):
    """OpenRLHF's LoraConfig has no task type: all-linear wraps ``score`` too; its base weight keeps the fresh
    N(0, 1/(h+1)) init, frozen, and only the head's adapter learns (openrlhf/models/model.py @06ab51e)."""
    torch.manual_seed(0)
    base = RM.load_reward_model(tiny_llama_dir, model_cfg, "inv_hidden", 0)
    init = base.score.weight.detach().clone()  # [1, H]
    model = RM.apply_lora(base, _lora_cfg(task_type=None))
    params = dict(model.named_parameters())
    head = {n: p for n, p in params.items() if ".score." in n}
    assert {n.split(".score.")[1] for n, p in head.items() if p.requires_grad} == {"lora_A.default.weight",
                                                                                 "lora_B.default.weight"}
    frozen = next(p for n, p in head.items() if n.endswith("score.base_layer.weight"))
    assert not frozen.requires_grad and torch.equal(frozen, init)
    r = RM.sequence_rewards(model, RM.pair_batch(PAIRS, 0, "right"))
    RM.bt_loss(r, torch.zeros(2), schema.node(schema.RMLossConfig))[0].backward()
    assert frozen.grad is None and head[next(n for n in head if "score.lora_A" in n)].grad is not None
    skeleton = RM.model_skeleton(model_cfg)
    assert "score" in RM.check_lora_targets(_lora_cfg(task_type=None), skeleton)
    assert "score" not in RM.check_lora_targets(_lora_cfg(), skeleton)  # SEQ_CLS: peft spares the head


def test_lora_target_that_matches_nothing_is_a_clear_error(model_cfg):
    skeleton = RM.model_skeleton(model_cfg)
    assert all(p.device.type == "meta" for p in skeleton.parameters())  # nothing was built
    assert len(RM.check_lora_targets(_lora_cfg(["q_proj", "v_proj"]), skeleton)) == 4  # 2 layers x 2
    with pytest.raises(ValueError, match="matches no module.*q_proj"):
        RM.check_lora_targets(_lora_cfg(["query_key_value"]), skeleton)


def test_lora_rm_merges_and_loads_as_a_plain_sequence_classifier(tiny_llama_dir, model_cfg, tmp_path):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from core.training.engine import TorchEngine

    model = RM.apply_lora(RM.load_reward_model(tiny_llama_dir, model_cfg, "inv_hidden", 0), _lora_cfg())
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(std=0.5)  # a non-trivial adapter, so merging changes the weights
    batch = RM.pair_batch(PAIRS, 0, "right")
    before = RM.sequence_rewards(model, batch).detach()
    optim = schema.node(schema.OptimConfig, {"optimizer": {"lr": 1e-3}, "scheduler": {"name": "constant"}})
    engine = TorchEngine(model, optim, total_steps=1, grad_accum=1, device=torch.device("cpu"))
    tok = AutoTokenizer.from_pretrained(tiny_llama_dir)
    RM.save_reward_model(engine, tok, tmp_path, {"mean": 0.25, "std": 2.0})
    loaded = AutoModelForSequenceClassification.from_pretrained(tmp_path).eval()
    assert not any("lora" in n for n, _ in loaded.named_parameters())
    assert (loaded.config.mean, loaded.config.std) == (0.25, 2.0)
    torch.testing.assert_close(RM.sequence_rewards(loaded, batch), before, atol=1e-5, rtol=1e-5)
    hf = loaded(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits.squeeze(-1)
    torch.testing.assert_close(hf, before, atol=1e-5, rtol=1e-5)  # HF's own pooling reads the same token
