"""Data parallelism: one process per rank under ``torchrun``, a world of one otherwise.

The loops call :func:`init` first; every helper here is a no-op (or the identity) in a world of one,
so a single-process run takes exactly the code path it took before data parallelism existed. Under
``torchrun`` the process group comes up from the launcher's environment (``env://``). On GPUs it is one
group with two backends, ``cpu:gloo,cuda:nccl``: collectives on CUDA tensors (gradients, DeepSpeed's,
the loss normalisers) run over NCCL, and those on CPU tensors (logged metrics, objects) over gloo, so
no helper has to move a tensor to reduce it. On the CPU it is gloo alone
(``torchrun --standalone --nproc_per_node 2 -m recipes.run device=cpu``).
"""
from __future__ import annotations

import ipaddress
import os
import re
import socket
import subprocess
from datetime import timedelta

import torch
import torch.distributed as dist

from core.errors import InputError


class GlooAddressError(InputError):
    """A multi-node world whose gloo group would bind to a loopback address (:func:`check_gloo_address`)."""


def init(device: torch.device, timeout_s: float | None = None) -> tuple[int, int]:
    """Bind this process to ``device``, start the process group when launched with ``WORLD_SIZE > 1``;
    return ``(rank, world)``. DeepSpeed picks its accelerator when first imported: on the CPU it is told.
    ``timeout_s`` (config ``collective_timeout_s``; None: torch's default) bounds every collective of the group: a
    rank that waits longer for a peer fails (docs/reliability.md "A dead rank")."""
    if device.type == "cpu":
        os.environ["DS_ACCELERATOR"] = "cpu"
    else:
        torch.cuda.set_device(device)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not dist.is_initialized():
        check_gloo_address()
        timeout = timedelta(seconds=timeout_s) if timeout_s is not None else None
        backend = "cpu:gloo,cuda:nccl" if device.type == "cuda" else "gloo"
        store = _attempt_store(timeout or dist.default_pg_timeout)
        if store is None:
            dist.init_process_group(backend, timeout=timeout)
        else:
            env = os.environ
            dist.init_process_group(backend, store=store, rank=int(env["RANK"]), world_size=int(env["WORLD_SIZE"]),
                                    timeout=timeout)
    return rank(), world()


def gloo_default_address(host: str) -> str | None:
    """The address gloo binds to when ``GLOO_SOCKET_IFNAME`` is unset: the first address ``host`` resolves to (any
    family, stream sockets) that a socket can bind, or None, where gloo falls back to 127.0.0.1 (torch
    ``ProcessGroupGloo::createDefaultDevice`` and ``doesHostnameResolveToUsableAddress``, c10d)."""
    try:
        found = socket.getaddrinfo(host, None, socket.AF_UNSPEC, socket.SOCK_STREAM)
    except socket.gaierror:
        return None
    for family, kind, proto, _, address in found:
        try:
            with socket.socket(family, kind, proto) as sock:
                sock.bind(address)
        except OSError:
            continue
        return address[0]
    return None


def check_gloo_address() -> None:
    """Refuse a multi-node world (``LOCAL_WORLD_SIZE < WORLD_SIZE``, as torchrun and submitit export them) whose gloo
    group would bind to a loopback address: with ``GLOO_SOCKET_IFNAME`` unset gloo binds to this host's name's address
    (:func:`gloo_default_address`) and advertises it to every rank, and a node whose /etc/hosts maps its name to
    127.0.1.1 (Debian's default) gives the others an address they cannot reach: the first metric or object collective
    hangs until the timeout. Every helper here that reduces on the CPU runs over gloo, also beside NCCL."""
    env = os.environ
    world, local = int(env.get("WORLD_SIZE", "1")), int(env.get("LOCAL_WORLD_SIZE") or 0)
    if not 0 < local < world or env.get("GLOO_SOCKET_IFNAME"):
        return
    host = socket.gethostname()
    address = gloo_default_address(host)
    if address is not None and not ipaddress.ip_address(address.split("%")[0]).is_loopback:
        return
    resolved = f"resolves to {address}, a loopback address" if address else "resolves to no address it can bind"
    master = env.get("MASTER_ADDR", "the first node")
    via = route_interface(_ipv4(master)) if master != host else None
    hint = f"; here the route to MASTER_ADDR={master} leaves through {via}: GLOO_SOCKET_IFNAME={via}" if via else ""
    raise GlooAddressError(
        f"this node's name {host!r} {resolved} and GLOO_SOCKET_IFNAME is not set: gloo, which carries every metric "
        f"and object collective, would bind to {address or '127.0.0.1'} and the ranks on the other nodes of this "
        f"{world}-rank world ({local} per node) could not reach it. Set GLOO_SOCKET_IFNAME to the network interface "
        f"of this node that reaches the others (the one `ip route get <another node's address>` names{hint}), as "
        f"launch/slurm.sbatch and the submitit launcher do, or map the name to that address in /etc/hosts")


def _ipv4(host: str) -> str | None:
    """``host``'s first IPv4 address, as ``getent ahostsv4`` gives it, or None."""
    try:
        return socket.getaddrinfo(host, None, socket.AF_INET, socket.SOCK_STREAM)[0][4][0]
    except (socket.gaierror, IndexError):
        return None


def route_interface(address: str | None) -> str | None:
    """The network interface this host sends to ``address`` through (``ip -o route get``, iproute2), or None where
    that cannot be told (no address, no ``ip``, no route) or it is the loopback one (``address`` is this host's own)."""
    if not address:
        return None
    try:
        out = subprocess.run(["ip", "-o", "route", "get", address], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    dev = re.search(r"\bdev (\S+)", out)
    return dev.group(1) if dev and dev.group(1) != "lo" else None


def peer_interface(peer: str) -> str | None:
    """The interface that reaches node ``peer`` from here (its IPv4 address's route), or None: what
    ``GLOO_SOCKET_IFNAME`` names on a node of a multi-node job (core/launch.py, launch/slurm.sbatch)."""
    return route_interface(_ipv4(peer))


def _attempt_store(timeout: timedelta):
    """Under torchrun, the agent's store with keys of this attempt only (``TORCHELASTIC_RESTART_COUNT``), else None
    (``env://``). torch 2.13's c10d rendezvous keeps one store server across restarts, and ``env://`` connects the
    workers to it without a per-attempt prefix (torch/distributed/rendezvous.py ``_create_c10d_store``: "We create
    a new TCPStore for every retry", no longer so), so a restarted group read the dead group's addresses and failed
    to connect (docs/reliability.md "A dead rank")."""
    env = os.environ
    if env.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    store = dist.TCPStore(env["MASTER_ADDR"], int(env["MASTER_PORT"]), is_master=False, timeout=timeout)
    return dist.PrefixStore(f"rlrecipes/attempt_{env.get('TORCHELASTIC_RESTART_COUNT', '0')}", store)


def world() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def is_main() -> bool:
    return rank() == 0


def barrier() -> None:
    if world() > 1:
        dist.barrier()


def all_sum(x: torch.Tensor) -> torch.Tensor:
    """Sum of ``x`` over ranks (in place, returned)."""
    if world() > 1:
        dist.all_reduce(x)
    return x


def all_max(x: torch.Tensor) -> torch.Tensor:
    """Element-wise maximum of ``x`` over ranks (in place, returned)."""
    if world() > 1:
        dist.all_reduce(x, op=dist.ReduceOp.MAX)
    return x


def gather_rows(x: torch.Tensor) -> torch.Tensor:
    """Concatenate every rank's ``x [n, ...]`` along dim 0 in rank order (equal ``n`` on every rank)."""
    if world() == 1:
        return x
    parts = [torch.empty_like(x) for _ in range(world())]
    dist.all_gather(parts, x.contiguous())
    return torch.cat(parts)


def own_rows(total: int) -> slice:
    """This rank's contiguous, equal share of a step's ``total`` rows (TRL 1.16 ``grpo_trainer.py``
    ``process_slice``): rank ``r`` of ``w`` holds rows ``[r total/w, (r+1) total/w)``, so :func:`gather_rows`
    of the shares gives the rows back in order. ``total`` divides by the world (``core/config/validate.py``)."""
    if total % world():
        raise ValueError(f"{total} rows do not split evenly over {world()} ranks")
    n = total // world()
    return slice(rank() * n, (rank() + 1) * n)


def broadcast_object(obj):
    """Rank 0's ``obj`` on every rank (a run directory, a config-derived string)."""
    if world() == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def gather_objects(obj) -> list:
    """Every rank's ``obj`` (picklable), in rank order, on every rank."""
    if world() == 1:
        return [obj]
    out = [None] * world()
    dist.all_gather_object(out, obj)
    return out


def launch_agreed(key: str, value: str) -> str:
    """Rank 0's ``value`` on every rank of a ``torchrun`` launch, before any process group exists (Hydra resolves
    the run dir first): shared through the store torchrun's agent hosts at MASTER_ADDR:MASTER_PORT, the one
    ``init_process_group`` later joins (torch/distributed/rendezvous.py ``_create_c10d_store``). Outside torchrun,
    or in a world of one, ``value`` itself. Keyed by the restart count: a restarted worker group agrees afresh."""
    env = os.environ
    if env.get("TORCHELASTIC_USE_AGENT_STORE") != "True" or int(env.get("WORLD_SIZE", "1")) < 2:
        return value
    store = dist.TCPStore(env["MASTER_ADDR"], int(env["MASTER_PORT"]), is_master=False,
                          timeout=timedelta(minutes=10))  # rank 0 may still be importing
    key = f"rlrecipes/{key}/{env.get('TORCHELASTIC_RESTART_COUNT', '0')}"
    if int(env["RANK"]) == 0:
        store.set(key, value)
    return store.get(key).decode()


def mean_metrics(metrics: dict[str, float], peaks: dict[str, float] | None = None) -> dict[str, float]:
    """Per-rank scalar ``metrics`` averaged over ranks, and ``peaks`` (a step's peak memory) their maximum over ranks,
    the figure that must fit on every GPU; every rank must hold the same keys. One collective on the CPU: an
    all-reduce of the sums, or, with ``peaks``, an all-gather of the ``[K]`` values that gives both."""
    peaks = peaks or {}
    if world() == 1 or not (metrics or peaks):
        return {**metrics, **peaks}
    keys, top = sorted(metrics), sorted(peaks)
    vals = torch.tensor([float(metrics[k]) for k in keys] + [float(peaks[k]) for k in top], dtype=torch.float64)
    if not top:
        return dict(zip(keys, (all_sum(vals) / world()).tolist()))
    every = gather_rows(vals[None])  # [W, K]
    return {**dict(zip(keys, every[:, :len(keys)].mean(0).tolist())),
            **dict(zip(top, every[:, len(keys):].amax(0).tolist()))}


def start_alone(backend: str) -> None:
    """A process group of this process alone (rank 0 of 1) for a library that needs one (DeepSpeed outside a
    launcher), on an in-memory store (``HashStore``): no TCP port to collide with another job on the node or another
    run in this process, and no address or port written into the environment, where child processes would inherit
    it. :func:`shutdown` ends it with the run (core/training/lifecycle.py)."""
    dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)


def shutdown() -> None:
    """End the process group (DeepSpeed's references to its groups with it, when DeepSpeed made some), so a next run
    in this process starts its own."""
    if not (dist.is_available() and dist.is_initialized()):
        return
    import sys

    ds_comm = sys.modules.get("deepspeed.comm.comm")  # its global ``cdb``: the backend DeepSpeed built, if any
    if ds_comm is not None and ds_comm.cdb is not None:
        ds_comm.destroy_process_group()  # torch's, then DeepSpeed's cached groups (deepspeed/utils/groups.py)
    else:
        dist.destroy_process_group()
