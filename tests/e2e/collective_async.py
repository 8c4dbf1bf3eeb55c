"""Two ranks; an async all-reduce whose output is read only after wait().
Writes the final tensor's bytes to DIR/final-RANK.bin and the input's to
DIR/input-RANK.bin so the test can fingerprint them independently."""
import os
import sys

import torch
import torch.distributed as dist

from train_gpt import spawn_ranks


def run(rank, world, out_dir):
    dist.init_process_group("gloo", rank=rank, world_size=world)
    t = torch.arange(4096, dtype=torch.float32) * (rank + 1)
    t.numpy().tofile(os.path.join(out_dir, f"input-{rank}.bin"))
    work = dist.all_reduce(t, async_op=True)
    busy = torch.ones(256, 256)
    for _ in range(20):  # other ops while the collective is in flight
        busy = busy @ busy / 256
    work.wait()
    t.numpy().tofile(os.path.join(out_dir, f"final-{rank}.bin"))
    dist.destroy_process_group()


if __name__ == "__main__":
    spawn_ranks(run, 2, sys.argv[1])
