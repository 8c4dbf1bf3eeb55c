"""Run by adapter_test (shim/torch/adapter_test.cc) under OPGUARD=1: an op
whose large output is fingerprinted off the training thread, followed at
once by an in-place write into that output, four times. The recorded
fingerprints must be the ones of the bytes the ops produced, not of the
written ones: the script recomputes each op's result afterwards and prints
its CPU fingerprint ("expect<i>=<lo>") and the shim's counters for the test
to compare."""
import ctypes
import os
import sys

os.environ["OPGUARD_ASYNC_FP_MIN_BYTES"] = "65536"  # read at the first fingerprint
import numpy  # noqa: E402,F401  (Tensor.numpy)
import opguard  # noqa: E402
import torch  # noqa: E402
from opguard import _native  # noqa: E402

assert opguard.enable(), "recording did not start"
torch.manual_seed(0)
x = torch.randn(2048, 2048)  # 16 MiB: its hash takes longer than the write after it
for i in range(4):
    y = x.mul(3.0 + i)
    y.add_(1.0)  # writes y while its fingerprint may still be pending
z = y.clone()

shim = ctypes.CDLL(os.path.join(_native.LIB_DIR, "libopguard_shim.so"))


class Tensor(ctypes.Structure):  # opguard_tensor: only the digest is read here
    _fields_ = [("fp_lo", ctypes.c_uint64), ("fp_hi", ctypes.c_uint64),
                ("rest", ctypes.c_uint8 * 64)]


with opguard.paused():
    for i in range(4):
        before = x.mul(3.0 + i).numpy()  # the same bits as the recorded op's output
        shape = (ctypes.c_int64 * 2)(*before.shape)
        out = Tensor()
        assert shim.opguard_fingerprint_host(before.ctypes.data_as(ctypes.c_void_p),
                                             ctypes.c_uint8(2), shape, ctypes.c_uint32(2), None,
                                             ctypes.byref(out)) == 0
        print(f"expect{i}={out.fp_lo}", file=sys.stderr)
opguard._state["shim"].opguard_flush(ctypes.c_uint32(20000))
counters = opguard.counters()
print(f"fp_resolved={counters['fp_resolved']}", file=sys.stderr)
print(f"fp_failed={counters['fp_failed']}", file=sys.stderr)
