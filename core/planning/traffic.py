"""What a phase costs besides its FLOPs, counted by the probe (recipes/probe.py ``measure``) from the ops the project's
own code dispatches: the memory traffic of the ops that are not matrix products or attention (norms, activations,
casts, the log-softmax over the vocabulary, residual adds, their backward), and the number of ops.

Eager PyTorch runs each op as its own kernel (no fusion), so each reads its tensor inputs and writes its outputs once
from device memory: those bytes at the memory bandwidth are the phase's memory-bound time, beside its matrix products
at the FLOP rate (core/planning/step_time.py). Each op also costs the host a fixed time to dispatch and launch it
(Python, the dispatcher, autograd's recording): the op count times that cost (step_time.py ``HOST_SECONDS_PER_OP``)
is the time below which a phase cannot run, whatever the device's speed.
"""
from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

aten = torch.ops.aten
# Ops that only allocate or relabel memory: no kernel reads or writes data.
NO_DATA = {aten.empty, aten.empty_like, aten.empty_strided, aten.new_empty, aten.new_empty_strided, aten._unsafe_view,
           aten.lift_fresh, aten.alias, aten.detach}
# Ops that read rows of their first input by index: they move the rows they pick (the output), not the whole table.
INDEXED = {aten.embedding, aten.index, aten.index_select, aten.gather, aten.take}


def _bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))


class Traffic(TorchDispatchMode):
    """Counts ``ops`` (every op that runs a kernel: all but views and allocations), ``bytes`` (read and written by
    those not in ``compute``: the ops whose FLOPs ``FlopCounterMode`` counts, matrix products and attention) and
    ``module_passes``: each forward of a module that owns parameters (a forward recomputed under checkpointing
    again), and its backward when the first forward runs with grad on, which is where DeepSpeed ZeRO-3 gathers that
    module's parameters through a hook (deepspeed/runtime/zero/parameter_offload.py, pre-forward and pre-backward)."""

    def __init__(self, compute):
        super().__init__()
        self.compute = set(compute)
        self.ops = 0
        self.bytes = 0
        self.module_passes = 0
        self._hook = None

    def __enter__(self):
        self._hook = torch.nn.modules.module.register_module_forward_pre_hook(self._count_module)
        return super().__enter__()

    def __exit__(self, *exc):
        self._hook.remove()
        return super().__exit__(*exc)

    def _count_module(self, module, args) -> None:
        if next(module.parameters(recurse=False), None) is not None:
            # a recompute runs inside backward (an autograd graph task): its module's backward is counted already
            outside_backward = torch._C._current_graph_task_id() == -1
            self.module_passes += 1 + (torch.is_grad_enabled() and outside_backward)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        packet = func.overloadpacket
        if func.is_view or packet in NO_DATA or func.namespace != "aten":
            return out
        self.ops += 1
        if packet in self.compute:
            return out
        if packet is aten.copy_:  # writes its destination from its source; returns the destination
            self.bytes += _bytes(args[:2])
        elif packet in INDEXED:  # the rows picked (as large as the output) and the indices
            self.bytes += 2 * _bytes([out]) + _bytes(tree_flatten((args[1:], kwargs))[0])
        else:
            self.bytes += _bytes(tree_flatten((args, kwargs))[0]) + _bytes(tree_flatten(out)[0])
        return out
