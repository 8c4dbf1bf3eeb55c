"""Two ranks; an async all-reduce that completes on the backend's thread,
read by an op on the training thread afterwards. Rank 1 joins late, so rank
0's work completes well after its op returned, and rank 0 reads the output
(t.sum()) only once the Completed record has been taken on gloo's thread.
The sum's input must be the reduced bytes, not the ones hashed at launch.
Writes DIR/input-0.bin and DIR/final-0.bin (rank 0's launched and reduced
bytes) for the test to fingerprint independently."""
import os
import sys
import time

import torch
import torch.distributed as dist

from train_gpt import spawn_ranks


def run(rank, world, out_dir):
    dist.init_process_group("gloo", rank=rank, world_size=world)
    t = torch.arange(4096, dtype=torch.float32) * (rank + 1)
    if rank == 0:
        t.numpy().tofile(os.path.join(out_dir, "input-0.bin"))
    else:
        time.sleep(0.5)  # rank 0's work waits for this rank
    work = dist.all_reduce(t, async_op=True)
    work.wait()
    if rank == 0:
        time.sleep(0.3)  # the future's callbacks have run on gloo's thread by now
        t.sum()
        t.numpy().tofile(os.path.join(out_dir, "final-0.bin"))
    dist.destroy_process_group()


if __name__ == "__main__":
    spawn_ranks(run, 2, sys.argv[1])
