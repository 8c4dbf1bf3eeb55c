"""Run by adapter_test (shim/torch/adapter_test.cc) under OPGUARD=1: views
made inside a tensor subclass's __torch_dispatch__ (the local ops DTensor
runs: aten::t of a weight or an activation in every Linear). There the op
runs below autograd, so the view does not share its base's version counter:
each one starts a counter of its own at 0, whatever was written to the
storage before. Between two such views of the same bytes the base is written
(as autograd accumulates a gradient in place): the second view's op must
carry the bytes written, as the contiguous copy after it hashes them, never
the first view's fingerprint."""
import opguard
import torch
from wrapper_subclass import Wrapper

assert opguard.enable(), "recording did not start"
base = torch.arange(32.0).view(8, 4)
wrapped = Wrapper(base)
for _ in range(3):
    wrapped.t()          # a view of base, made (and hashed) inside the dispatch
    base.add_(1)         # base written outside it: its counter moves, the view's not
    wrapped.t()          # a second view: the same bytes, layout and counter value
    base.t().contiguous()  # the same view's bytes, hashed afresh
