"""Recorded by adapter_test (shim/torch/adapter_test.cc) with OPGUARD_SDC=1:
a hand-written update that never tells opguard its state records nothing in
online SDC mode, and the process says so at exit."""
import torch

import opguard

assert opguard.enable(), "recording did not start"
w = torch.ones(4, requires_grad=True)
for _ in range(2):
    (w * 2).sum().backward()
    with torch.no_grad():
        w -= 0.1 * w.grad
        w.grad = None
