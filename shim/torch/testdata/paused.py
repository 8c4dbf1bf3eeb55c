"""Run by adapter_test (shim/torch/adapter_test.cc) under OPGUARD=1: ops in
opguard.paused() regions (nested, and on another thread while paused) are not
recorded; those before and after are. So are collectives: one through c10d's
dispatcher (all_reduce) and one through OpGuard's Python wrapper
(all_to_all_single in torch 1.13), each once outside and once inside."""
import os
import socket
import threading

import opguard
import torch
import torch.distributed as dist

assert opguard.enable(), "recording did not start"
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    os.environ["MASTER_PORT"] = str(s.getsockname()[1])
os.environ["MASTER_ADDR"] = "127.0.0.1"
dist.init_process_group("gloo", rank=0, world_size=1)


def collectives():
    dist.all_reduce(torch.ones(4))
    dist.all_to_all_single(torch.empty(4), torch.ones(4))


x = torch.randn(8, 8)
x.tan()
collectives()
with opguard.paused():
    collectives()
    x.sin()
    with opguard.paused():
        x.exp()
    x.sinh()  # still paused: the inner region's exit does not resume
    worker = threading.Thread(target=lambda: x.cosh())
    worker.start()
    worker.join()
x.cos()
x.atan()
dist.destroy_process_group()
