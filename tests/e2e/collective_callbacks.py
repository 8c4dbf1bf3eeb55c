"""Two ranks; callbacks on all-reduce futures. Rank 1 joins the first
all-reduce late, so rank 0's first callback runs on gloo's thread when the
work completes; the second future has completed before then() is called, so
its callback runs at once on the training thread. Either way their ops
belong in one callback lane, the same from run to run."""
import time

import torch
import torch.distributed as dist

from train_gpt import spawn_ranks


def run(rank, world):
    dist.init_process_group("gloo", rank=rank, world_size=world)
    t = torch.ones(64) * (rank + 1)
    if rank == 1:
        time.sleep(0.5)  # rank 0's first work waits for this rank
    late = dist.all_reduce(t, async_op=True).get_future()
    late.then(lambda f: f.value()[0].neg()).wait()
    early = dist.all_reduce(t, async_op=True).get_future()
    early.wait()
    early.then(lambda f: f.value()[0].sqrt()).wait()
    dist.destroy_process_group()


if __name__ == "__main__":
    spawn_ranks(run, 2)
