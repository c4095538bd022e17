"""Prompt data as the sources shape it (core/data/prompts.py): dotted keys into nested columns and per-split keys
(SimpleRL-Zoo's parquet), rows without an answer (Codeforces), a system prompt and a chat-template override
(Open-R1), the token-length limit dropped or left-truncated, and a training set the filters leave too small."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from core.config import schema
from core.data import prompts as D
from core.models.loading import load_tokenizer, model_dir
from tests.helpers import TINY

SIMPLERL = Path(os.environ.get("RLR_DATA_DIR", Path(__file__).parents[2].parent / "shared" / "data")) / \
    "simplerl_zoo" / "simplelr_qwen_level3to5"
needs_simplerl = pytest.mark.skipif(not (SIMPLERL / "train.parquet").exists(),
                                    reason=f"SimpleRL-Zoo parquet not found at {SIMPLERL} (set RLR_DATA_DIR)")


def _data(**kw):
    return schema.node(schema.PromptDataConfig, {"source": "file", **kw})


def _jsonl(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(model_dir(schema.node(schema.ModelConfig, name_or_path=None, arch="qwen2", tiny=TINY)))


@needs_simplerl
def test_simplerl_rows_load_through_nested_keys_and_the_character_filter_keeps_the_published_counts():
    """SimpleRL-Zoo reads ``prompt[0]['content']`` verbatim and ``reward_model.ground_truth``; its 1024-character
    filter keeps 8360 of 8523 train rows and 496 of 500 test rows (reference simplerl_zoo.md §2, §5)."""
    cfg = _data(path=str(SIMPLERL / "train.parquet"), eval_path=str(SIMPLERL / "test.parquet"),
                prompt_key="prompt.0.content", answer_key="reward_model.ground_truth")
    train, test = D.load_split(cfg, "train"), D.load_split(cfg, "eval")
    assert (len(train), len(test)) == (8523, 500)
    assert all(r["prompt"].startswith("<|im_start|>system\n") for r in train + test)
    assert all(isinstance(r["answer"], str) for r in train + test)
    assert sum(not r["answer"] for r in train + test) == 2  # two train rows of the released file have an empty one
    assert train[0]["answer"] == train[0]["gt_answer"]  # the train split's own flat copy agrees
    cfg.max_prompt_chars = 1024
    assert (len(D.load_split(cfg, "train")), len(D.load_split(cfg, "eval"))) == (8360, 496)


def test_per_split_keys_and_a_missing_nested_step_is_named(tmp_path):
    train = _jsonl(tmp_path / "train.jsonl", [{"q": "1+1=", "a": "2"}])
    test = _jsonl(tmp_path / "test.jsonl", [{"meta": {"problem": "2+2="}, "sol": [{"final": "4"}]}])
    cfg = _data(path=train, eval_path=test, prompt_key="q", answer_key="a", eval_prompt_key="meta.problem",
                eval_answer_key="sol.0.final")
    assert D.load_split(cfg, "train") == [{"prompt": "1+1=", "answer": "2"}]
    assert D.load_split(cfg, "eval") == [{"meta": {"problem": "2+2="}, "sol": [{"final": "4"}], "prompt": "2+2=",
                                          "answer": "4"}]
    cfg.eval_answer_key = "sol.3.final"
    with pytest.raises(D.DataError, match=r"row 0 of the eval split has no 'sol.3.final' \(data.eval_answer_key; "
                                          r"missing step '3'\)"):
        D.load_split(cfg, "eval")
    cfg.prompt_key = "question"
    with pytest.raises(D.DataError, match=r"row 0 of the train split has no 'question' \(data.prompt_key"):
        D.load_split(cfg, "train")


def test_rows_without_an_answer_keep_their_other_columns(tmp_path):
    path = _jsonl(tmp_path / "cf.jsonl", [{"prompt": "solve", "official_tests": [{"input": "1", "output": "1"}]}])
    (row,) = D.load_split(_data(path=path, answer_key=None), "train")
    assert row == {"prompt": "solve", "official_tests": [{"input": "1", "output": "1"}]}


def test_system_prompt_and_chat_template_override_render_in_order(tok):
    template = "{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}{% if add_generation_prompt %}" \
               "[assistant]{% endif %}"
    cfg = _data(chat_template=True, chat_template_override=template, system_prompt="Think-first.")
    ids = D.tokenize_prompt("1+2=", cfg, tok)
    assert tok.decode(ids) == "[system]Think-first.[user]1+2=[assistant]"
    cfg.system_prompt = None
    assert tok.decode(D.tokenize_prompt([{"role": "user", "content": "hi"}], cfg, tok)) == "[user]hi[assistant]"


def test_the_token_limit_drops_or_truncates_on_the_left(tok):
    rows = [{"prompt": "1+1="}, {"prompt": "12345+67890="}, {"prompt": "3="}]
    full = [D.tokenize_prompt(r["prompt"], _data(), tok) for r in rows]
    limit = sorted(len(p) for p in full)[1]  # the middle length: one row is longer
    assert sum(len(p) > limit for p in full) == 1
    kept, ids = D.tokenize_rows(rows, _data(max_prompt_tokens=limit), tok)
    assert [r["prompt"] for r in kept] == [r["prompt"] for r, p in zip(rows, full) if len(p) <= limit]
    assert ids == [p for p in full if len(p) <= limit]
    kept, ids = D.tokenize_rows(rows, _data(max_prompt_tokens=limit, prompt_overflow="truncate_left"), tok)
    assert kept == rows and ids == [p[-limit:] for p in full]  # the last tokens stay (TRL <= 0.18)
    assert D.tokenize_rows(rows, _data(), tok) == (rows, full)


def test_a_training_set_the_filters_leave_too_small_is_refused():
    with pytest.raises(D.DataError, match=r"train.prompts_per_step=8 is larger than the training set \(5 rows after "
                                          r"filtering"):
        D.PromptSampler(5, 8, 0)


def test_an_unknown_overflow_policy_is_refused_by_the_schema():
    from core.config.checking import check_schema
    from core.config.composition import compose

    cfg = compose(["data.prompt_overflow=truncate_right"])
    assert any("data.prompt_overflow='truncate_right'" in e for e in check_schema(cfg))
