"""Two ranks; all_gather and all_gather_object. Gloo runs aten ops of its
own on its worker threads while it executes them (it copies its flat
buffer into the output tensors): the collective's internals, not the
training's."""

import torch
import torch.distributed as dist

from train_gpt import spawn_ranks


def run(rank, world):
    dist.init_process_group("gloo", rank=rank, world_size=world)
    parts = [torch.zeros(8) for _ in range(world)]
    dist.all_gather(parts, torch.arange(8.0) + rank)
    gathered = [None] * world
    dist.all_gather_object(gathered, {"rank": rank})
    torch.cat(parts).sum()
    dist.destroy_process_group()


if __name__ == "__main__":
    spawn_ranks(run, 2)
