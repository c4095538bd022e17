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


def test_bad_rows_keep_trains_every_row_with_both_columns_and_counts_them():
    kept, st = PD.check_rows([r for r in ROWS if "rejected" in r], _data_cfg(bad_rows="keep"), "train")
    assert [r["rejected"] for r in kept] == ["bad", "y", "same", "z", "worse"]
    assert (st.kept, st.empty, st.identical) == (5, 2, 1)
    with pytest.raises(DataError, match="train row 1 .*missing column.*bad_rows=keep"):
        PD.check_rows(ROWS, _data_cfg(bad_rows="keep"), "train")


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


def _chat(prompt: str, answer: str) -> list[dict]:
    return [{"role": "user", "content": prompt}, {"role": "assistant", "content": answer}]


@pytest.fixture()
def tulu(tok):
    """The char tokenizer with the Open-Instruct recipe's template forced on it (a copy: ``tok`` is shared)."""
    import copy

    t = copy.deepcopy(tok)
    PD.force_chat_template(t, compose(["recipe=open_instruct_rm_8b"]).data)
    return t


@pytest.mark.parametrize("bug", [True, False])
def test_release_length_filter_checks_only_the_first_limit_set(tulu, bug):
    """dataset_processor.py @3dd7a07d: with max_prompt_tokens set only the prompt is held to a limit (a long pair with
    a short prompt trains at full length); without it only the chosen side (a long rejected side passes)."""
    cfg = _data_cfg(length_filter_bug=bug, max_prompt_tokens=30)
    pairs = [{"chosen": _chat("q", "a" * 40), "rejected": _chat("q", "b"), "margin": 0.0},  # a 25-token prompt
             {"chosen": _chat("q" * 20, "a"), "rejected": _chat("q" * 20, "b"), "margin": 0.0}]  # a 44-token one
    st = PD.PairStats()
    out = PD.tokenize_pairs(pairs, tulu, cfg, 30, st)
    assert len(out) == (1 if bug else 0) and st.too_long_dropped == 2 - len(out)
    if bug:  # not truncated either: the source pads whatever its filter keeps
        assert len(out[0]["chosen"]) > 30 and st.truncated == 0
    no_prompt_limit = _data_cfg(length_filter_bug=bug, max_prompt_tokens=None)
    long_rejected = [{"chosen": "ab", "rejected": "c" * 40, "margin": 0.0}]
    assert len(PD.tokenize_pairs(long_rejected, tulu, no_prompt_limit, 30, PD.PairStats())) == int(bug)


def test_prompt_length_is_the_chat_prompt_with_its_generation_prefix_or_the_shared_string_prefix(tulu):
    pair = {"chosen": _chat("hi", "yes"), "rejected": _chat("hi", "no")}
    ids = tulu(tulu.apply_chat_template(pair["chosen"], tokenize=False), add_special_tokens=False)["input_ids"]
    assert PD.prompt_length(pair, ids, ids, tulu) == len("<|user|>\nhi\n<|assistant|>\n")  # one token a character
    assert PD.prompt_length({"chosen": "Q: x A: y"}, [1, 2, 3, 4], [1, 2, 5], tulu) == 2


def test_tulu_template_is_forced_on_the_tokenizer_as_the_source_does(tok):
    import copy

    tok = copy.deepcopy(tok)
    """reward_modeling.py:244 @3dd7a07d: tokenizer.chat_template = CHAT_TEMPLATES["tulu"], the string the RLVR data
    quotes too."""
    cfg = compose(["recipe=open_instruct_rm_8b"]).data
    assert cfg.chat_template_override == compose(["recipe=open_instruct_rlvr_8b"]).data.chat_template_override
    tok.chat_template = "{{ 'not tulu' }}"
    PD.force_chat_template(tok, cfg)
    msgs = [{"role": "system", "content": "s"}, *_chat("q", "a"), *_chat("q2", "a2")]
    text = tok.apply_chat_template(msgs, tokenize=False)
    eos = tok.eos_token
    assert text == f"<|system|>\ns\n<|user|>\nq\n<|assistant|>\na{eos}\n<|user|>\nq2\n<|assistant|>\na2{eos}"
    PD.force_chat_template(tok, _data_cfg())  # null: the checkpoint's own stays
    assert tok.chat_template == cfg.chat_template_override


@pytest.mark.parametrize("key,value", [("length_filter_bug", "true"), ("max_prompt_tokens", "64")])
def test_length_filters_that_drop_need_too_long_drop(key, value):
    from core.config.validate import problems

    cfg = compose(["recipe=openrlhf_rm_llama3_8b", f"data.{key}={value}"])
    found = [p for p in problems(cfg, 8, packages=False) if p.startswith(f"data.{key}=")]
    assert found and "with data.too_long=truncate" in found[0], found
    assert not problems(compose(["recipe=open_instruct_rm_8b"]), 8, packages=False)  # drop: both allowed
