"""Issue 30 part 6: classes of bad input refused before any model is built, each message naming the key or file, the
value and what was expected (docs/reliability.md "Bad input"): token ids against the model's vocabulary
(core/config/tokens.py), a reward function of one's own tried on a stand-in sample (verifiers/trial.py), model dirs
without weights (core/models/loading.py), data files read by content (core/data/files.py), and the checks the
data's size decides (core/config/rows.py). Each case runs the RL loop's own setup (recipes/rl.py), which must refuse
it before it builds, loads or saves any model."""
from __future__ import annotations

import gzip
import json

import pytest

from core.data.files import DataError, read_rows
from core.errors import InputError

ROWS = [{"prompt": f"{i}+1=", "answer": str(i + 1)} for i in range(40)]


@pytest.fixture
def refused(tmp_path, monkeypatch):
    """``refused(*overrides) -> message``: the RL loop's setup on the config composed as the command line composes
    it raises an InputError, and no model was built, loaded or saved on the way (every way one is made, recorded)."""
    import transformers

    import core.models.loading as loading

    built = []

    def record(what):
        def fn(*args, **kwargs):
            built.append(what)
            raise AssertionError(f"{what} called before the bad input was refused")
        return fn

    for cls in (transformers.AutoModelForCausalLM, transformers.AutoModelForSequenceClassification):
        monkeypatch.setattr(cls, "from_pretrained", record(f"{cls.__name__}.from_pretrained"))
        monkeypatch.setattr(cls, "from_config", record(f"{cls.__name__}.from_config"))
    monkeypatch.setattr(loading, "build_tiny_model_dir", record("build_tiny_model_dir"))

    def run(*overrides: str) -> str:
        from hydra.core.global_hydra import GlobalHydra

        from core.config.composition import compose
        from recipes.rl import setup

        GlobalHydra.instance().clear()
        cfg = compose([*overrides, f"paths.results_dir={tmp_path}"], with_hydra=True)  # command-line keys known
        with pytest.raises(InputError) as e:
            setup(cfg, run_dir=str(tmp_path / "run"))
        assert built == [] and not (tmp_path / "run" / "model").exists()
        return str(e.value)

    return run


def _file(tmp_path, name: str, rows=ROWS) -> str:
    path = tmp_path / name
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


# --- token ids against the vocabulary ------------------------------------------------------------------------------

def _model_dir(tmp_path, vocab: int = 64, weights: bool = True, tokenizer: bool = True):
    d = tmp_path / "mymodel"
    d.mkdir(exist_ok=True)
    (d / "config.json").write_text(json.dumps({"model_type": "qwen2", "vocab_size": vocab}))
    if weights:
        (d / "model.safetensors").write_bytes(b"\0")
    if tokenizer:
        (d / "tokenizer.json").write_text("{}")
    return d


@pytest.mark.parametrize("overrides, key, value, vocab", [
    (["rollout.stop_token_ids=[5,9999]"], "rollout.stop_token_ids", "[5, 9999]", "[0, 104), the vocabulary of the tiny"),
    (["rollout.stop_token_ids=[-1]"], "rollout.stop_token_ids", "[-1]", "[0, 104)"),
    (["+model.tiny.vocab_size=128", "rollout.stop_token_ids=[127,128]"], "rollout.stop_token_ids", "[127, 128]",
     "[0, 128), the vocabulary of model.tiny.vocab_size"),
    (["+verifier.kwargs.eos_id=500"], "verifier.kwargs.eos_id", "500", "[0, 104)"),  # any *_id key
])
def test_token_ids_are_checked_against_the_tiny_models_vocabulary(refused, overrides, key, value, vocab):
    msg = refused(*overrides)
    assert f"{key}={value}: expected token ids in {vocab}" in msg


def test_at_tiny_scale_the_ids_typed_are_checked_and_the_recipes_kept(refused, compose_cfg):
    """``scale=tiny`` swaps the recipe's model for the tiny one and keeps the recipe's stop ids (Qwen2.5's, checked at
    full scale against that model); ids typed on the command line are checked against the tiny model."""
    from core.config.scale import apply_scale
    from core.config.tokens import token_id_problems

    msg = refused("scale=tiny", "rollout.stop_token_ids=[3,500]", "train.warm_start.holdout=8")
    assert "rollout.stop_token_ids=[3, 500]: expected token ids in [0, 104)" in msg
    tiny = apply_scale(compose_cfg("recipe=simplerl_zoo_7b", "scale=tiny"))
    assert 151645 in tiny.rollout.stop_token_ids and token_id_problems(tiny) == []
    assert "151645" in token_id_problems(tiny, typed=("rollout.stop_token_ids",))[0]


def test_token_ids_are_checked_against_a_local_models_config(refused, compose_cfg, tmp_path):
    from core.config.pipeline import prepare
    from core.config.tokens import token_id_problems

    d = _model_dir(tmp_path, vocab=64)
    msg = refused(f"model.name_or_path={d}", "rollout.stop_token_ids=[3,64,70]")
    assert f"rollout.stop_token_ids=[3, 64, 70]: expected token ids in [0, 64), the vocabulary of {d}/config.json; " \
           f"64, 70 are outside it" in msg
    prepare(compose_cfg(f"model.name_or_path={d}", "rollout.stop_token_ids=[0,63]"))  # ids inside it pass
    # a hub model's vocabulary is not known before it is fetched: its ids are left to the run
    assert token_id_problems(compose_cfg("recipe=simplerl_zoo_7b")) == []


def test_a_local_models_own_token_ids_and_its_tokenizer_are_checked(refused, tmp_path):
    """A pad or EOS id edited past the vocabulary in the dir's config files; a tokenizer of another model beside the
    weights (more tokens than embeddings), found once it is loaded, before the model."""
    from core.models.loading import build_char_tokenizer

    d = _model_dir(tmp_path, vocab=64)
    (d / "config.json").write_text(json.dumps({"vocab_size": 64, "pad_token_id": 70, "bos_token_id": -1}))
    (d / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 99]}))
    msg = refused(f"model.name_or_path={d}")
    assert f"{d}/config.json: pad_token_id=70: expected token ids in [0, 64)" in msg
    assert f"{d}/generation_config.json: eos_token_id=[2, 99]: expected token ids in [0, 64)" in msg
    assert "bos_token_id" not in msg  # -1: "none" in some released configs
    (d / "config.json").write_text(json.dumps({"vocab_size": 64}))
    (d / "generation_config.json").unlink()
    (d / "tokenizer.json").unlink()
    tokenizer = build_char_tokenizer("qwen2")
    tokenizer.save_pretrained(d)
    msg = refused(f"model.name_or_path={d}")
    assert len(tokenizer) > 64 and f"model.name_or_path={d}: its tokenizer has {len(tokenizer)} tokens but the model's vocabulary ({d}/config.json) " \
           f"has 64; expected a tokenizer of at most 64 tokens" in msg


# --- a reward function of one's own ---------------------------------------------------------------------------------

REWARDS = '''
def good(completions, answer, **kwargs):
    return [float(c == a) for c, a in zip(completions, answer)]

def trl_prompts_first(prompts, completions):
    return [0.0 for _ in completions]

def no_columns(completions):
    return [0.0 for _ in completions]

def a_float(completions, **kwargs):
    return 1.0

def two_per_completion(completions, **kwargs):
    return [1.0, 0.0] * len(completions)

def strings(completions, **kwargs):
    return ["1.0" for _ in completions]

def wants_solution(completions, **kwargs):
    return [float(c == s) for c, s in zip(completions, kwargs["solution"])]
'''


@pytest.fixture
def reward_file(tmp_path):
    path = tmp_path / "my_reward.py"
    path.write_text(REWARDS)
    return path


@pytest.mark.parametrize("fn, expected", [
    ("trl_prompts_first", ["trl_prompts_first(prompts, completions) cannot take what the loop passes, "
                           "trl_prompts_first(['", "missing a required argument: 'completions'"]),
    ("no_columns", ["no_columns(completions) cannot take what the loop passes", "unexpected keyword argument "
                    "'answer'", "fn(completions, **columns) -> list[float | None]"]),
    ("a_float", ["a_float(completions, **kwargs) returned 1.0 (a float), expected a list of one score per completion"]),
    ("two_per_completion", ["returned 2 scores for 1 completion"]),
    ("strings", ["strings(completions, **kwargs) returned ['1.0']: a str, expected a float or None"]),
    ("wants_solution", ["wants_solution(completions, **kwargs) raised KeyError: 'solution' when called on a stand-in "
                        "sample, wants_solution(['"]),
])
def test_a_reward_of_ones_own_is_tried_on_a_stand_in_sample(refused, reward_file, fn, expected):
    msg = refused(f"verifier.name={reward_file}:{fn}")
    assert f"verifier.name={reward_file}:{fn}: " in msg
    for fragment in expected:
        assert fragment in msg


def test_a_weighted_term_of_ones_own_is_tried_and_named_by_its_place(refused, reward_file):
    msg = refused("verifier=weighted", "verifier.accuracy_term=math",
                  f"verifier.kwargs.terms=[{{name: math}}, {{name: '{reward_file}:no_columns', weight: 0.1}}]")
    assert f"verifier.kwargs.terms[1].name={reward_file}:no_columns: no_columns(completions) cannot take" in msg


def test_a_routed_route_of_ones_own_is_tried_with_the_columns_it_gets(reward_file):
    from verifiers import VERIFIERS

    row = {**ROWS[0], "dataset": "gsm8k"}
    kwargs = {"routes": {"gsm8k": f"{reward_file}:no_columns", "math": "math"}}
    (msg,) = VERIFIERS.problems("routed", kwargs, "verifier.name", "verifier.kwargs", sample=row)
    assert msg.startswith(f"verifier.kwargs.routes.gsm8k={reward_file}:no_columns: no_columns(completions) cannot "
                          f"take what the loop passes, no_columns(['1'], answer=['1'], dataset=['gsm8k'])")


def test_a_reward_that_keeps_the_contract_passes_its_trial(reward_file):
    from verifiers import VERIFIERS

    for name in (f"{reward_file}:good", "math"):  # the project's own are not called (their tests hold them to it)
        assert VERIFIERS.problems(name, {}, "verifier.name", "verifier.kwargs", sample=ROWS[0]) == []
    bad = VERIFIERS.problems(f"{reward_file}:no_columns", {}, "verifier.name", "verifier.kwargs", sample=ROWS[0])
    assert len(bad) == 1  # the same check, on a function that fails it


# --- model dirs without weights -------------------------------------------------------------------------------------

def test_a_model_dir_without_weights_names_the_dir_and_what_is_missing(refused, tmp_path):
    d = _model_dir(tmp_path, weights=False)
    msg = refused(f"model.name_or_path={d}")
    assert f"model.name_or_path={d}: the directory holds config.json but no weights (no *.safetensors, *.bin or " \
           f"model.safetensors.index.json / pytorch_model.bin.index.json; it holds config.json, tokenizer.json)" in msg


def test_a_sharded_model_dir_names_its_missing_shards(refused, tmp_path):
    d = _model_dir(tmp_path, weights=False)
    shards = {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": shards}))
    (d / shards["a"]).write_bytes(b"\0")
    msg = refused(f"model.name_or_path={d}")
    assert f"the directory lacks 1 of the 2 shards model.safetensors.index.json lists: {shards['b']}" in msg


@pytest.mark.parametrize("broken, fragment", [
    ("config", "config.json is not valid JSON"),
    ("tokenizer", "the directory holds no tokenizer (none of tokenizer.json, tokenizer.model"),
])
def test_a_model_dir_with_a_broken_config_or_no_tokenizer_is_refused(refused, tmp_path, broken, fragment):
    d = _model_dir(tmp_path, tokenizer=broken != "tokenizer")
    if broken == "config":
        (d / "config.json").write_text('{"vocab_size": 64,')
    msg = refused(f"model.name_or_path={d}")
    assert f"model.name_or_path={d}: " in msg and fragment in msg


def test_a_critic_checkpoint_without_weights_is_named_by_its_key(refused, tmp_path):
    d = _model_dir(tmp_path, weights=False, tokenizer=False)  # a reward model needs no tokenizer of its own
    msg = refused("advantage=gae", f"advantage.critic.init_from={d}")
    assert f"advantage.critic.init_from={d}: the directory holds config.json but no weights" in msg


# --- data files read by content ------------------------------------------------------------------------------------

def _parquet(path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(ROWS), path)


WRITERS = {
    "json array as .jsonl": ("train.jsonl", lambda p: p.write_text(json.dumps(ROWS))),
    "csv as .json": ("train.json", lambda p: p.write_text("prompt,answer\n1+1=,2\n")),
    "parquet as .jsonl": ("train.jsonl", _parquet),
    "empty": ("train.jsonl", lambda p: p.write_text("")),
    "blank lines": ("train.json", lambda p: p.write_text("\n\n  \n")),
    "jsonl as .jsonl.gz": ("train.jsonl.gz", lambda p: p.write_text(json.dumps(ROWS[0]) + "\n")),
    "truncated gzip": ("train.jsonl.gz", lambda p: p.write_bytes(gzip.compress(json.dumps(ROWS).encode())[:30])),
    "gzip of a json array": ("train.jsonl.gz", lambda p: p.write_bytes(gzip.compress(json.dumps(ROWS).encode()))),
    "jsonl as .json": ("train.json", lambda p: p.write_text("".join(json.dumps(r) + "\n" for r in ROWS))),
    "one object as .json": ("train.json", lambda p: p.write_text(json.dumps({"data": ROWS}))),
    "binary as .jsonl": ("train.jsonl", lambda p: p.write_bytes(bytes(range(128, 256)))),
    "csv extension": ("train.csv", lambda p: p.write_text("prompt,answer\n1+1=,2\n")),
    "pretty object as .jsonl": ("train.jsonl", lambda p: p.write_text(json.dumps(ROWS[0], indent=2))),
    "array of strings": ("train.json", lambda p: p.write_text(json.dumps(["1+1=", "2+2="]))),
}
EXPECTED = {
    "json array as .jsonl": "the file holds a JSON array (its content starts with '['), but a .jsonl file is read as "
                            "JSON Lines (one JSON object per line); rename it to end in .json",
    "csv as .json": "the file holds CSV text (its first line is 'prompt,answer'), but a .json file is read as a JSON "
                    "array of row objects; convert it to JSON Lines",
    "parquet as .jsonl": "the file holds a Parquet file, but a .jsonl file is read as JSON Lines (one JSON object per "
                         "line); rename it to end in .parquet",
    "empty": "the file is empty; expected JSON Lines (one JSON object per line) holding the rows",
    "blank lines": "the file is empty; expected a JSON array of row objects",
    "jsonl as .jsonl.gz": "the file is not gzip-compressed (it holds JSON Lines (its first line is one JSON object)); "
                          "rename it to end in .jsonl",
    "truncated gzip": "a truncated or corrupt gzip file",
    "gzip of a json array": "the gzip-compressed content is a JSON array (its content starts with '['), but a "
                            ".jsonl.gz file is read as gzip-compressed JSON Lines",
    "jsonl as .json": "the file holds JSON Lines (its first line is one JSON object), but a .json file is read as a "
                      "JSON array of row objects; rename it to end in .jsonl",
    "one object as .json": "the file holds one JSON object (keys ['data']), but a .json file is read as a JSON array",
    "binary as .jsonl": "the file holds binary data, not UTF-8 text",
    "csv extension": "unsupported file type",
    "pretty object as .jsonl": "the file holds one JSON object spread over several lines (its first line is '{'), but "
                               "a .jsonl file is read as JSON Lines",
    "array of strings": "item 0 of the JSON array is a str (\"1+1=\"), expected an object (one row)",
}


@pytest.mark.parametrize("case", sorted(WRITERS))
def test_a_data_file_is_read_by_content_and_its_format_named(tmp_path, case):
    name, write = WRITERS[case]
    path = tmp_path / name
    write(path)
    with pytest.raises(DataError) as e:
        read_rows(path, "data.path")
    assert str(e.value).startswith(f"data.path={path}: " if case != "csv extension" else f"data.path: ")
    assert EXPECTED[case] in str(e.value)


def test_every_readable_format_reads_the_same_rows(tmp_path):
    """The same rows from each format; a first row longer than the bytes looked at to tell the format, with a
    character cut at their end, is still JSON Lines."""
    from core.data.files import HEAD

    rows = [{"prompt": "é" * HEAD, "answer": "0"}, *ROWS]
    (tmp_path / "a.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), "utf-8")
    (tmp_path / "a.json").write_text(json.dumps(ROWS, indent=1))
    (tmp_path / "a.jsonl.gz").write_bytes(gzip.compress((tmp_path / "a.jsonl").read_bytes()))
    _parquet(tmp_path / "a.parquet")
    assert read_rows(tmp_path / "a.jsonl") == read_rows(tmp_path / "a.jsonl.gz") == rows
    for name in ("a.json", "a.parquet"):
        assert read_rows(tmp_path / name) == ROWS, name


def test_a_mislabelled_data_file_is_refused_by_the_loop_before_any_model(refused, tmp_path):
    path = tmp_path / "mine.jsonl"
    path.write_text(json.dumps(ROWS))
    msg = refused("data.source=file", f"data.path={path}", "data.eval_holdout=4")
    assert f"data.path={path}: the file holds a JSON array" in msg


# --- checks the data's size decides ---------------------------------------------------------------------------------

def test_the_warm_start_holdout_is_checked_against_the_rows(refused):
    """The default recipe on 196 training rows: its warm start holds out 200 (the issue's case)."""
    msg = refused("data.generator.num_train=196")
    assert "train.warm_start.holdout=200 with 196 training rows" in msg
    assert "set train.warm_start.holdout below 196 (a tenth: train.warm_start.holdout=19)" in msg


def test_the_warm_start_needs_answers(refused, tmp_path):
    path = _file(tmp_path, "mine.jsonl", [{"prompt": r["prompt"]} for r in ROWS])
    msg = refused("data.source=file", f"data.path={path}", "data.eval_holdout=4", "data.answer_key=null",
                  "train.warm_start.enabled=true", "train.warm_start.holdout=8", "verifier.name=format",
                  "verifier.accuracy_term=format")
    assert "data.answer_key=None gives none; set data.answer_key or train.warm_start.enabled=false" in msg


def test_every_problem_the_rows_decide_is_listed_at_once(refused):
    msg = refused("data.generator.num_train=10", "train.prompts_per_step=16", "train.mini_batch_size=128")
    assert "train.prompts_per_step=16 is larger than the training set (10 rows after filtering)" in msg
    assert "train.warm_start.holdout=200 with 10 training rows" in msg


def test_an_empty_held_out_split_is_refused(refused, tmp_path):
    train = _file(tmp_path, "train.jsonl")
    held = _file(tmp_path, "held.jsonl", [{"prompt": "x" * 50, "answer": "1"}] * 3)
    msg = refused("data.source=file", f"data.path={train}", f"data.eval_path={held}", "data.max_prompt_chars=20",
                  "train.prompts_per_step=4", "train.mini_batch_size=32", "train.micro_batch_size=32")
    assert msg.count("  - ") == 1 and "data: the held-out split has no rows (after data.max_prompt_chars" in msg


def test_too_many_held_out_rows_are_refused_by_the_loop(refused, tmp_path):
    path = _file(tmp_path, "mine.jsonl")
    msg = refused("data.source=file", f"data.path={path}", "data.eval_holdout=40")
    assert "data.eval_holdout=40: holds out 40 of the 40 training rows" in msg


# --- row values, checked as values ------------------------------------------------------------------------------

def test_null_number_and_empty_values_are_named_by_file_line_and_column(refused, tmp_path):
    """The issue's row whose prompt is null (it was refused as "the prompt column holds chat messages", naming no row),
    and its kin: each bad value is listed at once with its file, line and column, before any model."""
    rows = [dict(r) for r in ROWS]
    rows[3]["prompt"] = None
    rows[5]["prompt"] = 17
    rows[6]["prompt"] = "  "
    rows[8]["prompt"] = [{"role": "user"}, "text"]
    rows[9]["answer"] = None
    path = tmp_path / "mine.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows[:5]) + "\n\n" + "\n".join(json.dumps(r) for r in rows[5:]))
    msg = refused("data.source=file", f"data.path={path}", "data.eval_holdout=4")
    assert "data: 5 rows hold no usable value:" in msg and "chat messages but" not in msg
    expected = 'expected the prompt\'s text, or a list of chat messages [{"role": ..., "content": ...}]'
    for line, what in ((4, "null"), (7, "a number (17)"), (8, 'empty ("  ")'),
                       (10, 'a list that is not chat messages ([{"role": "user"}, "text"])')):
        assert f"{path} line {line}, column 'prompt' (data.prompt_key): {what}; {expected}" in msg, msg
    assert f"{path} line 11, column 'answer' (data.answer_key): null; expected the answer (text, or a number)" in msg


def test_a_bad_value_in_the_held_out_file_and_a_json_array_are_placed(refused, tmp_path):
    train = _file(tmp_path, "train.jsonl")
    held = tmp_path / "held.json"
    held.write_text(json.dumps([{"prompt": "1+1=", "answer": "2"}, {"prompt": "", "answer": "3"}]))
    msg = refused("data.source=file", f"data.path={train}", f"data.eval_path={held}", "data.eval_prompt_key=prompt")
    assert f"{held} item 1 of its array, column 'prompt' (data.eval_prompt_key): empty (\"\")" in msg
