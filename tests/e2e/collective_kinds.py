"""Two ranks; one call of each torch.distributed collective the gloo backend
supports (torch 1.13 has no reduce_scatter or all_gather_into_tensor on
gloo), then an all-reduce on a two-rank and on a one-rank subgroup, for the
test that every kind is recorded (Entered and Completed on both ranks,
outputs agreeing where they must) on the right communicator. Writes
DIR/kinds-RANK.json: the calls each rank made, in order."""
import json
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from train_gpt import free_port


def run(rank, world, out_dir):
    dist.init_process_group("gloo", rank=rank, world_size=world)
    base = torch.arange(8, dtype=torch.float32) + 10 * rank
    calls = []

    def call(name, fn):
        fn()
        calls.append(name)

    call("all_reduce", lambda: dist.all_reduce(base.clone()))
    call("broadcast", lambda: dist.broadcast(base.clone(), src=1))
    call("reduce", lambda: dist.reduce(base.clone(), dst=0))
    call("all_gather", lambda: dist.all_gather([torch.empty(8) for _ in range(world)], base))
    call("all_to_all_single", lambda: dist.all_to_all_single(torch.empty(8), base.clone()))
    call("gather", lambda: dist.gather(
        base, [torch.empty(8) for _ in range(world)] if rank == 0 else None, dst=0))
    call("scatter", lambda: dist.scatter(
        torch.empty(8), [base.clone(), base.clone()] if rank == 0 else None, src=0))
    call("barrier", dist.barrier)
    # Point to point: gloo's send/recv works have no future (no Completed
    # record); recording goes on after them.
    if rank == 0:
        call("send", lambda: dist.send(base.clone(), dst=1))
    else:
        call("recv", lambda: dist.recv(torch.empty(8), src=0))
    # Subgroups: the opguard package names each the first time it is used
    # (both ranks; one rank each).
    pair = dist.new_group([0, 1])
    solo = [dist.new_group([r]) for r in range(world)]
    call("all_reduce", lambda: dist.all_reduce(base.clone(), group=pair))
    call("all_reduce", lambda: dist.all_reduce(base.clone(), group=solo[rank]))
    with open(os.path.join(out_dir, f"kinds-{rank}.json"), "w") as f:
        json.dump(calls, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(free_port()))
    mp.spawn(run, args=(2, sys.argv[1]), nprocs=2, join=True)
