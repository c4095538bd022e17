"""A multi-node world whose gloo group would bind to a loopback address is refused before the group starts
(core/training/distributed.py ``check_gloo_address``, called by ``init``): the node's name resolution is set here;
the binding gloo tries and the decision are the real ones."""
from __future__ import annotations

import os
import socket

import pytest
import torch

from core.training import distributed
from core.training.distributed import GlooAddressError, check_gloo_address

NAMES = {"gpu1": ["10.0.0.1"]}  # the master's name, as this node resolves it


@pytest.fixture
def node(monkeypatch, tmp_path):
    """Task 9 of a 2 x 8 job on node gpu2 (MASTER_ADDR gpu1), no GLOO_SOCKET_IFNAME; ``node(*addresses)`` makes
    gpu2 resolve to those (none: it does not resolve). An ``ip`` double routes 10.0.0.N through ibN."""
    for key, value in {"WORLD_SIZE": "16", "LOCAL_WORLD_SIZE": "8", "RANK": "9", "MASTER_ADDR": "gpu1"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    monkeypatch.setattr(socket, "gethostname", lambda: "gpu2")
    ip = tmp_path / "ip"
    ip.write_text('#!/bin/bash\n[[ "$4" == 10.0.0.* ]] || exit 1\necho "$4 dev ib${4##*.} src 10.0.0.2 uid 0"\n')
    ip.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")

    def resolves(*addresses: str) -> None:
        names = {**NAMES, "gpu2": list(addresses)}

        def getaddrinfo(host, port, family=0, type=0, proto=0, flags=0):
            found = names.get(host)  # IPv4 addresses only, so any family asked gets them
            if not found:
                raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, 0)) for a in found]

        monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    return resolves


def _own_address() -> str | None:
    """This machine's address on its default route (a UDP connect sends nothing), if not a loopback one."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.connect(("192.0.2.123", 9))
            address = sock.getsockname()[0]
    except OSError:
        return None
    return None if address.startswith("127.") else address


@pytest.mark.parametrize("addresses, said", [
    (["127.0.1.1"], "resolves to 127.0.1.1, a loopback address"),  # Debian's /etc/hosts
    (["198.51.100.7", "127.0.1.1"], "resolves to 127.0.1.1, a loopback address"),  # gloo skips what it cannot bind
    ([], "resolves to no address it can bind"),  # gloo falls back to 127.0.0.1
])
def test_a_multi_node_world_on_a_loopback_name_is_refused_naming_the_variable(node, addresses, said):
    node(*addresses)
    with pytest.raises(GlooAddressError) as e:
        check_gloo_address()
    msg = str(e.value)
    assert f"this node's name 'gpu2' {said} and GLOO_SOCKET_IFNAME is not set" in msg
    assert f"would bind to {addresses[-1] if addresses else '127.0.0.1'}" in msg and "16-rank world (8 per node)" in msg
    assert "Set GLOO_SOCKET_IFNAME to the network interface of this node that reaches the others" in msg
    assert "here the route to MASTER_ADDR=gpu1 leaves through ib1: GLOO_SOCKET_IFNAME=ib1" in msg


def test_the_refusal_comes_before_the_process_group(node, monkeypatch):
    """``distributed.init`` refuses before ``init_process_group``, which would otherwise wait for the other nodes."""
    node("127.0.1.1")
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")  # init sets it on a CPU; restored afterwards
    monkeypatch.setattr(torch.distributed, "init_process_group", lambda *a, **k: pytest.fail("group started"))
    with pytest.raises(GlooAddressError):
        distributed.init(torch.device("cpu"))


def test_a_reachable_name_a_named_interface_or_one_node_pass(node, monkeypatch):
    own = _own_address()
    if own is not None:  # a name that resolves to an address of this machine's network: gloo binds and advertises it
        node(own)
        check_gloo_address()
    node("127.0.1.1")
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "ib0")
    check_gloo_address()
    monkeypatch.delenv("GLOO_SOCKET_IFNAME")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "16")  # one node: the ranks meet on its loopback
    check_gloo_address()
    monkeypatch.delenv("LOCAL_WORLD_SIZE")  # a launcher that does not say: nothing to tell nodes apart by
    check_gloo_address()
