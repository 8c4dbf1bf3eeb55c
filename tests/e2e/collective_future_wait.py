"""Two ranks; async all-reduces waited for through their futures. Rank 0
writes each output as soon as its wait() returns, as DDP's reducer writes
its gradient buckets; rank 1 leaves them alone. The outputs are large (64 MiB), so
fingerprinting one takes about ten milliseconds: long enough for the write to
land in the middle of a fingerprint taken by the future's callback, which
torch runs only after it has woken the waiters."""

import torch
import torch.distributed as dist

from train_gpt import spawn_ranks

ELEMENTS = 1 << 24  # 64 MiB of float32
ROUNDS = 6


def run(rank, world):
    dist.init_process_group("gloo", rank=rank, world_size=world)
    for _ in range(ROUNDS):
        t = torch.arange(ELEMENTS, dtype=torch.float32) * (rank + 1)
        future = dist.all_reduce(t, async_op=True).get_future()
        future.wait()
        if rank == 0:
            t.zero_()
    dist.destroy_process_group()


if __name__ == "__main__":
    spawn_ranks(run, 2)
