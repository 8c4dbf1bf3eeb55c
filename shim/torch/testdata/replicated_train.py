"""Trained by adapter_test (shim/torch/adapter_test.cc) under OPGUARD=1: two
SGD steps of a small model, then one op inside opguard.replicated() and one
outside it, and one after an Optimizer.step range whose enter failed. The
test checks which recorded ops carry the replicated flag."""
import opguard
import torch

assert opguard.enable(), "recording did not start"
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.GELU(), torch.nn.Linear(8, 3))
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
x = torch.randn(16, 4)
for _ in range(2):
    loss = model(x).square().mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
weight = model[0].weight.detach()
with opguard.replicated():
    with opguard.replicated():  # regions nest
        weight.sin()
    weight.tan()
weight.cos()  # after the region: not replicated
# An Optimizer.step range whose enter fails (its args must be a string): the
# step the adapter was told of ends with the failure, so what follows is not
# the optimizer's.
try:
    with torch.autograd.profiler.record_function("Optimizer.step#Broken.step", args=1):
        raise AssertionError("the range's enter did not fail")
except RuntimeError:
    pass
weight.exp()  # not replicated
