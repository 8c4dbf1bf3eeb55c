"""Run by adapter_test (shim/torch/adapter_test.cc) under OPGUARD=1: ops that
write through their arguments. The in-place foreach ops (what torch.optim
runs with foreach=True) return nothing: the tensors their schema marks
written are their outputs, each fingerprinted after the op. Each write is
followed by clones of the first and last written tensor, freshly hashed; an
in-place op returning its target, and an out= op returning its out
argument, have that tensor once."""
import opguard
import torch

assert opguard.enable(), "recording did not start"
torch.manual_seed(0)
xs = [torch.randn(5, 3), torch.randn(7), torch.randn(2, 2)]
ys = [torch.randn(5, 3), torch.randn(7), torch.randn(2, 2)]
out = torch.empty(5, 3)
for _ in range(3):
    torch._foreach_add_(xs, ys)
    xs[0].clone()
    xs[2].clone()
    torch._foreach_mul_(xs, 0.5)
    xs[0].clone()
    xs[2].clone()
    xs[0].add_(ys[0])
    xs[0].clone()
    torch.mul(xs[0], 2.0, out=out)
    out.clone()
