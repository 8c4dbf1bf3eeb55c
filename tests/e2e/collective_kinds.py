"""Two ranks; one call of each torch.distributed collective the gloo backend
supports (torch 1.13 has no reduce_scatter or all_gather_into_tensor on
gloo, nor coalesced collectives that dispatch), then an all-reduce on a
two-rank and on a one-rank subgroup, for the test that every kind is
recorded (Entered and Completed on both ranks, outputs agreeing where they
must) on the right communicator. Writes DIR/kinds-RANK.json: the calls each
rank made, in order."""
import json
import os
import sys

import torch
import torch.distributed as dist

from train_gpt import spawn_ranks


def dispatches(op):
    """Whether the installed torch has the c10d dispatcher op `op`."""
    try:
        getattr(torch.ops.c10d, op)
        return True
    except (AttributeError, RuntimeError):
        return False


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
    # Where the installed torch dispatches them (2.x): the coalesced
    # collectives, one collective over a list of tensors each, and the
    # monitored barrier (synchronous: no work, completed when it returns).
    if dispatches("allreduce_coalesced_"):
        call("all_reduce_coalesced",
             lambda: dist.all_reduce_coalesced([base.clone(), base[:4].clone()]))
    if dispatches("allgather_coalesced_"):
        call("all_gather_coalesced", lambda: dist.all_gather_coalesced(
            [[torch.empty(8), torch.empty(4)] for _ in range(world)], [base, base[:4]]))
    if dispatches("allgather_into_tensor_coalesced_"):
        def gather_coalesced():
            with dist._coalescing_manager():
                dist.all_gather_into_tensor(torch.empty(16), base)
                dist.all_gather_into_tensor(torch.empty(8), base[:4])
        call("all_gather_into_tensor_coalesced", gather_coalesced)
    if dispatches("monitored_barrier_"):
        call("monitored_barrier", dist.monitored_barrier)
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
    spawn_ranks(run, 2, sys.argv[1])
