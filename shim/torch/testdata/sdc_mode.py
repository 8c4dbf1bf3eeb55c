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

# A DTensor parameter (torch 2.x, a one-rank mesh) is recorded by its local
# part: one more replica state op, "Adam:0.0" of its own optimizer.
try:
    from torch.distributed.tensor import Replicate, distribute_tensor
except ImportError:
    distribute_tensor = None
if distribute_tensor is not None and _sdc.supported():
    import os
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(20000 + os.getpid() % 20000))
    dist.init_process_group("gloo", rank=0, world_size=1)
    mesh = init_device_mesh("cpu", (1,))
    weight = torch.nn.Parameter(distribute_tensor(torch.randn(8, 8), mesh, [Replicate()]))
    dopt = torch.optim.SGD([weight], lr=0.1)
    weight.sum().backward()
    dopt.step()
    dist.destroy_process_group()
