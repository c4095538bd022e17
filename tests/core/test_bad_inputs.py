"""Bad inputs are refused before any model is built, each naming the key or file, the value and what was
expected: the typed schema (core/config/schema.py), the input checks (core/config/validate.py ``problems``, run
by core/config/pipeline.py ``prepare``), the data readers. In-process through the loops' own first checks; test_cli.py runs a
sample of them through the command line."""
from __future__ import annotations

import dataclasses
import importlib.util
import json

import pytest
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf
from transformers.utils import is_flash_attn_2_available

from core.config import schema
from core.config.checking import check_schema
from core.config.scale import apply_scale
from core.config.pipeline import prepare
from core.config.validate import ConfigError
from core.data.prompts import DataError, load_split, read_rows

# overrides -> a fragment of the message; every one a value the RL loop once accepted or failed on late.
RL_CASES = [
    (["+train.unknown_key=1"], "train.unknown_key: unknown key (RLTrainConfig); valid keys here: total_steps"),
    (["+train.total_step=3"], "train.total_step: unknown key (RLTrainConfig); did you mean train.total_steps"),
    (["+sed=3"], "sed: unknown key (Config); did you mean seed"),
    (["+train.warm_start.stpes=3"], "did you mean train.warm_start.steps"),
    (["rollout.temperature=-0.5"], "rollout.temperature=-0.5: expected a number > 0"),
    (["rollout.temperature=0"], "rollout.temperature=0.0: expected a number > 0"),
    (["rollout.top_p=1.5"], "rollout.top_p=1.5: expected a number in (0, 1]"),
    (["rollout.top_k=-2"], "rollout.top_k=-2: expected a number >= -1"),
    (["rollout.max_new_tokens=0"], "rollout.max_new_tokens=0: expected a number >= 1"),
    (["rollout.generate_ahead=2"], "rollout.generate_ahead=2: expected one of [0, 1]"),
    (["rollout.temperature=???"], "rollout.temperature: required and not set (???)"),  # its YAML is its home
    (["kl.coef=-1"], "kl.coef=-1.0: expected a number >= 0"),
    (["train.checkpoint_every=-1"], "train.checkpoint_every=-1: expected a number >= 0"),
    (["train.warm_start.target_accuracy=1.5"], "train.warm_start.target_accuracy=1.5: expected a number in [0, 1]"),
    (["optim.optimizer.lr=-1"], "optim.optimizer.lr=-1.0: expected a number > 0"),
    (["optim.optimizer.betas=[0.9,1.5]"], "optim.optimizer.betas=[0.9, 1.5]: expected two numbers in [0, 1)"),
    (["optim.optimizer._target_=torch.optim.SGD"], "optim.optimizer.betas=[0.9, 0.999]: torch.optim.SGD takes no"),
    (["optim.optimizer._target_=torch.optim.Nope"], "optim.optimizer._target_='torch.optim.Nope': not an importable"),
    (["optim.scheduler.name=cosine_warm"], "optim.scheduler.name='cosine_warm': expected one of ['constant'"),
    (["verifier.name=tests.stub_rewards:exact", "+verifier.kwargs.strict=true"],
     "verifier.kwargs.strict: verifier tests.stub_rewards:exact takes no 'strict'"),
    (["data.template=Q:"], "data.template='Q:': expected a format string holding {prompt}"),
    (["train.warm_start.target=x"], "train.warm_start.target='x': expected a format string holding {answer}"),
    (["model.tiny.hidden_size=-8"], "model.tiny.hidden_size=-8: expected a positive size"),
    pytest.param(["model.attn_implementation=flash_attention_2"],
                 "finds no usable flash-attention 2 here (transformers.utils.is_flash_attn_2_available() is false",
                 marks=pytest.mark.skipif(is_flash_attn_2_available(),
                                          reason="flash-attn runs here")),
    (["optim.max_grad_norm=-1"], "optim.max_grad_norm=-1.0: expected a number >= 0"),
    (["loss.clip_low=1.5"], "loss.clip_low=1.5: expected a number in [0, 1)"),
    (["loss.entropy_coef=-0.1"], "loss.entropy_coef=-0.1: expected a number >= 0"),
    (["model.dtype=nope"], "model.dtype='nope': expected one of ['float32', 'bfloat16', 'float16']"),
    (["model.arch=gpt2"], "model.arch='gpt2': expected one of ['llama', 'qwen2']"),
    (["model.name_or_path=/nonexistent"], "model.name_or_path=/nonexistent: no such local directory"),
    (["zero=stage2", "zero.offload_param=true"], "zero.offload_param=true with zero.stage=2"),
    (["zero=stage1", "zero.offload_reference=true"], "zero.offload_reference=true with zero.stage=1"),
    (["zero.offload_optimizer=true"], "zero.offload_optimizer=true with zero.stage=0: ZeRO-Offload is a DeepSpeed"),
    (["zero=stage3", "train.warm_start.steps=5"],  # tests/test_cli.py sends it through the CLI in make test-slow
     "train.warm_start.steps=5 with zero.stage=3: the warm start trains a full copy"),
    (["zero=stage2", "zero.offload_optimizer=true", "optim.optimizer._target_=torch.optim.RMSprop"],
     "zero.offload_optimizer=true with optim.optimizer._target_=torch.optim.RMSprop: the offloaded optimiser "
     "steps with DeepSpeed's CPU Adam, which computes only torch.optim.AdamW or torch.optim.Adam"),
    (["model.attn_implementation=flash_attention_2", "model.dtype=float32"],
     "model.attn_implementation=flash_attention_2 with model.dtype=float32: flash-attn runs in float16 or "
     "bfloat16 only; use model.dtype=bfloat16 or model.attn_implementation=sdpa"),
    (["resume=maybe"], "resume='maybe': expected one of ['auto', True, False]"),
    (["cpu_threads=-1"], "cpu_threads=-1: expected a number >= 0"),
    (["advantage=gae", "advantage.critic.lr=0"], "advantage.critic.lr=0.0: expected a number > 0"),
    (["verifier.name=nope"], "verifier.name='nope': unknown verifier 'nope'"),
    (["data.source=file", "data.path=train.jsonl"], "data.eval_path is not set: data.source=file evaluates on a "
     "held-out file; set data.eval_path=FILE, or hold rows of data.path out with data.eval_holdout=N"),
    (["verifier=weighted"], "verifier.kwargs.terms: required and not set (???); give verifier.kwargs.terms=VALUE"),
    (["data.eval_holdout=0"], "data.eval_holdout=0.0: expected a number > 0"),
    (["data.eval_holdout=2.5"], "data.eval_holdout=2.5: expected a whole number of rows (>= 1) or a fraction (< 1)"),
    (["data.source=file", "data.path=a.jsonl", "data.eval_path=b.jsonl", "data.eval_holdout=10"],
     "data.eval_holdout=10 with data.eval_path=b.jsonl: the held-out rows come from the file or are held out"),
    pytest.param(["rollout=vllm"], "vLLM is not installed here: install the gpu extra",
                 marks=pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed")),
]


def _refusal(cfg) -> str:
    with pytest.raises(ConfigError) as e:
        prepare(cfg)
    return str(e.value)


@pytest.mark.parametrize("overrides, message", RL_CASES)
def test_bad_values_are_refused_naming_key_value_and_expectation(compose_cfg, overrides, message):
    assert message in _refusal(compose_cfg(*overrides))


def test_the_cases_cover_every_kind_of_check():
    """The table holds unknown keys, ranges, enums, cross-key checks and inputs (guards against a table that
    shrinks to nothing)."""
    kinds = {"unknown key": 0, "expected a number": 0, "expected one of": 0, "with zero.stage": 0,
             "no such local directory": 0}
    for case in RL_CASES:
        message = case.values[1] if hasattr(case, "values") else case[1]
        for kind in kinds:
            kinds[kind] += kind in message
    assert all(kinds.values()) and len(RL_CASES) >= 27, kinds


def test_the_reward_model_loop_checks_its_batch_sizes(compose_cfg):
    msg = _refusal_rm(compose_cfg("recipe=tiny_rm", "train.batch_size=0", "train.lora.dropout=1"))
    assert "train.batch_size=0: expected a number >= 1" in msg and "train.lora.dropout=1.0" in msg


def _refusal_rm(cfg) -> str:
    with pytest.raises(ConfigError) as e:
        prepare(cfg)
    return str(e.value)


def test_wrong_types_are_refused_while_composing(compose_cfg):
    for override, message in (("seed=abc", "Value 'abc' of type 'str' could not be converted to Integer"),
                              ("optim.optimizer.lr=abc", "could not be converted to Float"),
                              ("train.total_step=3", "Key 'total_step' not in 'RLTrainConfig'")):
        with pytest.raises(ConfigCompositionException) as e:
            compose_cfg(override)
        assert message in str(e.value) + str(e.value.__cause__)


def test_every_config_option_matches_its_schema(compose_cfg):
    """Every option of every group composes typed and passes the schema: the YAML files hold only declared keys."""
    from core.paths import CONF_DIR

    count, unset = 0, []
    skip = ("recipe", "debug", "local", "hydra", "eval")  # global diffs, per-machine files, Hydra's own groups,
    # and the presets of recipes.eval (conf/eval.yaml; tests/test_eval.py composes each)
    for group in sorted(p.name for p in CONF_DIR.iterdir() if p.is_dir() and p.name not in skip):
        for option in sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml")):
            loop = ["recipe=tiny_rm"] if option.startswith("pairs") or option in ("rm",) or "_rm" in option else []
            cfg = compose_cfg(*loop, f"{group}={option}")
            assert OmegaConf.get_type(cfg) is schema.Config and dataclasses.is_dataclass(OmegaConf.get_type(cfg[group]))
            problems = check_schema(cfg)
            left_to_user = [e for e in problems if e.endswith("required and not set (???); give "
                                                              f"{e.split(':')[0]}=VALUE")]
            assert problems == left_to_user, (group, option)  # only a free-form value each use sets (weighted terms)
            unset += [f"{group}={option}"] * bool(left_to_user)
            count += 1
    for recipe in sorted(p.stem for p in (CONF_DIR / "recipe").glob("*.yaml")):
        assert check_schema(compose_cfg(f"recipe={recipe}")) == [], recipe
        count += 1
    assert count >= 47 and unset == ["verifier=weighted"], unset  # 47 with the 6 layouts of issue 18


def test_scale_keeps_what_the_command_line_sets(compose_cfg):
    assert apply_scale(compose_cfg("scale=tiny", "train.total_steps=10")).train.total_steps == 2  # the scale's
    cfg = compose_cfg("scale=tiny", "train.total_steps=10", "train.micro_batch_size=7")
    kept = apply_scale(cfg, ("train.total_steps", "train.micro_batch_size", "model"))
    assert kept.train.total_steps == 10 and kept.train.micro_batch_size == 7
    assert kept.model.tiny.hidden_size == 32  # a group choice is not a value the scale keeps
    with pytest.raises(ConfigError, match="train.mini_batch_size=16 is not divisible by train.micro_batch_size"):
        prepare(["scale=tiny", "train.micro_batch_size=7"])  # composed as the CLI does: its keys kept, then checked


def test_a_malformed_jsonl_line_is_named_with_its_file_and_line(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_text(json.dumps({"prompt": "1+1=", "answer": "2"}) + "\n\n" + '{"prompt": "2+2=", "answer": 4\n')
    with pytest.raises(DataError, match=rf"data.path: {path} line 3 is not valid JSON"):
        read_rows(path)
    path.write_text('{"prompt": "1+1="}\n[1, 2]\n')
    with pytest.raises(DataError, match="line 2 is a JSON list, expected an object"):
        read_rows(path)


def test_a_results_dir_that_cannot_be_written_is_refused(compose_cfg, tmp_path):
    (tmp_path / "file").write_text("")
    msg = _refusal(compose_cfg(f"paths.results_dir={tmp_path}/file/results"))
    assert f"paths.results_dir={tmp_path}/file/results: {tmp_path}/file is not a directory" in msg


def test_a_local_model_dir_without_a_model_is_refused(compose_cfg, tmp_path):
    msg = _refusal(compose_cfg(f"model.name_or_path={tmp_path}"))
    assert f"model.name_or_path={tmp_path}: the directory has no config.json" in msg
    prepare(compose_cfg("model.name_or_path=Qwen/Qwen2.5-7B"))  # a hub name is from_pretrained's to judge


def test_a_group_size_of_one_is_fixed_in_one_round_trip(compose_cfg):
    """``train.group_size=1`` (issue 27: three round trips): one refusal names the estimators that take it and batch
    sizes that divide together, and those overrides then pass every check."""
    msg = _refusal(compose_cfg("train.group_size=1"))
    assert "estimators that take 1: advantage=gae, advantage=reinforce_pp" in msg
    fit = "train.mini_batch_size=16 train.micro_batch_size=16"
    assert f"in a world of 1: {fit}" in msg
    prepare(compose_cfg("train.group_size=1", "advantage=reinforce_pp", *fit.split()))


def test_an_out_of_range_key_does_not_hide_the_batch_and_layout_checks(compose_cfg):
    """A schema problem elsewhere in ``train`` or ``layout`` leaves the batch arithmetic checked, in the same list."""
    msg = _refusal(compose_cfg("train.eval_every=-1", "train.mini_batch_size=24", "layout.rollout_gpus=1"))
    assert "train.eval_every=-1: expected a number >= 0" in msg
    assert "not divisible by train.mini_batch_size=24" in msg
    assert "layout.rollout_gpus=1 with layout.mode=colocate" in msg


def test_a_missing_data_file_is_listed_with_the_other_problems(compose_cfg, tmp_path):
    msg = _refusal(compose_cfg("data.source=file", f"data.path={tmp_path}/none.jsonl", "kl.coef=-1"))
    assert f"data.path={tmp_path}/none.jsonl: data file not found" in msg and "kl.coef=-1.0" in msg


def test_an_unreachable_hub_dataset_is_named_briefly(monkeypatch):
    """``datasets.load_dataset`` offline raises ConnectionError from huggingface_hub's own errors: the HubError names
    the dataset, HF_HUB_OFFLINE and the local-file alternative."""
    import datasets
    from huggingface_hub.errors import LocalEntryNotFoundError

    from core.hub import HubError

    def offline(name, *args, **kwargs):
        raise ConnectionError(f"Couldn't reach '{name}' on the Hub (LocalEntryNotFoundError)") from \
            LocalEntryNotFoundError("no network")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    data = OmegaConf.merge(OmegaConf.structured(schema.PromptDataConfig), {"source": "hub", "hub_name": "org/set"})
    with pytest.raises(HubError) as e:
        load_split(data, "train")
    msg = str(e.value)
    assert msg.startswith("data.hub_name=org/set: the dataset could not be read from the Hugging Face Hub")
    assert "HF_HUB_OFFLINE=1" in msg and "data.source=file data.path=PATH" in msg


def test_a_hub_model_that_does_not_exist_is_named_briefly(monkeypatch):
    """transformers wraps huggingface_hub's RepositoryNotFoundError in an OSError: the HubError names the model id and
    a local model dir."""
    import httpx
    import transformers
    from huggingface_hub.errors import RepositoryNotFoundError

    from core.hub import HubError
    from core.models.loading import load_tokenizer

    def missing(path, *args, **kwargs):
        response = httpx.Response(404, request=httpx.Request("GET", f"https://huggingface.co/{path}"))
        try:
            raise RepositoryNotFoundError("404 Repository Not Found", response=response)
        except RepositoryNotFoundError as e:
            raise OSError(f"{path} is not a local folder and is not a valid model identifier") from e

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", missing)
    with pytest.raises(HubError) as e:
        load_tokenizer("org/no-such-model")
    assert str(e.value).startswith("model.name_or_path=org/no-such-model: no model of that id on the Hugging Face Hub")
    assert "model.name_or_path=DIR (a local model dir" in str(e.value)


def test_a_file_without_a_held_out_file_splits_off_the_same_rows_for_every_seed(compose_cfg, tmp_path):
    """``data.eval_holdout``: rows of the training file held out (a count or a fraction), disjoint from the
    training rows, the same whichever ``seed`` trains; too many held out is refused naming the key."""
    path = tmp_path / "mine.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"{i}+1=", "answer": str(i + 1)}) + "\n" for i in range(40)))
    base = ["data.source=file", f"data.path={path}"]
    cfg = prepare(compose_cfg(*base, "data.eval_holdout=0.25")).config
    train, held = load_split(cfg.data, "train"), load_split(cfg.data, "eval")
    assert (len(train), len(held)) == (30, 10)
    assert not {r["prompt"] for r in train} & {r["prompt"] for r in held}
    other_seed = prepare(compose_cfg(*base, "data.eval_holdout=10", "seed=7")).config
    assert load_split(other_seed.data, "eval") == held
    with pytest.raises(DataError, match="data.eval_holdout=40: holds out 40 of the 40 training rows"):
        load_split(prepare(compose_cfg(*base, "data.eval_holdout=40")).config.data, "eval")


def test_weighted_rewards_are_a_group_option_set_without_plus(compose_cfg):
    """``verifier=weighted`` with its terms typed as a plain override (no ``+``, which a key absent from the config
    needs), as docs/byo.md writes it."""
    cfg = prepare(compose_cfg("verifier=weighted", "verifier.kwargs.terms=[{name: math}, {name: format, weight: 0.1}]"))
    assert cfg.config.verifier.name == "weighted"
    assert [t["name"] for t in cfg.config.verifier.kwargs.terms] == ["math", "format"]
