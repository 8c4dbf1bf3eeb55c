"""Run by adapter_test (shim/torch/adapter_test.cc) under OPGUARD=1: in-place
writes made inside a tensor subclass's __torch_dispatch__ (what
AsyncCollectiveTensor and DTensor run). There the op runs below autograd, so
it does not bump the written tensor's version counter (the outer call bumps
the outer tensor's after it returns; a wrapper's inner tensor never). Each
write is followed by a clone, freshly hashed: every written op's output must
carry the bytes the clone sees, never the fingerprint its target had before
the write."""
import opguard
import torch
from wrapper_subclass import Wrapper

assert opguard.enable(), "recording did not start"
src = torch.arange(16.0)
for _ in range(3):
    dst = torch.zeros(16)
    dst.add_(1)                 # dst hashed (and cached) before the write
    dst.copy_(Wrapper(src))     # a plain tensor written from inside the dispatch
    dst.clone()
    inner = torch.zeros(16)
    inner.mul_(2)
    wrapped = Wrapper(inner)
    wrapped.add_(src)           # the wrapper's inner tensor, written in place
    inner.clone()
    wrapped.mul_(3)             # again
    inner.clone()
    torch.add(wrapped, 1, out=wrapped)  # an out= write inside the dispatch
    inner.clone()
