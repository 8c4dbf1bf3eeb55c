"""Recorded by adapter_test (shim/torch/adapter_test.cc) under OPGUARD=1: how
replicated ops read their inputs. A tensor cached before the region and then
changed behind torch's back (through numpy: no op, no version bump) is read
from its bytes by the region's first op (aten::sin). A tensor an op of the
region produced (aten::cos's output), changed the same way, is taken from the
cache by a later op of the same region (aten::tan): its bytes were hashed in
the region. A later region marks afresh: aten::exp reads the changed bytes."""
import torch

import opguard

assert opguard.enable(), "recording did not start"
before = torch.ones(4096)
before.neg()  # caches `before`'s fingerprint
before.numpy()[0] = 7.0
with opguard.replicated():
    before.sin()
    inside = before.cos()
    inside.numpy()[0] = 5.0
    inside.tan()
before.abs()  # ends the run of replicated ops
with opguard.replicated():
    inside.exp()
