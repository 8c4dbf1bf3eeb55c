"""Run by adapter_test (shim/torch/adapter_test.cc) under OPGUARD=1: ops in
opguard.paused() regions (nested, and on another thread while paused) are not
recorded; those before and after are."""
import threading

import opguard
import torch

assert opguard.enable(), "recording did not start"
x = torch.randn(8, 8)
x.tan()
with opguard.paused():
    x.sin()
    with opguard.paused():
        x.exp()
    x.sinh()  # still paused: the inner region's exit does not resume
    worker = threading.Thread(target=lambda: x.cosh())
    worker.start()
    worker.join()
x.cos()
x.atan()
