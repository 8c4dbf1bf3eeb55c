"""Two ranks; a subgroup and the default group, each used by a collective
(so that OpGuard knows them) and then destroyed. Writes DIR/threads-RANK.json:
the process's thread counts, OpGuard's own threads left out, before the first
group, with both groups, after the subgroup's destruction and after the
default group's. A destroyed group's backend threads must be gone (their
group's destructor joins them)."""
import gc
import json
import os
import sys

import torch
import torch.distributed as dist

from train_gpt import spawn_ranks

OPGUARD_THREADS = ("opguard-send", "ZMQbg/")


def threads():
    """Threads of this process, OpGuard's shim and ZeroMQ threads left out."""
    count = 0
    for tid in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{tid}/comm") as f:
            if not f.read().strip().startswith(OPGUARD_THREADS):
                count += 1
    return count


def run(rank, world, out_dir):
    torch.set_num_threads(1)
    torch.ones(4).add(1)  # torch's own lazily started threads, before the baseline
    counts = {"before": threads()}
    dist.init_process_group("gloo", rank=rank, world_size=world)
    pair = dist.new_group([0, 1])
    t = torch.ones(16) * (rank + 1)
    dist.all_reduce(t)
    dist.all_reduce(t, group=pair)
    dist.barrier()
    counts["both_groups"] = threads()
    dist.destroy_process_group(pair)
    del pair
    gc.collect()
    counts["after_subgroup"] = threads()
    dist.destroy_process_group()
    gc.collect()
    counts["after_all"] = threads()
    with open(os.path.join(out_dir, f"threads-{rank}.json"), "w") as f:
        json.dump(counts, f)


if __name__ == "__main__":
    spawn_ranks(run, 2, sys.argv[1])
