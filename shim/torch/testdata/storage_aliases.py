"""Run by adapter_test (shim/torch/adapter_test.cc) under OPGUARD=1: tensors
of one storage with version counters of their own. `p.data` is such a
tensor, its counter at 0 however often p was written; a write through it
moves only its own counter. Each write is followed by a clone, whose input
is read through the fingerprint cache and whose output is freshly hashed:
the two must agree, and the write's output must be the bytes the clone
copies."""
import opguard
import torch

assert opguard.enable(), "recording did not start"
torch.manual_seed(0)
p = torch.nn.Parameter(torch.randn(16, 32))
for _ in range(3):
    with torch.no_grad():
        p.mul_(2)      # written through p
    p.data.clone()     # read through a tensor whose counter is at 0
    p.data.add_(1)     # written through such a tensor: p's counter does not move
    p.clone()
    p.data.clone()
