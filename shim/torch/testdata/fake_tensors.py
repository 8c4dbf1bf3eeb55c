"""Run by adapter_test (shim/torch/adapter_test.cc) under OPGUARD=1: ops on
tensors that hold no data (the meta device, FakeTensorMode, as DTensor uses
to find its outputs' shapes) compute nothing. They are neither ops nor gaps;
the real ops around them are recorded."""
import opguard
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

assert opguard.enable(), "recording did not start"
x = torch.ones(4, 4)
torch.empty(3, device="meta").add_(1)
with FakeTensorMode():
    fake = torch.empty_strided((4, 4), (4, 1))
    (fake @ fake).relu()
x.mul(2)
