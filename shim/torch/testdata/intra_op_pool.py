"""Run by adapter_test (shim/torch/adapter_test.cc) under OPGUARD=1 with two
intra-op threads: large tensors, contiguous and transposed (one small enough
for the adapter's gather, one hashed tile by tile from its strides), are
fingerprinted in shares on torch's intra-op pool, every one inline. The
script recomputes each result afterwards and prints its CPU fingerprint on
the calling thread alone ("mul<i>=", "t<i>=", "tsmall<i>=") for the test to
compare with the records."""
import ctypes
import os
import sys

os.environ["OPGUARD_ASYNC_FP_MIN_BYTES"] = "0"  # every fingerprint inline: the pool's
os.environ["OPGUARD_INTRA_OP_FP_MIN_BYTES"] = "65536"
import numpy  # noqa: E402,F401  (Tensor.numpy)
import opguard  # noqa: E402
import torch  # noqa: E402
from opguard import _native  # noqa: E402

torch.set_num_threads(2)
assert opguard.enable(), "recording did not start"
torch.manual_seed(0)
x = torch.randn(1024, 1024)  # 4 MiB
small = torch.randn(512, 512)  # 1 MiB: gathered by the adapter when transposed
for i in range(3):
    y = x.mul(2.0 + i)
    y.t().clone()
    small.mul(2.0 + i).t().clone()

shim = ctypes.CDLL(os.path.join(_native.LIB_DIR, "libopguard_shim.so"))


class Tensor(ctypes.Structure):  # opguard_tensor: only the digest is read here
    _fields_ = [("fp_lo", ctypes.c_uint64), ("fp_hi", ctypes.c_uint64),
                ("rest", ctypes.c_uint8 * 64)]


def host_fingerprint(t):
    a = t.contiguous().numpy()
    shape = (ctypes.c_int64 * a.ndim)(*a.shape)
    out = Tensor()
    assert shim.opguard_fingerprint_host(a.ctypes.data_as(ctypes.c_void_p), ctypes.c_uint8(2),
                                         shape, ctypes.c_uint32(a.ndim), None,
                                         ctypes.byref(out)) == 0
    return out.fp_lo


with opguard.paused():
    for i in range(3):
        print(f"mul{i}={host_fingerprint(x.mul(2.0 + i))}", file=sys.stderr)
        print(f"t{i}={host_fingerprint(x.mul(2.0 + i).t())}", file=sys.stderr)
        print(f"tsmall{i}={host_fingerprint(small.mul(2.0 + i).t())}", file=sys.stderr)
print(f"threads={torch.get_num_threads()}", file=sys.stderr)
