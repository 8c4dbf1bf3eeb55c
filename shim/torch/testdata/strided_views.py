"""Run by adapter_test (shim/torch/adapter_test.cc) under OPGUARD=1: views of
several dtypes and layouts, each cloned right after the op that made it. A
strided tensor is fingerprinted in its logical element order, and a
contiguous view of a tensor already fingerprinted is finalized from the
cached sums of its bytes: either way each clone's (contiguous, freshly
hashed) output must carry the fingerprint of the view before it."""
import opguard
import torch

assert opguard.enable(), "recording did not start"
torch.manual_seed(0)
views = [
    lambda x: x.t(),                          # a transposed matrix
    lambda x: x.view(4, 3, 5).permute(2, 0, 1),
    lambda x: x.view(4, 3, 5).transpose(0, 1),  # inner rows stay contiguous
    lambda x: x[::2, 1:],                     # steps and offsets
    lambda x: x[:, 3:4],                      # one column: size-1 dimension
    lambda x: x[:, :1].expand(12, 7),         # stride 0
    lambda x: x.view(2, 6, 5)[:, ::3].transpose(1, 2),
    lambda x: x.view(60),                     # contiguous views of the same bytes
    lambda x: x.view(3, 20),
    lambda x: x.unsqueeze(0),
    lambda x: x[4:8],                         # contiguous, other bytes of the storage
]
for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64,
              torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool):
    base = (torch.randn(12, 5) * 100).to(dtype)
    for make in views:
        make(base).clone()
for dtype in (torch.float32, torch.float64, torch.float16, torch.int8):
    # Transposed planes over several copy blocks, with partial ones at the
    # edges, cloned into a contiguous tensor (a plain clone keeps the strides,
    # and would be hashed through the same copy as the view).
    (torch.randn(3, 37, 50) * 100).to(dtype).transpose(1, 2).clone(
        memory_format=torch.contiguous_format)
big = torch.randn(700, 600)  # over the adapter's 1 MiB gather buffer
big.t().clone()
