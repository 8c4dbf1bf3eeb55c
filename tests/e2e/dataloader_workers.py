"""Two ranks, each reading batches through DataLoader workers started with
the spawn and the fork methods, then without workers. The workers inherit
OPGUARD=1 and the rank; they must not record (a second stream of ops under
the rank's lanes). Each worker writes DIR/worker-METHOD-RANK-PID.json with
what it saw (METHOD "main": the rank's own process); each rank writes
DIR/rank-RANK.json with whether it records."""
import json
import os
import sys

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset

from train_gpt import spawn_ranks


class Tokens(Dataset):
    def __init__(self, out_dir, method, rank):
        self.out_dir, self.method, self.rank = out_dir, method, rank

    def __len__(self):
        return 8

    def __getitem__(self, i):
        if i == 0:  # once per worker process (one worker per loader)
            import opguard  # the autoload hook imported it when torch came in
            path = os.path.join(self.out_dir,
                                f"worker-{self.method}-{self.rank}-{os.getpid()}.json")
            with open(path, "w") as f:
                json.dump({"enabled": opguard.enabled(),
                           "recorder": os.environ.get("OPGUARD_RECORDER", "")}, f)
        return torch.arange(16) * (i + 1) + self.rank


def run(rank, world, out_dir):
    dist.init_process_group("gloo", rank=rank, world_size=world)
    import opguard
    with open(os.path.join(out_dir, f"rank-{rank}.json"), "w") as f:
        json.dump({"enabled": opguard.enabled(), "pid": os.getpid()}, f)
    total = torch.zeros(16)
    for method in ("spawn", "fork", "main"):
        if method == "main":  # no workers: fetched and collated in this process
            loader = DataLoader(Tokens(out_dir, method, rank), batch_size=4)
        else:
            loader = DataLoader(Tokens(out_dir, method, rank), batch_size=4, num_workers=1,
                                multiprocessing_context=method)
        for batch in loader:
            total += batch.float().sum(0)
    dist.all_reduce(total)
    dist.destroy_process_group()


if __name__ == "__main__":
    spawn_ranks(run, 2, sys.argv[1])
