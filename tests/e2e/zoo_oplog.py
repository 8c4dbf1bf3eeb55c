"""A positional baseline that is not OpGuard, for the torch 2.x zoo
(test_zoo_gpt.py, class PositionalBaseline): zoo_gpt.py --oplog DIR runs its
training under a TorchDispatchMode that logs every op it sees — its name, the
line of zoo_gpt.py it was called from, the step, and the sha256 of the
tensors it returned or, for an op that returns nothing (in-place foreach and
fused ops), of its first argument. Two logs are compared position by
position: the first position where the ops or their bytes differ is the
baseline's first divergence. It has no alignment at all, so any benign
change that adds or removes an op misleads it; on the planted bugs, whose
runs execute the same ops, it says independently which op and line first
computed other bits.

Collectives, empty-likes and views are logged without bytes: an asynchronous
collective writes its tensors after the op returns, an empty-like's are
uninitialised, a view's are often a buffer not yet filled (DDP's buckets).
"""
import ctypes
import hashlib
import json
import os
import sys

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

SCRIPT = os.path.abspath(os.path.join(os.path.dirname(__file__), "zoo_gpt.py"))


def _line():
    frame = sys._getframe(2)
    while frame is not None:
        if os.path.abspath(frame.f_code.co_filename) == SCRIPT:
            return frame.f_lineno
        frame = frame.f_back
    return 0


def _digest(values):
    h = hashlib.sha256()
    for t in tree_leaves(values):
        if not isinstance(t, torch.Tensor):
            continue
        t = getattr(t, "_local_tensor", t)
        if t.device.type != "cpu" or isinstance(t, FakeTensor):
            continue  # meta and fake tensors (DTensor's shape propagation) hold no bytes
        t = t.detach().contiguous()  # a copy only if strided; numpy() would pin the storage
        h.update(ctypes.string_at(t.data_ptr(), t.numel() * t.element_size()))
    return h.hexdigest()[:16]


class OpLog(TorchDispatchMode):
    def __init__(self, plan):
        super().__init__()
        self.plan, self.rows = plan, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func._schema.name
        views = any(r.alias_info is not None and not r.alias_info.is_write
                    for r in func._schema.returns)
        if name.startswith(("c10d::", "_c10d_functional::")) or "empty" in name or views:
            # Bytes not yet written (uninitialised, a collective in flight, a
            # view of a buffer such as DDP's buckets, filled later).
            digest = ""
        elif name == "fsdp::all_gather_copy_in":
            digest = _digest(out[0])  # out[1]: the all-gather's buffer, filled later
        else:
            digest = _digest(out if out is not None else args[:1])
        self.rows.append([self.plan.step, name, _line(), digest])
        return out

    def write(self, path):
        with open(path, "w") as f:
            json.dump(self.rows, f)


def first_difference(reference, suspect):
    """The first position where two ranks' logs differ, as (index, reference
    row, suspect row); None when equal."""
    for i in range(max(len(reference), len(suspect))):
        ref = reference[i] if i < len(reference) else None
        sus = suspect[i] if i < len(suspect) else None
        if ref != sus:
            return i, ref, sus
    return None
