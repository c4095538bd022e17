"""The ``vllm_server`` rollout engine (core/rollout/server.py: vLLM on GPUs of its own, TRL 1.16's server mode) on
the CPU, against a stand-in ``vllm serve`` (``tests/vllm_server_double.py``, a test double) driven by TRL's real
``VLLMClient`` with its NCCL weight group swapped for gloo: the push reaches the server exactly, generation uses the
pushed weights (its log-probs are a forward's of the trainer's current weights, not the old ones), prompts are
split over several engines and come back in order, a push while a generation is pending is refused, an unreachable
server fails naming its URL, and 2 learner ranks over gloo run the whole loop with a dedicated layout."""
from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import torch

from core.config import schema
from core.models.loading import load_causal_lm, load_tokenizer, model_dir
from core.models.logprobs import response_logprobs
from core.paths import PROJECT_ROOT
from core.rollout import Sampling, build_rollout
from core.rollout.server import _sampled_logprobs, even_shares, fan_out, server_urls
from core.training.backend import Backend
from tests.helpers import FAST, TINY, results, run_cli, slow
from tests.vllm_server_double import digest

CLIENT = "tests.vllm_server_double.GlooVLLMClient"
MODEL = schema.node(schema.ModelConfig, name_or_path=None, arch="qwen2", tiny=TINY, init_seed=0, dtype="float32")
OPTIM = schema.node(schema.OptimConfig, {"optimizer": {"_target_": "torch.optim.SGD", "_partial_": True, "lr": 0.5},
                                         "max_grad_norm": 0.0, "scheduler": {"name": "constant"}})
BACKEND = Backend(schema.node(schema.ZeroConfig, stage=0), torch.device("cpu"), torch.float32)  # plain torch, whole models


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def _state(port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/debug/state", timeout=30) as r:
        return json.loads(r.read())


@pytest.fixture(scope="module")
def servers():
    """Two stand-in servers on consecutive ports serving the tiny model: ``(model_dir, base_port)``."""
    path = model_dir(MODEL)
    for _ in range(20):  # two consecutive free ports
        base = _free_ports(1)[0]
        if base < 65000 and _free_ports(1)[0] != base + 1:
            break
    procs = [subprocess.Popen([sys.executable, "-m", "tests.vllm_server_double", path, "--port", str(base + j),
                               "--seed", str(j)], cwd=PROJECT_ROOT, stderr=subprocess.PIPE, text=True)
             for j in range(2)]
    try:
        for j, proc in enumerate(procs):
            deadline = time.monotonic() + 120
            while True:
                try:
                    urllib.request.urlopen(f"http://127.0.0.1:{base + j}/health", timeout=2)
                    break
                except OSError:
                    assert proc.poll() is None, proc.stderr.read()[-2000:]
                    assert time.monotonic() < deadline, "the stand-in server did not start"
                    time.sleep(0.3)
        yield path, base
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def _rollout(model, tok, base: int, engines: int, timeout: float = 60.0):
    group = _free_ports(1)[0]
    cfg = schema.node(schema.RolloutConfig, {"engine": "vllm_server", "server": {
        "hosts": ["127.0.0.1"] * engines, "port": base, "group_port": group, "timeout_s": timeout, "client": CLIENT}})
    return build_rollout("vllm_server", model, tok, cfg)


def test_urls_shares_and_logprob_parsing():
    cfg = schema.node(schema.ServerConfig, {"hosts": ["a", "b", "b"], "port": 9000})
    assert server_urls(cfg) == ["http://a:9000", "http://b:9001", "http://b:9002"]
    assert [(s.start, s.stop) for s in even_shares(7, 3)] == [(0, 3), (3, 5), (5, 7)]
    assert [(s.start, s.stop) for s in even_shares(1, 2)] == [(0, 1), (1, 1)]
    # TRL's parse_logprobs lists each step's ids by probability; the sampled one is picked by id, None is NaN
    lps = _sampled_logprobs([[5, 7], [9]], [[-0.1, -2.0], [None]], [7, 9])
    assert lps[0] == -2.0 and lps[1] != lps[1]


def test_fan_out_hands_each_item_to_every_consumer_before_the_walk_moves_on():
    """One walk, every consumer (each in its own thread) sees each item while the walk still holds it (a ZeRO-3
    walk releases a gathered parameter when it moves on); a consumer's error reaches the caller."""
    held, seen = [], [[], []]

    def walk():
        for i in range(4):
            held.append(i)
            yield i
            held.remove(i)

    def drain(j):
        def consume(items):
            for x in items:
                assert held == [x]
                seen[j].append(x)
        return consume

    fan_out(walk(), [drain(0), drain(1)])
    assert seen == [[0, 1, 2, 3]] * 2 and held == []

    def refused(items):
        next(items)
        raise OSError("the server answered 400")

    with pytest.raises(OSError, match="400"):
        fan_out(walk(), [drain(0), refused])


def test_push_reaches_every_server_exactly_and_generation_uses_the_pushed_weights(servers):
    path, base = servers
    model, tok = load_causal_lm(path, MODEL), load_tokenizer(path)
    roll = _rollout(model, tok, base, engines=2)
    engine = BACKEND.train_engine(model, OPTIM, 10, 1, 4)
    ids = torch.tensor([[25, 26, 27, 28], [29, 30, 31, 32]])
    loss = engine.forward(lambda m, x: m(input_ids=x).logits.logsumexp(-1).mean(), ids)
    engine.backward(loss)
    engine.step()  # the trainer's weights move away from the checkpoint the servers loaded
    before = [_state(base + j) for j in range(2)]
    walks, walk = [], engine.named_full_parameters

    def counted():  # each walk, and the parameters it yielded (under ZeRO-3 each one a gather)
        walks.append(0)
        for item in walk():
            walks[-1] += 1
            yield item

    engine.named_full_parameters = counted
    roll.sync_weights(engine)
    mine = {name: digest(p) for name, p in model.named_parameters()}
    assert walks == [len(mine)]  # one walk, each parameter once, for both engines
    for j in range(2):
        after = _state(base + j)
        assert after["weights"] == mine and before[j]["weights"] != mine
        assert after["pushes"] == before[j]["pushes"] + 1
        assert after["events"][-4:] == ["start", "update", "finish", "reset"]  # TRL's request order
    prompts = [tok(t, add_special_tokens=False)["input_ids"] for t in ["1+2=", "10+20=", "99+1=", "7+7=", "3+4="]]
    batch = roll.generate(prompts, Sampling(max_new_tokens=6, temperature=0.7))
    served = [_state(base + j)["prompts"] - before[j]["prompts"] for j in range(2)]
    assert served == [3, 2]  # contiguous even shares, in order
    assert batch.input_ids.shape[0] == 5 and batch.prompt_length == max(len(p) for p in prompts)
    for i, p in enumerate(prompts):  # each row keeps its own prompt, left-padded
        assert batch.input_ids[i, batch.prompt_length - len(p):batch.prompt_length].tolist() == p
    with torch.no_grad():
        lp, _ = response_logprobs(model, batch.input_ids, batch.attention_mask, batch.prompt_length, 0.7)
    m = batch.response_mask.bool()
    assert int(m.sum()) >= 5
    torch.testing.assert_close(lp[m], batch.logprobs[m], atol=1e-4, rtol=1e-4)  # the pushed weights generated
    bare = roll.generate(prompts, Sampling(max_new_tokens=6, temperature=0.0, logprobs=False))  # none asked for
    assert bare.logprobs is None and [_state(base + j)["bare"] - before[j]["bare"] for j in range(2)] == [3, 2]


def test_a_pending_generation_blocks_a_push_until_its_result_is_taken(servers):
    path, base = servers
    model, tok = load_causal_lm(path, MODEL), load_tokenizer(path)
    roll = _rollout(model, tok, base, engines=1)
    engine = BACKEND.train_engine(model, OPTIM, 10, 1, 4)
    pending = roll.start_generate([[25, 26], [27]], Sampling(max_new_tokens=4, temperature=0.0))
    with pytest.raises(RuntimeError, match="a generation is pending on the vLLM server"):
        roll.sync_weights(engine)
    with pytest.raises(RuntimeError, match="already pending"):
        roll.start_generate([[25]], Sampling(max_new_tokens=4))
    batch = pending.result()
    assert batch.input_ids.shape[0] == 2 and pending.result() is batch
    roll.sync_weights(engine)  # taken: the push goes through


def test_an_unreachable_server_fails_naming_its_url_and_the_timeout_key():
    model, tok = load_causal_lm(model_dir(MODEL), MODEL), load_tokenizer(model_dir(MODEL))
    port = _free_ports(1)[0]
    with pytest.raises(ConnectionError, match=rf"no vLLM server answered at http://127.0.0.1:{port}/health within "
                                              r"rollout.server.timeout_s=0.5 s"):
        _rollout(model, tok, port, engines=1, timeout=0.5)


@pytest.mark.parametrize("ahead", [slow(0), 1])
def test_two_learner_ranks_train_with_a_dedicated_server(servers, tmp_path, ahead):
    """The whole loop on 2 gloo ranks with ``layout=dedicated rollout=vllm_server``, generating in step or one step
    ahead (the server's request in flight while the learners train): it finishes, every step's prompts were
    generated by the server, each policy version was pushed once, the policy lag is as asked, and the server ends
    with exactly the weights the run saved."""
    path, base = servers
    start = _state(base)
    steps, ppstep, G, evals = 2, 4, 4, 8
    proc = run_cli(tmp_path, *FAST, "layout=dedicated", "layout.gpus_per_node=3", "layout.learner_gpus=2",
                   "rollout=vllm_server", "rollout.server.hosts=[127.0.0.1]", f"rollout.server.port={base}",
                   f"rollout.server.group_port={_free_ports(1)[0]}", f"rollout.server.client={CLIENT}",
                   f"model.name_or_path={path}", "train.warm_start.steps=0", "device=cpu",
                   f"rollout.generate_ahead={ahead}", nproc=2, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    (row,) = results(tmp_path)
    assert row["steps"] == steps
    end = _state(base)
    assert end["prompts"] - start["prompts"] == steps * ppstep * G + 2 * evals  # eval before and after
    # eval before (version 0); step 1 generates with version 0 (not pushed again); in step, step 2 generates with
    # version 1; one step ahead, step 2's batch was generated with version 0 during step 1 and version 1 generates
    # nothing; eval after (version 2)
    assert end["pushes"] - start["pushes"] == steps + 1 - ahead
    metrics = [json.loads(line) for line in (Path(row["run_dir"]) / "metrics.jsonl").read_text().splitlines()]
    assert [m["rollout/policy_lag"] for m in metrics if "rollout/policy_lag" in m] == [0, ahead]
    from safetensors.torch import load_file

    saved = load_file(str(Path(row["run_dir"]) / "model" / "model.safetensors"))
    shared = sorted(set(saved) & set(end["weights"]))
    assert len(shared) >= 10 and {k: digest(saved[k]) for k in shared} == {k: end["weights"][k] for k in shared}
