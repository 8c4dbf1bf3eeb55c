"""The e2e model (train_gpt.TinyGPT) trained for 3 steps on 2 gloo ranks in
one of the ways real jobs train, chosen by PATTERN (see PATTERNS). Run twice
under OPGUARD=1, a clean job must record identical runs: anything that
changes from run to run (threads, arrival order, memory) is OpGuard's to
keep out of the comparison.

Launch: python3 train_patterns.py PATTERN[,PATTERN...] [FAULT]
(torch.multiprocessing.spawn): each pattern in turn, a fresh model each, in
one process group; rank 0 prints "PATTERN step N loss L" lines.
python3 train_patterns.py --missing names the patterns this torch cannot train.
FAULT: compiledreorder:RANK:STEP, for compiled: the first block's attention
scales after the product instead of before (train_gpt's "reorder") on RANK
from STEP on, a changed computation inside the compiled region (dynamo's guard
on the attribute compiles the block again).
shardflip:RANK:STEP flips one bit in memory on RANK at STEP of each
pattern (no op
does it): for functional, of the gradient shard before the shards are
all-gathered; for dtensor_tp, of the column-parallel weight's local shard,
for fsdp2, of the embedding's parameter shard, for checkpoint, autocast and
pipeline, of the weight of the MLP's first Linear of the first block (of
the second, stage 1's, for pipeline), each before the forward.
"""
import datetime
import gc
import io
import sys
import threading

import torch
import torch.distributed as dist
import torch.nn.functional as F

from train_gpt import TinyGPT, before_process_groups, flip_bit_in_memory, spawn_ranks

PATTERNS = {
    "ddp_buckets": "DistributedDataParallel with several gradient buckets",
    "ddp_unused": "DDP with find_unused_parameters",
    "ddp_static_graph": "DDP with a static graph",
    "ddp_no_sync": "DDP accumulating one micro-batch under no_sync()",
    "ddp_python_hook": "DDP with a Python comm hook (all-reduce, then a future callback)",
    "checkpoint": "activation checkpointing of the blocks (non-reentrant)",
    "checkpoint_reentrant": "activation checkpointing of the blocks (reentrant)",
    "autocast": "bfloat16 autocast on the CPU",
    "dataloader": "batches from a DataLoader with two worker processes",
    "side_thread": "a Python thread running ops while the training thread waits",
    "eval": "an evaluation forward under no_grad after each step",
    "clip": "gradient clipping",
    "checkpoint_save": "a state_dict saved each step",
    "objects": "all_gather_object and broadcast_object_list each step",
    "grad_penalty": "a gradient penalty through autograd.grad(create_graph=True)",
    "torchscript": "a TorchScript module run each step",
    "functional": "gradients averaged with functional collectives (reduce-scatter, all-gather, "
                  "all-reduce: what FSDP2 and DTensor issue)",
    "fsdp2": "FSDP2: fully_shard on each block and on the model",
    "dtensor_tp": "DTensor tensor parallelism: each block's MLP column- then row-parallel "
                  "on a 2-rank mesh, both ranks on the same batch",
    "pipeline": "two pipeline stages (a block each) with plain send/recv of the activations "
                "and their gradient",
    "compiled": "each block compiled with torch.compile (inductor, C++ on the CPU)",
}
DDP = ("ddp_buckets", "ddp_unused", "ddp_static_graph", "ddp_no_sync", "ddp_python_hook")


def missing_features():
    """{pattern: what this torch lacks} for the patterns it cannot train at
    all (`train_patterns.py --missing` prints it as JSON). Any other failure
    of a pattern is a failure, not a skip."""
    import inspect
    from torch.nn.parallel import DistributedDataParallel as DDPClass
    from torch.utils.checkpoint import checkpoint
    needs = {
        "ddp_static_graph": (hasattr(DDPClass, "_set_static_graph"),
                             "DistributedDataParallel._set_static_graph"),
        "ddp_python_hook": (hasattr(DDPClass, "register_comm_hook"),
                            "DistributedDataParallel.register_comm_hook"),
        "checkpoint": ("use_reentrant" in inspect.signature(checkpoint).parameters,
                       "checkpoint(use_reentrant=...)"),
        "autocast": (hasattr(torch, "autocast"), "torch.autocast"),
        "objects": (hasattr(dist, "all_gather_object") and hasattr(dist, "broadcast_object_list"),
                    "all_gather_object and broadcast_object_list"),
        "functional": (_has_functional_collectives(),
                       "torch.distributed._functional_collectives"),
    }
    needs["checkpoint_reentrant"] = needs["checkpoint"]
    needs["fsdp2"] = (_importable("torch.distributed.fsdp", "fully_shard"),
                      "torch.distributed.fsdp.fully_shard")
    needs["dtensor_tp"] = (_importable("torch.distributed.tensor.parallel", "ColwiseParallel"),
                           "torch.distributed.tensor.parallel")
    needs["compiled"] = (hasattr(torch, "compile"), "torch.compile")
    return {pattern: f"this torch ({torch.__version__}) has no {what}"
            for pattern, (present, what) in needs.items() if not present}


def _importable(module, name):
    import importlib
    try:
        return hasattr(importlib.import_module(module), name)
    except Exception:  # noqa: BLE001  (1.13's torch.distributed.fsdp fails on Python 3.11)
        return False


def _has_functional_collectives():
    try:
        import torch.distributed._functional_collectives as funcol
    except ImportError:
        return False
    return hasattr(funcol, "reduce_scatter_tensor") and hasattr(torch.ops, "_c10d_functional")


def functional_average(params, world, flip):
    """Gradients averaged the way FSDP2 and DTensor do it, with functional
    collectives (the _c10d_functional ops, waited for where their results are
    first used): a flat gradient buffer is reduce-scattered, each rank scales
    its shard and the shards are all-gathered back. `flip`: one bit of this
    rank's shard is flipped in memory before the all-gather."""
    import torch.distributed._functional_collectives as funcol
    group = dist.group.WORLD
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    flat = F.pad(flat, (0, -flat.numel() % world))
    shard = funcol.reduce_scatter_tensor(flat, "sum", 0, group) / world
    if flip:
        flip_bit_in_memory(shard, index=3, bit=22)
    full = funcol.all_gather_tensor(shard, 0, group)
    offset = 0
    for p in params:
        p.grad.copy_(full[offset:offset + p.numel()].view_as(p))
        offset += p.numel()


def mesh_of_its_own(world):
    """A 1-D mesh of every rank over a process group of its own. DTensor's
    caches keep a mesh, and its group, alive past destroy_process_group; on
    the default group (init_device_mesh's for such a mesh) that kept gloo's
    threads running into the interpreter's finalization, where the last
    works they free can abort the rank (see before_process_groups). This
    group's works are long done by then."""
    from torch.distributed.device_mesh import DeviceMesh
    return DeviceMesh.from_group(dist.new_group(list(range(world))), "cpu")


def tensor_parallel(core, world):
    """Each block's MLP on a 1-D mesh of every rank: its first Linear
    column-parallel (weight rows sharded), its second row-parallel (the
    partial sums all-reduced), as DTensors."""
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   parallelize_module)
    mesh = mesh_of_its_own(world)
    for block in core.blocks:
        parallelize_module(block.mlp, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})


def pipeline_step(core, rank, idx, target):
    """Two pipeline stages on two ranks, with plain send/recv: rank 0 runs
    the embeddings and the first block and sends the activations; rank 1
    receives them, runs the second block, the head and the loss, and sends
    back the activations' gradient for rank 0's backward. Returns the loss,
    on both ranks."""
    shape = (idx.shape[0], idx.shape[1], core.tok.embedding_dim)
    if rank == 0:
        x = core.blocks[0](core.tok(idx) + core.pos(torch.arange(idx.shape[1])))
        dist.send(x.detach(), dst=1)
        grad = torch.empty(shape)
        dist.recv(grad, src=1)
        x.backward(grad)
        loss = torch.zeros(())
    else:
        x = torch.empty(shape)
        dist.recv(x, src=0)
        x.requires_grad_()
        logits = core.head(core.ln(core.blocks[1](x)))
        loss = F.cross_entropy(logits.view(-1, 64), target.view(-1))
        loss.backward()
        dist.send(x.grad, dst=0)
        loss = loss.detach()
    dist.broadcast(loss, src=1)
    return loss


def fully_sharded(core, world):
    """FSDP2: every block, then the model, sharded over a 1-D mesh: the
    parameters are all-gathered before each forward and backward, the
    gradients reduce-scattered."""
    from torch.distributed.fsdp import fully_shard
    mesh = mesh_of_its_own(world)
    for block in core.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(core, mesh=mesh)


def wrap(core, pattern, world):
    """The model the step runs: DDP for the DDP patterns, DTensor or FSDP2
    modules for theirs, else `core` (its gradients averaged with
    dist.all_reduce after backward)."""
    if pattern == "dtensor_tp":
        tensor_parallel(core, world)
    elif pattern == "fsdp2":
        fully_sharded(core, world)
    if pattern not in DDP:
        return core
    from torch.nn.parallel import DistributedDataParallel
    # Small buckets: several all-reduces per backward, completing on gloo's
    # threads while backward goes on.
    dist._DEFAULT_FIRST_BUCKET_BYTES = 4000
    model = DistributedDataParallel(core, bucket_cap_mb=0.01,
                                    find_unused_parameters=pattern == "ddp_unused")
    if pattern == "ddp_static_graph":
        model._set_static_graph()
    if pattern == "ddp_python_hook":
        model.register_comm_hook(dist.get_world_size(), averaging_hook)
    return model


# Torch 1.13 deadlocks at exit when DDP's gloo group is destroyed (its
# destructor joins gloo's threads holding the GIL) while a gloo thread waits
# for the GIL: to free a tensor made in Python that a work held last, or the
# Python callback it has just run. A third of the runs of torch's own
# fp16_compress_hook hung so, OpGuard or not. The hook's tensors are kept
# until the process exits, and the ranks meet before teardown (see run).
_communicated = []


def averaging_hook(world, bucket):
    """Shaped like torch's fp16_compress_hook (all-reduce a copy of the
    bucket, copy the result back in a callback), in the bucket's dtype:
    gloo in torch 2.x cannot all-reduce float16."""
    tensor = bucket.buffer() / world
    _communicated.append(tensor)

    def copy_back(fut):
        buffer = bucket.buffer()
        buffer.copy_(fut.value()[0])
        return buffer

    return dist.all_reduce(tensor, async_op=True).get_future().then(copy_back)


def checkpointed(core, reentrant):
    from torch.utils.checkpoint import checkpoint
    for block in core.blocks:
        block.forward = (lambda f: lambda x: checkpoint(f, x, use_reentrant=reentrant))(
            block.forward)


class Tokens(torch.utils.data.Dataset):
    def __init__(self, rank):
        self.data = torch.randint(0, 64, (64, 16), generator=torch.Generator().manual_seed(rank))

    def __len__(self):
        return len(self.data)

    def __getitem__(self, i):
        return self.data[i]


# The models trained, kept to the end: on torch 1.13 a DDP model's reducer,
# freed while the group lives on, can hang as at exit (see _communicated).
# On torch 2.x they go before the group is destroyed, so that their
# references to it do not keep it and gloo's threads alive into the
# interpreter's finalization (see before_process_groups).
_models = []
TORCH_2 = int(torch.__version__.split(".")[0]) >= 2


def run(rank, world, patterns, fault):
    """Trains each of `patterns` in turn in one process group (a job per
    pattern costs a torch import and a rendezvous per rank: most of the time
    of a 3-step job)."""
    before_process_groups()
    dist.init_process_group("gloo", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    for pattern in patterns:
        train(rank, world, pattern, fault)
        dist.barrier()
    dist.barrier()  # gloo's threads take the GIL while this rank waits (see _communicated)
    if TORCH_2:
        _models.clear()
        gc.collect()
    dist.destroy_process_group()


def train(rank, world, pattern, fault):
    torch.manual_seed(1234)
    core = TinyGPT(d_model=32)
    model = wrap(core, pattern, world)
    _models.append(model)
    if pattern.startswith("checkpoint") and pattern != "checkpoint_save":
        checkpointed(core, reentrant=pattern == "checkpoint_reentrant")
    if pattern == "compiled":
        for block in core.blocks:
            block.compile()
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    # Tensor-parallel ranks and pipeline stages work on the same batch; others
    # each on their own.
    same_batch = pattern in ("dtensor_tp", "pipeline")
    gen = torch.Generator().manual_seed(100 + (0 if same_batch else rank))
    batches = None
    if pattern == "dataloader":
        batches = iter(torch.utils.data.DataLoader(Tokens(rank), batch_size=4, num_workers=2))
    for step in range(3):
        idx = next(batches) if batches else torch.randint(0, 64, (4, 16), generator=gen)
        target = torch.roll(idx, -1, dims=1)
        if fault == f"shardflip:{rank}:{step}" and pattern in ("dtensor_tp", "fsdp2"):
            shard = core.blocks[0].mlp[0].weight if pattern == "dtensor_tp" else core.tok.weight
            flip_bit_in_memory(shard.to_local(), index=3, bit=22)
        if fault == f"shardflip:{rank}:{step}" and pattern in ("checkpoint", "autocast", "pipeline"):
            block = core.blocks[1 if pattern == "pipeline" else 0]
            flip_bit_in_memory(block.mlp[0].weight, index=3, bit=22)
        if pattern == "compiled" and fault == f"compiledreorder:{rank}:{step}":
            core.blocks[0].attn.fault = "reorder"
        if pattern == "ddp_no_sync" and step == 0:
            with model.no_sync():
                F.cross_entropy(model(idx).view(-1, 64), target.view(-1)).backward()
        if pattern == "pipeline":
            opt.zero_grad()
            loss = pipeline_step(core, rank, idx, target)
        else:
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=pattern == "autocast"):
                logits = model(idx)
            loss = F.cross_entropy(logits.float().view(-1, 64), target.view(-1))
            opt.zero_grad()
            loss.backward()
        if pattern == "grad_penalty":
            emb = core.tok(idx)
            grad, = torch.autograd.grad(emb.pow(2).sum(), emb, create_graph=True)
            (grad.pow(2).mean() * 0.01).backward()
        if pattern == "functional":
            functional_average(list(model.parameters()), world,
                               flip=fault == f"shardflip:{rank}:{step}")
        elif pattern not in DDP + ("dtensor_tp", "fsdp2", "pipeline"):
            for p in model.parameters():
                dist.all_reduce(p.grad)
                p.grad /= world
        if pattern == "side_thread":
            side = threading.Thread(target=lambda: (torch.ones(8, 8) @ torch.ones(8, 8)).sum())
            side.start()
            side.join()
        if pattern == "clip":
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        if pattern == "checkpoint_save":
            torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, io.BytesIO())
        if pattern == "objects":
            gathered = [None] * world
            dist.all_gather_object(gathered, {"rank": rank, "loss": round(float(loss), 4)})
            box = [step] if rank == 0 else [None]
            dist.broadcast_object_list(box, src=0)
        if pattern == "torchscript":
            scripted = torch.jit.script(torch.nn.Sequential(torch.nn.Linear(64, 8),
                                                            torch.nn.ReLU()))
            scripted(logits.detach().view(-1, 64)).sum()
        opt.step()
        if pattern == "eval":
            with torch.no_grad():
                model.eval()
                model(idx)
                model.train()
        if pattern == "functional":  # the mean loss, all-reduced as DTensor's loss parallel does
            import torch.distributed._functional_collectives as funcol
            loss = funcol.all_reduce(loss.detach(), "sum", dist.group.WORLD) / world
        if rank == 0:
            print(f"{pattern} step {step} loss {loss.item():.6f}", flush=True)


if __name__ == "__main__":
    if sys.argv[1:] == ["--missing"]:
        import json
        print(json.dumps(missing_features()))
        sys.exit(0)
    chosen = sys.argv[1].split(",") if len(sys.argv) in (2, 3) else []
    if not chosen or any(p not in PATTERNS for p in chosen):
        sys.exit(f"usage: train_patterns.py PATTERN[,PATTERN...] [FAULT] ({', '.join(PATTERNS)})")
    spawn_ranks(run, 2, chosen, sys.argv[2] if len(sys.argv) == 3 else "")
