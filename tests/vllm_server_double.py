"""A test double of a ``vllm serve`` generation server, and TRL's client made to reach it on a CPU.

**The server** (``python -m tests.vllm_server_double MODEL_DIR --port P``) answers the endpoints TRL 1.16's
``VLLMClient`` calls on a real ``vllm serve`` (``trl/generation/vllm_client.py``): ``/health``, ``/v1/models``,
``/server_info``, ``/get_world_size``, ``/init_weight_transfer_engine``, ``/start_weight_update``,
``/update_weights``, ``/finish_weight_update``, ``/reset_prefix_cache`` and ``/v1/completions`` (token-id
prompts; ``token_ids`` and completions-format log-probs in the answer). It generates with a Hugging Face copy of
the model, one prompt at a time, token by token: greedy at temperature 0, else sampled from
``softmax(logits / T)`` (top-p 1 and top-k off are all it supports, and it refuses others), the log-prob
reported being that of the sampled token under ``log_softmax(logits / T)`` (vLLM's ``processed_logprobs``), and none
when the request asks for none (``logprobs: null``, as vLLM answers); it stops on ``stop_token_ids``, keeping the
stop token, as vLLM does. Weights arrive tensor by tensor over a gloo group in place of vLLM's NCCL weight-transfer
group and are copied into the model by name. What it saw is answered at ``/debug/state``: pushes, update events,
prompts generated (and how many without log-probs), and a SHA-256 of every weight.

**The client** :class:`GlooVLLMClient` is TRL's ``VLLMClient`` itself with two pieces swapped, the ones that
need vLLM and CUDA: ``init_communicator`` opens a gloo group (TRL's opens vLLM's NCCL trainer endpoint, on CUDA
only), and the packed NCCL broadcast of ``update_named_params`` is a gloo broadcast per tensor. Everything else
(health check, HTTP payloads, log-prob parsing, the weight-update request order) is TRL's code.
"""
from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import threading
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from unittest import mock

import torch
import torch.distributed as dist

TIMEOUT = datetime.timedelta(seconds=120)


def _gloo_group(init_info: dict, rank: int):
    store = dist.TCPStore(init_info["master_address"], int(init_info["master_port"]), int(init_info["world_size"]),
                          is_master=rank == 0, timeout=TIMEOUT)
    return dist.ProcessGroupGloo(store, rank, int(init_info["world_size"]), TIMEOUT)


def digest(t: torch.Tensor) -> str:
    return hashlib.sha256(t.detach().cpu().contiguous().numpy().tobytes()).hexdigest()


# --------------------------------------------------------------------------------------------- client side
def _trl_client():
    from trl.generation import vllm_client

    return vllm_client


class _Endpoint:
    """What TRL keeps as ``communicator``: it reads ``.group`` (here the gloo group itself)."""

    def __init__(self, group):
        self.group = group


def _gloo_producer(iterator, group, src, post_iter_func, **_):
    """In place of vLLM's ``packed_nccl_broadcast_producer`` (``group``: TRL's communicator): each tensor
    broadcast as it comes, in order."""
    for item in iterator:
        group.group.broadcast(post_iter_func(item).contiguous(), src).wait()


class GlooVLLMClient(_trl_client().VLLMClient):
    """TRL's ``VLLMClient`` with its weight-transfer group over gloo (a CPU test double: see the module doc)."""

    # Several clients stream at once, each from its own thread (core/rollout/server.py fan_out): TRL's module is
    # patched while any of them streams, on with the first and off with the last (nested mock.patch contexts
    # ended in another order would put the real producer back under a client still streaming).
    _patch_lock, _patch_users, _patch = threading.Lock(), 0, None

    def __init__(self, *args, **kwargs):
        with mock.patch.object(_trl_client(), "is_vllm_available", return_value=True):  # vLLM is not installed
            super().__init__(*args, **kwargs)

    def init_communicator(self, device=0):
        """TRL's, with its CUDA-only NCCL rendezvous replaced by a gloo one (same request, same concurrency)."""
        if self.get_server_info()["weight_transfer_config"] is None:
            raise RuntimeError(f"the server at {self.base_url} has no weight-transfer engine")
        init_info = {"master_address": "127.0.0.1", "master_port": self.group_port, "rank_offset": 1,
                     "world_size": self.get_world_size() + 1, "packed": True}
        with ThreadPoolExecutor(max_workers=1) as executor:
            future = executor.submit(self._post, f"{self.base_url}/init_weight_transfer_engine",
                                     json={"init_info": init_info})
            self.communicator = _Endpoint(_gloo_group(init_info, 0))
            future.result()

    def update_named_params(self, metadata, named_params):
        cls = GlooVLLMClient
        with cls._patch_lock:
            if cls._patch_users == 0:
                cls._patch = mock.patch.multiple(_trl_client(), create=True, _HAS_STATEFUL_TRAINER_ENGINE=True,
                                                 packed_nccl_broadcast_producer=_gloo_producer)
                cls._patch.start()
            cls._patch_users += 1
        try:
            super().update_named_params(metadata, named_params)
        finally:
            with cls._patch_lock:
                cls._patch_users -= 1
                if cls._patch_users == 0:
                    cls._patch.stop()

    def close_communicator(self):
        self.communicator = None


# --------------------------------------------------------------------------------------------- server side
class DoubleServer:
    def __init__(self, model_dir: str, seed: int):
        from transformers import AutoModelForCausalLM

        self.model_dir = model_dir
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32).eval()
        self.params = dict(self.model.named_parameters())
        self.gen = torch.Generator().manual_seed(seed)
        self.lock = threading.Lock()  # one generation or weight update at a time
        self.group = None
        self.events: list[str] = []
        self.pushes = 0
        self.prompts = 0
        self.bare = 0  # prompts generated without log-probs asked for

    def init_weights(self, init_info: dict) -> dict:
        self.group = _gloo_group(init_info, int(init_info["rank_offset"]))
        self.events.append("init")
        return {}

    def update_weights(self, update_info: dict) -> dict:
        with self.lock, torch.no_grad():
            for name, dtype, shape in zip(update_info["names"], update_info["dtype_names"], update_info["shapes"]):
                t = torch.empty(shape, dtype=getattr(torch, dtype))
                self.group.broadcast(t, 0).wait()
                if name not in self.params:
                    raise KeyError(f"pushed weight {name!r} is not a parameter of the served model")
                self.params[name].copy_(t)
        self.pushes += 1
        self.events.append("update")
        return {}

    def complete(self, body: dict) -> dict:
        if float(body.get("top_p", 1.0)) != 1.0 or int(body.get("top_k", 0)) > 0 or int(body.get("n", 1)) != 1:
            raise ValueError("the double supports top_p=1, top_k off and n=1 only")
        stops = set(body.get("stop_token_ids") or [])
        with self.lock, torch.no_grad():
            choices = [self._one(list(p), float(body["temperature"]), int(body["max_tokens"]), stops)
                       for p in body["prompt"]]
        if body.get("logprobs") is None:  # not asked for: vLLM's completions answer has none
            choices = [{**c, "logprobs": None} for c in choices]
            self.bare += len(choices)
        self.prompts += len(choices)
        return {"choices": choices}

    def _one(self, prompt: list[int], temperature: float, max_tokens: int, stops: set) -> dict:
        ids, out, lps = list(prompt), [], []
        for _ in range(max_tokens):
            logits = self.model(torch.tensor([ids])).logits[0, -1].float()  # [V]
            if temperature <= 0:
                logp = torch.log_softmax(logits, -1)
                tok = int(logits.argmax())
            else:
                logp = torch.log_softmax(logits / temperature, -1)
                tok = int(torch.multinomial(logp.exp(), 1, generator=self.gen))
            ids.append(tok)
            out.append(tok)
            lps.append(float(logp[tok]))
            if tok in stops:
                break
        return {"prompt_token_ids": prompt, "token_ids": out, "finish_reason": "stop" if out[-1] in stops else "length",
                "logprobs": {"tokens": [f"token_id:{t}" for t in out], "token_logprobs": lps,
                             "top_logprobs": [{} for _ in out]}}

    def state(self) -> dict:
        return {"pushes": self.pushes, "prompts": self.prompts, "bare": self.bare, "events": self.events,
                "weights": {name: digest(p) for name, p in self.params.items()}}


def handler(server: DoubleServer):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):  # quiet
            pass

        def _send(self, obj: dict, code: int = 200):
            body = json.dumps(obj).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            path = self.path.split("?")[0]
            answers = {"/health": lambda: {}, "/v1/models": lambda: {"data": [{"id": server.model_dir}]},
                       "/server_info": lambda: {"vllm_config": {"weight_transfer_config": {"backend": "gloo"}}},
                       "/get_world_size": lambda: {"world_size": 1}, "/debug/state": server.state}
            if path not in answers:
                return self._send({"error": f"no GET {path}"}, 404)
            self._send(answers[path]())

        def do_POST(self):
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length) or b"{}")
            routes = {"/init_weight_transfer_engine": lambda: server.init_weights(body["init_info"]),
                      "/update_weights": lambda: server.update_weights(body["update_info"]),
                      "/start_weight_update": lambda: server.events.append("start") or {},
                      "/finish_weight_update": lambda: server.events.append("finish") or {},
                      "/reset_prefix_cache": lambda: server.events.append("reset") or {"success": True},
                      "/v1/completions": lambda: server.complete(body)}
            if self.path not in routes:
                return self._send({"error": f"no POST {self.path}"}, 404)
            try:
                self._send(routes[self.path]())
            except Exception as e:  # noqa: BLE001 (the client sees it as the real server's 400)
                self._send({"error": f"{type(e).__name__}: {e}"}, 400)

    return Handler


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_dir")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    ThreadingHTTPServer(("127.0.0.1", args.port), handler(DoubleServer(args.model_dir, args.seed))).serve_forever()


if __name__ == "__main__":
    main()
