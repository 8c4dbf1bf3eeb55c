"""Two ranks; async collectives waited for through their futures, one with
wait() (on the world), one with a callback (on a two-rank subgroup, so that
each has its own communicator to show it completed). In torch 1.13, all_to_all_single does not
reach c10d's dispatcher, so the opguard package records it from Python: its
Completed record must be taken however the work is waited for. Writes
DIR/final-RANK.bin: the second output's bytes once complete."""
import os
import sys

import torch
import torch.distributed as dist

from train_gpt import spawn_ranks


def run(rank, world, out_dir):
    dist.init_process_group("gloo", rank=rank, world_size=world)
    base = torch.arange(4096, dtype=torch.float32) + 10000 * rank
    waited = torch.empty(4096)
    dist.all_to_all_single(waited, base.clone(), async_op=True).get_future().wait()
    pair = dist.new_group([0, 1])
    chained = torch.empty(4096)
    work = dist.all_to_all_single(chained, base.clone(), group=pair, async_op=True)
    work.get_future().then(lambda f: None).wait()
    chained.numpy().tofile(os.path.join(out_dir, f"final-{rank}.bin"))
    chained.neg()
    dist.destroy_process_group()


if __name__ == "__main__":
    spawn_ranks(run, 2, sys.argv[1])
