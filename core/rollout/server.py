"""vLLM on GPUs of its own (``rollout.engine=vllm_server``, ``layout.mode=dedicated``): TRL 1.16's server mode.

Each engine of the layout (``layout.rollout_gpus / rollout.vllm.tensor_parallel_size``) is one ``vllm serve``,
started by launch/slurm.sbatch with the flags TRL's deprecated ``trl vllm-serve`` wrapper imposes
(``trl/scripts/vllm_serve.py`` ``build_command``: NCCL weight transfer, processed log-probs, dev-mode endpoints).
One server per engine rather than one server with ``--data-parallel-size``: TRL 1.16 refuses data parallelism
above 1 for dense models (vllm-project/vllm PR #30739), and Open-Instruct runs one vLLM actor per engine too.
Rank 0 drives every server through TRL's own client (``trl.generation.vllm_client.VLLMClient``, or the class
``rollout.server.client`` names), as TRL's ``VLLMGeneration`` does in server mode
(``trl/generation/vllm_generation.py``):

- generation: every rank's prompts are gathered (TRL: ``gather_object``), rank 0 splits them into contiguous
  even shares, one per engine, and sends each to its server at the same time (``/v1/completions``, prompts as
  token ids, one completion each: groups are repeated prompts, and prefix caching shares their prefill), then
  every rank receives the completions and keeps its own (TRL: ``broadcast_object_list`` + ``process_slice``).
  :meth:`start_generate` returns before the servers answer (generation one step ahead); the other members
  of the rollout contract are in core/rollout/__init__.py.
- weights (:meth:`sync_weights`): the names, dtypes and full shapes are read once, without a gather (TRL
  ``_weight_metadata``; ZeRO-3's ``ds_shape``); each push walks ``engine.named_full_parameters()`` once (under
  ZeRO-3 one parameter gathered at a time, on every rank) and rank 0 hands each gathered tensor to every engine's
  client before the walk releases it (:func:`fan_out`): each client runs ``VLLMClient.update_named_params``
  (start, update request, the packed broadcast of ``vllm.distributed.weight_transfer`` over its own NCCL group,
  finish: TRL's request order) in a thread of its own, then every server resets its prefix cache. So a
  parameter is gathered once per push, not once per engine; at ZeRO stages 0-2 a walk gathers nothing.

Sampling is not seeded per request: one seed for a request would give every repeated prompt of a group the
same completion. The servers' own ``--seed`` (``rollout.vllm.seed``) seeds them; as in TRL, server-mode
rollouts do not repeat bit for bit.

How far exercised (docs/vllm.md): on CPU, 2 learner ranks over gloo against a stand-in server
(``tests/vllm_server_double.py``) that speaks the same HTTP protocol, driven by TRL's real ``VLLMClient`` with
its NCCL rendezvous and broadcast swapped for gloo. Real vLLM servers and NCCL have not run it.
"""
from __future__ import annotations

import queue
import threading
from concurrent.futures import Future, ThreadPoolExecutor

import torch.distributed as dist
from hydra.utils import get_class

from core.rollout.batch import RolloutBatch, Sampling, eos_token_ids, from_token_lists
from core.training import distributed


def server_urls(server_cfg) -> list[str]:
    """Engine ``j`` answers at ``http://hosts[j]:port+j`` (``rollout.server``)."""
    return [f"http://{host}:{int(server_cfg.port) + j}" for j, host in enumerate(server_cfg.hosts)]


def even_shares(n: int, parts: int) -> list[slice]:
    """``parts`` contiguous slices of ``range(n)`` whose sizes differ by at most one, the larger first."""
    q, r = divmod(n, parts)
    bounds = [0]
    for j in range(parts):
        bounds.append(bounds[-1] + q + (j < r))
    return [slice(a, b) for a, b in zip(bounds, bounds[1:])]


class ServerRollout:
    """Rank 0's clients of the ``rollout.server`` engines; every rank calls every member."""

    gathers_policy = False  # the servers generate from their own copy of the weights
    keeps_weights = True  # pushed weights stay until the next push: an unchanged policy is not pushed again
    collective = True  # generate gathers every rank's prompts: every rank calls it, with a stand-in if it has none

    def __init__(self, model, tokenizer, cfg):
        server = cfg.server
        self.urls = server_urls(server)
        self.tokenizer, self.eos_ids = tokenizer, eos_token_ids(tokenizer, model, cfg.stop_token_ids)
        self.device = next(model.parameters()).device
        self.clients: list = []  # rank 0's, one per engine; empty elsewhere
        if distributed.is_main():
            client_cls = get_class(str(server.client))
            for j, url in enumerate(self.urls):
                try:
                    client = client_cls(base_url=url, group_port=int(server.group_port) + j,
                                        connection_timeout=float(server.timeout_s))
                except OSError as e:  # requests' ConnectionError (TRL's check_server) is an OSError
                    raise ConnectionError(f"no vLLM server answered at {url}/health within rollout.server.timeout_s="
                                          f"{server.timeout_s} s (engine {j} of rollout.server.hosts): {e}") from e
                bound_requests(client.session, float(server.request_timeout_s))
                client.init_communicator(device=self.device)  # joins the server's weight group as its rank 0
                self.clients.append(client)
        self._metadata: list | None = None
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="vllm-server") if self.clients else None
        self._pending: PendingGeneration | None = None

    def sync_weights(self, engine) -> None:
        """Stream the optimiser engine's current weights to every server. Collective under ZeRO-3."""
        if self._pending is not None:
            raise RuntimeError("a generation is pending on the vLLM server(s): take its result() before pushing "
                               "weights, or it would finish on the new ones")
        if self._metadata is None:  # as TRL: the servers must know every tensor before the first is broadcast
            self._metadata = [(name, str(p.dtype).removeprefix("torch."), list(getattr(p, "ds_shape", p.shape)))
                              for name, p in engine.module.named_parameters()]  # ZeRO-3: the full shape, no gather
        params = engine.named_full_parameters()  # one walk for every engine (gathers are collective)
        if self.clients:
            fan_out(params, [lambda it, c=c, u=u: naming(u, c.update_named_params, self._metadata, it)
                             for c, u in zip(self.clients, self.urls)])
        else:
            for _ in params:  # take part in the gathers
                pass
        for client, url in zip(self.clients, self.urls):
            naming(url, client.reset_prefix_cache)  # cached prefixes were computed with the old weights

    def generate(self, prompts: list[list[int]], sampling: Sampling) -> RolloutBatch:
        return self.start_generate(prompts, sampling).result()

    def start_generate(self, prompts: list[list[int]], sampling: Sampling) -> "PendingGeneration":
        """Send every rank's ``prompts`` to the servers and return at once; ``result()`` (on every rank) waits."""
        if self._pending is not None:
            raise RuntimeError("a generation is already pending on the vLLM server(s): take its result() first")
        parts: list = [prompts]
        if distributed.world() > 1:
            parts = [None] * distributed.world()
            dist.all_gather_object(parts, prompts)
        start = sum(len(p) for p in parts[:distributed.rank()])
        future = self._pool.submit(self._generate_all, [p for part in parts for p in part], sampling) \
            if self.clients else None
        self._pending = PendingGeneration(self, future, prompts, start)
        return self._pending

    def _generate_all(self, prompts: list[list[int]], sampling: Sampling) -> tuple[list, list]:
        """Rank 0: every prompt's completion token ids and their log-probs, the prompts split over the engines."""
        greedy = sampling.temperature <= 0
        kwargs = dict(n=1, temperature=0.0 if greedy else sampling.temperature,
                      top_p=1.0 if greedy else sampling.top_p, top_k=0 if greedy else max(sampling.top_k, 0),
                      max_tokens=sampling.max_new_tokens, logprobs=0 if sampling.logprobs else None,
                      generation_kwargs={"stop_token_ids": self.eos_ids, "skip_special_tokens": False})
        splits = even_shares(len(prompts), len(self.clients))
        shares = [(c, url, share) for c, url, share in zip(self.clients, self.urls, splits) if share.stop > share.start]
        with ThreadPoolExecutor(max_workers=len(shares)) as pool:
            outs = list(pool.map(lambda cus: naming(cus[1], cus[0].generate, prompts[cus[2]], **kwargs), shares))
        resp = [ids for out in outs for ids in out["completion_ids"]]
        if not sampling.logprobs:  # not asked for: the batch's are None
            return resp, None
        lps = [_sampled_logprobs(seq_ids, seq_lps, r) for out in outs
               for seq_ids, seq_lps, r in zip(out["logprob_token_ids"], out["logprobs"], out["completion_ids"])]
        return resp, lps


class GenerationServerError(RuntimeError):
    """A generation server that stopped answering mid-run: the message names it and says what to do."""


def naming(url: str, call, *args, **kwargs):
    """``call(*args, **kwargs)`` on the client of the server at ``url``; a failure (refused, timed out, an error
    answer) is re-raised as :class:`GenerationServerError` naming the server and what to do."""
    try:
        return call(*args, **kwargs)
    except Exception as e:  # noqa: BLE001 (requests' errors, TRL's bare Exception for a non-200 answer)
        raise GenerationServerError(
            f"the generation server at {url} failed mid-run ({type(e).__name__}: {e}). It died, hung past "
            f"rollout.server.request_timeout_s, or answered an error: check its log (launch/slurm.sbatch starts one "
            f"`vllm serve` per engine), restart it, then continue the run with hydra.run.dir=<its run dir> "
            f"resume=auto (from the newest checkpoint: train.checkpoint_every)") from e


def bound_requests(session, timeout_s: float) -> None:
    """Give every request of a ``requests`` session (TRL's ``VLLMClient.session``) a timeout of ``timeout_s``
    seconds unless it names one, and re-send none that timed out while reading (TRL's ``Retry(read=5)`` would post
    a timed-out generation six times); refused connections and 500/502/503 keep TRL's retries (5 and 3, backoff
    0, 4, 8, 16, 32 s: a dead server fails a request in about a minute)."""
    for prefix in ("http://", "https://"):
        adapter = session.get_adapter(prefix)
        adapter.max_retries = adapter.max_retries.new(read=0)
    request = session.request

    def timed(method, url, **kwargs):
        kwargs.setdefault("timeout", timeout_s)
        return request(method, url, **kwargs)

    session.request = timed


def fan_out(items, consumers: list) -> None:
    """Feed one iterator to several consumers (callables that each drain an iterator), each in a thread of its
    own, in lock step: item ``i`` goes to one consumer after another, and the walk takes item ``i + 1`` (a ZeRO-3
    walk releases parameter ``i`` then) only once every consumer has asked for its next item, i.e. is done with
    item ``i`` (vLLM's packed producer has copied it into its buffer or broadcast it). One consumer at a time
    holds a new item, so one NCCL group at a time is fed. A consumer's exception is raised here; the others are
    then left to their servers' timeouts (a server waits for the tensors it was announced)."""
    end, n = object(), len(consumers)
    slots, taken = [queue.Queue() for _ in range(n)], [threading.Semaphore(0) for _ in range(n)]
    errors, ended = [None] * n, [False] * n

    def stream(j):
        while (item := slots[j].get()) is not end:
            yield item
            taken[j].release()  # the consumer asked for the next one: done with this item

    def run(j):
        try:
            consumers[j](stream(j))
        except BaseException as e:  # noqa: BLE001 (raised in the walking thread)
            errors[j] = e
        finally:
            ended[j] = True
            taken[j].release()  # a consumer that ended holding an item never blocks the walk

    threads = [threading.Thread(target=run, args=(j,), daemon=True, name=f"weight-push-{j}") for j in range(n)]
    for t in threads:
        t.start()
    for item in items:
        for j in range(n):
            if not ended[j]:
                slots[j].put(item)
                taken[j].acquire()
            if errors[j] is not None:
                for slot in slots:
                    slot.put(end)
                raise errors[j]
    for j in range(n):
        slots[j].put(end)
    for t in threads:
        t.join()
    for e in errors:
        if e is not None:
            raise e


class PendingGeneration:
    """A generation sent to the servers; :meth:`result` (called on every rank) is this rank's rollout."""

    def __init__(self, rollout: ServerRollout, future: Future | None, prompts: list[list[int]], start: int):
        self.rollout, self.future, self.prompts, self.start = rollout, future, prompts, start
        self._batch: RolloutBatch | None = None

    def result(self) -> RolloutBatch:
        if self._batch is not None:
            return self._batch
        payload = None
        if self.future is not None:  # rank 0: a failure reaches every rank, not only the one that saw it
            try:
                payload = ("ok", self.future.result())
            except GenerationServerError as e:  # re-raised on every rank below
                payload = ("error", str(e))
            except Exception as e:  # noqa: BLE001 (re-raised on every rank below)
                payload = ("error", f"generation on the vLLM server(s) {', '.join(self.rollout.urls)} failed: "
                                    f"{type(e).__name__}: {e}")
        payload = distributed.broadcast_object(payload)
        self.rollout._pending = None
        if payload[0] == "error":
            raise GenerationServerError(payload[1])
        resp, lps = payload[1]
        mine = slice(self.start, self.start + len(self.prompts))
        r = self.rollout
        self._batch = from_token_lists(self.prompts, resp[mine], None if lps is None else lps[mine], r.eos_ids,
                                       r.tokenizer.pad_token_id, r.device)
        return self._batch


def _sampled_logprobs(token_ids: list[list[int]], logprobs: list[list[float]], completion: list[int]) -> list[float]:
    """The sampled token's log-prob at each step, from the client's per-step ``(ids, log-probs)`` lists (TRL
    ``parse_logprobs``: the sampled token is always among them)."""
    picked = (lps[ids.index(tok)] for ids, lps, tok in zip(token_ids, logprobs, completion))
    return [float("nan") if lp is None else float(lp) for lp in picked]  # None: the server's NaN
