"""Pair rows: text checks (missing columns, empty or identical sides), length limits, EOS handling;
and that bad input stops a run before any model is built."""
from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from core.config.composition import compose
from core.data import preferences as PD
from core.config import schema
from core.data.prompts import DataError
from core.paths import CONF_DIR


def _data_cfg(**kw):
    base = OmegaConf.load(CONF_DIR / "data" / "pairs_base.yaml")
    base.pop("defaults", None)
    return schema.node(schema.PairDataConfig, base, **kw)


ROWS = [{"chosen": "good", "rejected": "bad"}, {"chosen": "x"}, {"chosen": "", "rejected": "y"},
        {"chosen": "same", "rejected": "same"}, {"chosen": [{"role": "user", "content": " "}], "rejected": "z"},
        {"chosen": "fine", "rejected": "worse"}]


def test_bad_rows_are_dropped_and_counted():
    kept, st = PD.check_rows(ROWS, _data_cfg(), "train")
    assert [r["chosen"] for r in kept] == ["good", "fine"]
    assert (st.kept, st.missing_column, st.empty, st.identical) == (2, 1, 2, 1)
    assert st.first_bad == [1, 2, 3, 4]


def test_bad_rows_error_names_the_row():
    with pytest.raises(DataError, match="train row 1 .*missing column"):
        PD.check_rows(ROWS, _data_cfg(bad_rows="error"), "train")


def test_wrong_column_names_list_the_columns():
    with pytest.raises(DataError, match="no eval row has both columns 'chosen' and 'rejected'.*'answer', 'question'"):
        PD.check_rows([{"question": "q", "answer": "a"}] * 3, _data_cfg(), "eval")


def test_no_usable_row_is_an_error():
    with pytest.raises(DataError, match="none of the 2 train rows"):
        PD.check_rows([{"chosen": "a", "rejected": "a"}, {"chosen": "", "rejected": "b"}], _data_cfg(), "train")


@pytest.fixture(scope="module")
def tok():
    from core.models.loading import build_char_tokenizer

    return build_char_tokenizer("llama")


def test_too_long_pairs_are_dropped_or_truncated_with_eos_forced(tok):
    pairs = [{"chosen": "a" * 10, "rejected": "b" * 3, "margin": 0.0}, {"chosen": "ab", "rejected": "ba", "margin": 0.0}]
    st = PD.PairStats()
    out = PD.tokenize_pairs(pairs, tok, _data_cfg(too_long="drop"), 6, st)
    assert len(out) == 1 and st.too_long_dropped == 1 and st.truncated == 0
    st = PD.PairStats()
    out = PD.tokenize_pairs(pairs, tok, _data_cfg(too_long="truncate", force_eos=True), 6, st)
    assert len(out) == 2 and st.truncated == 1
    assert all(len(p["chosen"]) <= 6 and p["chosen"][-1] == tok.eos_token_id for p in out)
    assert all(p["rejected"][-1] == tok.eos_token_id for p in out)


def test_append_eos_and_chat_template(tok):
    cfg = _data_cfg(append_eos=True, eos_separator=" ")
    assert tok.decode(PD.tokenize_text("hi\n", tok, cfg)) == "hi " + tok.eos_token
    msgs = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    text = tok.decode(PD.tokenize_text(msgs, tok, _data_cfg()))
    assert text.startswith(tok.bos_token) and text.endswith("a" + tok.eos_token)
    with pytest.raises(DataError, match="apply_chat_template is false"):
        PD.tokenize_text(msgs, tok, _data_cfg(apply_chat_template=False))


def test_copy_digits_task_is_crisp_and_split_without_overlap():
    cfg = compose(["recipe=tiny_rm"]).data
    train, evals, stats = PD.load_pairs(cfg)
    assert len(train) + len(evals) == cfg.generator.num_pairs and len(evals) == 400
    for p in train + evals:
        prompt, right = p["chosen"].rsplit(" ", 1)
        wrong = p["rejected"].rsplit(" ", 1)[1]
        assert prompt == f"copy {right}:" and sum(a != b for a, b in zip(right, wrong)) == cfg.generator.corrupt


@pytest.mark.parametrize("override,error", [
    (["data.chosen_key=better"], "no train row has both columns 'better'"),
    (["train.lora.rank=8", "train.lora.target_modules=[c_attn]"], "matches no module"),
    (["train.batch_size=10", "train.micro_batch_size=4"], "not a multiple"),
    (["data.generator.num_pairs=20"], "make no optimiser step"),
])
def test_bad_input_stops_before_any_model_is_built(monkeypatch, override, error):
    import recipes.rm as rm

    def no_model(*a, **k):
        raise AssertionError("a model was built before the input checks")

    monkeypatch.setattr(rm, "model_dir", no_model)
    monkeypatch.setattr(rm.RM, "load_reward_model", no_model)
    with pytest.raises((DataError, ValueError), match=error):
        rm.setup(compose(["recipe=tiny_rm", "recipe_name=tiny_rm", *override]))  # the name a run's Hydra gives
