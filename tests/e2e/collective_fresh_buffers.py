"""Two ranks; tensors filled where no op writes them. torch.LongTensor([n])
takes memory from aten::empty and writes n into it in C++; rank 1 receives a
broadcast into a buffer fresh from torch.empty. Writes DIR/count-RANK.bin
and DIR/buf-RANK.bin (the bytes the ops after them read) for the test to
fingerprint independently."""
import os
import sys

import torch
import torch.distributed as dist

from train_gpt import spawn_ranks


def run(rank, world, out_dir):
    dist.init_process_group("gloo", rank=rank, world_size=world)
    count = torch.LongTensor([1000 + rank])
    count.add(1)
    count.numpy().tofile(os.path.join(out_dir, f"count-{rank}.bin"))
    buf = torch.arange(64, dtype=torch.float32) if rank == 0 else torch.empty(64)
    dist.broadcast(buf, src=0)
    buf.neg()
    buf.numpy().tofile(os.path.join(out_dir, f"buf-{rank}.bin"))
    dist.destroy_process_group()


if __name__ == "__main__":
    spawn_ranks(run, 2, sys.argv[1])
