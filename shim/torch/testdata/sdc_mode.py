"""Recorded by adapter_test (shim/torch/adapter_test.cc) with OPGUARD_SDC set
by the test: in online SDC mode only replica state is recorded, one op per
parameter after each optimizer step (Adam: the parameter, then its state
tensors by key), and what opguard.record_replica_state() is given. Also how
OPGUARD_SDC's values parse."""
import sys

import torch

import opguard
from opguard import _sdc

assert _sdc.parse(None) is False and _sdc.parse(" 0 ") is False and _sdc.parse("1") is True
for bad in ("yes", "2", "true"):
    try:
        _sdc.parse(bad)
        raise AssertionError(f"OPGUARD_SDC={bad} parsed")
    except ValueError as e:
        assert str(e) == f"OPGUARD_SDC={bad!r} is not 0 or 1", e

sys.stderr.write(f"torch {torch.__version__}\n")
assert opguard.enable(), "recording did not start"
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
opt = torch.optim.Adam(model.parameters(), lr=0.01)
x = torch.randn(4, 8)
for _ in range(2):
    loss = model(x).square().sum()
    opt.zero_grad()
    loss.backward()
    opt.step()
ema = torch.randn(16)
assert opguard.record_replica_state({"ema": ema, "pair": (ema, ema * 2)}) == 2
with opguard.paused():
    assert opguard.record_replica_state({"ema": ema}) == 0
