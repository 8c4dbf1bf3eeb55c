"""Two ranks; callbacks on futures. Rank 1 joins the first all-reduce late,
so rank 0's first callback runs on gloo's thread when the work completes; the
second future has completed before then() is called, so its callback runs at
once on the training thread. Then two Python futures complete in the order
their callbacks were registered on rank 0, in the other order (the second
from a side thread) on rank 1. Whichever thread runs a callback and whenever,
its ops belong in the lane its registration gives it."""
import threading
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

    first, second = torch.futures.Future(), torch.futures.Future()
    first.then(lambda f: f.value().exp())
    second.then(lambda f: f.value().abs())
    if rank == 0:
        first.set_result(torch.ones(4))
        second.set_result(torch.ones(4))
    else:
        side = threading.Thread(target=second.set_result, args=(torch.ones(4),))
        side.start()
        side.join()
        first.set_result(torch.ones(4))
    dist.destroy_process_group()


if __name__ == "__main__":
    spawn_ranks(run, 2)
