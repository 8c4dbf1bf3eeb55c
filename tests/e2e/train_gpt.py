"""A small GPT-style model trained with torch.distributed (gloo, CPU).

The end-to-end tests train it under OPGUARD=1 and inject faults *here*, in the
training code, never in OpGuard. RANK selects the one rank that misbehaves:
  --fault bitflip:RANK:STEP  flip one bit of one gradient element in memory on
                             RANK after backward at STEP (no op does it: like
                             silent data corruption)
  --fault reorder:RANK       attention scales after the product instead of
                             before (a changed computation, same source line)
  --fault logging:RANK       extra ops that only observe values (norm logging)
  --fault swap:RANK          the token and position embeddings are computed
                             in the other order (independent computations,
                             same source lines)
  --fault sdc:RANK:STEP      flip one bit of one *reduced* gradient element on
                             RANK after the all-reduce at STEP (one replica's
                             copy corrupted: every collective agrees, the
                             replicas part in the optimizer's step)
  --fault desync:RANK:STEP   RANK broadcasts from the wrong root at STEP (a
                             desynchronized collective; the job then times out)
  --fault wflip:RANK:STEP    flip one bit of one output-layer weight in memory
                             on RANK before the forward of STEP (corrupted
                             parameter memory: its gradients reach the other
                             ranks through the all-reduce)
  --fault race:RANK:STEP     (--device cuda) a stream race: before the forward
                             of STEP, RANK scales the output-layer weight on a
                             side stream that first sleeps, with no
                             synchronisation with the stream the forward
                             reads it on (the write lands during or after
                             the forward, at a time no two runs agree on)

Launch: torchrun --nproc_per_node 4 train_gpt.py --steps 3, or
        python3 train_gpt.py --spawn 4 --steps 3 (torch.multiprocessing.spawn).
--device cuda trains on the GPU (every rank on cuda:LOCAL_RANK modulo the
device count, so several ranks may share one GPU; gloo moves CUDA tensors):
the same ops, data and faults as on the CPU (scripts/gpu-check.sh).
--backend nccl: the process group is NCCL's (CUDA; one GPU holds one rank).
"""
import argparse
import contextlib
import ctypes
import datetime
import json
import math
import os
import random
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

# A rank killed by a fatal signal (an abort in C++ code at exit, say) prints
# the native stack of each of its threads (c10's handler), then Python's
# fault handler its Python frames: what tells such an abort's origin.
if hasattr(torch._C, "_set_print_stack_traces_on_fatal_signal"):
    torch._C._set_print_stack_traces_on_fatal_signal(True)


def before_process_groups():
    """Imports torch._dynamo before any process group exists. In torch 2.x
    its first import (torch.optim's first zero_grad or step makes it) takes
    references to the groups that exist then, which destroy_process_group
    does not drop: the groups and gloo's threads outlive it, into the
    interpreter's finalization, where a gloo thread freeing a tensor that
    Python made takes the GIL, is ended by Python and aborts the rank
    ("terminate called without an active exception"; torch issues 117762
    and 190489). Imported first, it holds none."""
    try:
        import torch._dynamo  # noqa: F401
    except ImportError:  # torch 1.x
        pass


def free_port():
    """A TCP port nothing listens on now (the rendezvous port of a spawned
    job: a fixed or pid-derived one can collide with a concurrent test)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def to_device(t, device):
    """`t` on `device`; on the CPU `t` itself, with no aten::to recorded."""
    return t if device.type == "cpu" else t.to(device)


def on_device_of(t):
    """Factory keyword arguments that put a new tensor beside `t`: none on the
    CPU, so that the CPU run calls exactly the ops it always did."""
    return {} if t.device.type == "cpu" else {"device": t.device}


def spawn_ranks(fn, world, *args):
    """Runs fn(rank, world, *args) on `world` ranks started with
    torch.multiprocessing.spawn, meeting on a free loopback port; in a
    process a launcher started as one rank of `world` (RANK and WORLD_SIZE
    set: torchrun, the tests' harness.run_ranks), runs that rank here."""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        if int(os.environ["WORLD_SIZE"]) != world:
            sys.exit(f"started as one of {os.environ['WORLD_SIZE']} ranks; this job has {world}")
        fn(int(os.environ["RANK"]), world, *args)
        return
    import torch.multiprocessing as mp
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(free_port()))
    mp.spawn(fn, args=(world, *args), nprocs=world, join=True)


class Attention(nn.Module):
    def __init__(self, d_model, heads, fault):
        super().__init__()
        self.heads = heads
        self.q = nn.Linear(d_model, d_model)
        self.k = nn.Linear(d_model, d_model)
        self.v = nn.Linear(d_model, d_model)
        self.out = nn.Linear(d_model, d_model)
        self.fault = fault

    def forward(self, x):
        b, t, c = x.shape
        h = self.heads
        q = self.q(x).view(b, t, h, c // h).transpose(1, 2)
        k = self.k(x).view(b, t, h, c // h).transpose(1, 2)
        v = self.v(x).view(b, t, h, c // h).transpose(1, 2)
        scale = 1.0 / math.sqrt(c // h)
        # "reorder" (wrong order of two operations) scales after the product.
        scores = torch.matmul(q, k.transpose(-2, -1)) * scale if self.fault == "reorder" else torch.matmul(q * scale, k.transpose(-2, -1))
        mask = torch.triu(torch.ones(t, t, dtype=torch.bool, **on_device_of(x)), diagonal=1)
        scores = scores.masked_fill(mask, float("-inf"))
        y = torch.matmul(F.softmax(scores, dim=-1), v)
        y = y.transpose(1, 2).reshape(b, t, c)
        if self.fault == "logging":
            _ = y.detach().norm().item()  # extra ops that only observe values
        return self.out(y)


class Block(nn.Module):
    def __init__(self, d_model, heads, fault):
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = Attention(d_model, heads, fault)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(),
                                 nn.Linear(4 * d_model, d_model))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    def __init__(self, vocab=64, d_model=32, heads=4, layers=2, seq=16, fault=""):
        super().__init__()
        self.tok = nn.Embedding(vocab, d_model)
        self.pos = nn.Embedding(seq, d_model)
        self.blocks = nn.ModuleList(Block(d_model, heads, fault) for _ in range(layers))
        self.fault = fault
        self.ln = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab, bias=False)

    def embed(self, which, idx):
        if which == "tok":
            return self.tok(idx)
        return self.pos(torch.arange(idx.shape[1], **on_device_of(idx)))

    def forward(self, idx):
        # The same source lines in either order: the "swap" fault reorders two
        # independent computations without moving any line. (Not q/k/v: they
        # share their input, so their order changes the order in which
        # autograd sums that input's gradient, which changes its bits.)
        order = ("pos", "tok") if self.fault == "swap" else ("tok", "pos")
        parts = {which: self.embed(which, idx) for which in order}
        x = parts["tok"] + parts["pos"]
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


def flip_bit_in_memory(tensor, index, bit):
    """Flips one bit of one float32 element by writing memory directly: no
    torch op runs, as with silent data corruption. Device memory cannot be
    written from Python: there one int32 xor runs with OpGuard paused, so no
    recorded op does it either."""
    if tensor.device.type != "cpu":
        with opguard_paused():
            tensor.detach().view(-1).view(torch.int32)[index] ^= 1 << bit
        return
    address = tensor.data_ptr() + 4 * index
    word = ctypes.c_uint32.from_address(address)
    word.value ^= 1 << bit


def opguard_paused():
    """opguard.paused(), or nothing when OpGuard is not installed."""
    try:
        import opguard
    except ImportError:
        return contextlib.nullcontext()
    return opguard.paused()


def unsynchronised_write(weight, device):
    """A write on a side stream that does not wait for the current stream
    and that the current stream does not wait for: the bug class of a
    missing wait_stream/record_stream."""
    side = torch.cuda.Stream(device)
    with torch.cuda.stream(side), torch.no_grad():
        torch.cuda._sleep(20_000_000)  # ~10 ms of GPU time: the forward goes ahead
        weight.mul_(1.0 + 2.0 ** -10)


def parse_fault(text):
    parts = text.split(":") if text else [""]
    kind = parts[0]
    rank = int(parts[1]) if len(parts) > 1 else -1
    step = int(parts[2]) if len(parts) > 2 else -1
    return kind, rank, step


def train(rank, world, args):
    torch.manual_seed(1234)  # same init on every rank, like DDP's broadcast would give
    kind, fault_rank, fault_step = parse_fault(args.fault)
    model_fault = kind if kind in ("reorder", "logging", "swap") and fault_rank in (-1, rank) else ""
    device = torch.device(args.device)
    if device.type == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)) % torch.cuda.device_count())
        torch.cuda.set_device(device)
    model = core = TinyGPT(d_model=args.d_model, fault=model_fault)
    if device.type != "cpu":
        core.to(device)
    if args.ddp:  # gradients averaged by DDP's reducer, in C++, during backward
        from torch.nn.parallel import DistributedDataParallel
        model = DistributedDataParallel(core)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(100 + rank)  # each rank its own data shard
    lr_scale = to_device(torch.ones(1), device)
    step_times, step_cpu, step_thread_cpu = [], [], []
    # --alternate-paused: in each pair of steps one (in an order the seed
    # picks, the same on every rank) runs inside opguard.paused(), so that a
    # benchmark compares recorded and unrecorded steps of one process.
    pause_order = random.Random(7)
    paused_steps = []
    for step in range(args.steps):
        if args.alternate_paused and step % 2 == 0:
            pair = [True, False]
            pause_order.shuffle(pair)
        pause = args.alternate_paused and pair[step % 2]
        paused_steps.append(pause)
        with opguard_paused() if pause else contextlib.nullcontext():
            started, started_cpu = time.perf_counter(), time.process_time()
            started_thread_cpu = time.thread_time()
            if kind == "wflip" and rank == fault_rank and step == fault_step:
                flip_bit_in_memory(core.head.weight, index=7, bit=22)
            if kind == "race" and rank == fault_rank and step == fault_step:
                unsynchronised_write(core.head.weight, device)
            # Rank 0 decides the step's learning-rate scale for everyone.
            root = rank if kind == "desync" and rank == fault_rank and step == fault_step else 0
            dist.broadcast(lr_scale, src=root)
            idx = to_device(torch.randint(0, 64, (4, 16), generator=gen), device)
            target = torch.roll(idx, -1, dims=1)
            logits = model(idx)
            loss = F.cross_entropy(logits.view(-1, 64), target.view(-1))
            opt.zero_grad()
            loss.backward()
            if kind == "bitflip" and rank == fault_rank and step == fault_step:
                flip_bit_in_memory(core.head.weight.grad, index=7, bit=22)
            if not args.ddp:
                for p in model.parameters():  # data-parallel gradient average
                    dist.all_reduce(p.grad)
                    p.grad /= world
            if kind == "sdc" and rank == fault_rank and step == fault_step:
                flip_bit_in_memory(core.head.weight.grad, index=7, bit=22)
            opt.step()
            if rank == 0:
                print(f"step {step} loss {loss.item():.6f}", flush=True)
            if device.type == "cuda":
                torch.cuda.synchronize(device)  # the step's GPU work belongs to its time
            step_times.append(time.perf_counter() - started)
            step_cpu.append(time.process_time() - started_cpu)
            step_thread_cpu.append(time.thread_time() - started_thread_cpu)
    if args.times and rank == 0:
        with open(args.times, "w") as f:
            json.dump({"wall": step_times, "cpu": step_cpu, "thread_cpu": step_thread_cpu,
                       "paused": paused_steps}, f)


class HashEveryOutput:
    """The approach of PyTorch's DebugMode for comparison in the overhead
    benchmark: a Python TorchDispatchMode that hashes every op's outputs."""

    def __new__(cls):
        import hashlib
        from torch.utils._python_dispatch import TorchDispatchMode
        from torch.utils._pytree import tree_flatten

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                for t in tree_flatten(out)[0]:
                    if isinstance(t, torch.Tensor) and t.layout == torch.strided:
                        hashlib.blake2b(t.detach().contiguous().numpy().tobytes()).digest()
                return out

        return Mode()


def run_rank(rank, world, args):
    os.environ.setdefault("RANK", str(rank))
    os.environ.setdefault("LOCAL_RANK", str(rank))
    os.environ.setdefault("WORLD_SIZE", str(world))
    if args.backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)) % torch.cuda.device_count())
    before_process_groups()
    dist.init_process_group(args.backend, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=args.timeout))
    try:
        if args.hash_every_output:
            with HashEveryOutput():
                train(rank, world, args)
        else:
            train(rank, world, args)
    finally:
        dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--fault", default="")
    parser.add_argument("--times", default="",
                        help="rank 0 writes its steps' wall times, its process's CPU times "
                             "(all threads) and its training thread's CPU times here")
    parser.add_argument("--d-model", type=int, default=32,
                        help="model width (benchmarks; the tests use the default)")
    parser.add_argument("--hash-every-output", action="store_true",
                        help="hash every op output in a Python TorchDispatchMode (benchmark)")
    parser.add_argument("--alternate-paused", action="store_true",
                        help="run one step of each pair inside opguard.paused() (benchmark: "
                             "recorded against unrecorded steps of one process)")
    parser.add_argument("--ddp", action="store_true",
                        help="wrap the model in DistributedDataParallel instead of "
                             "averaging gradients with dist.all_reduce")
    parser.add_argument("--timeout", type=int, default=60,
                        help="seconds a collective may wait for the other ranks")
    parser.add_argument("--backend", default="gloo", choices=("gloo", "nccl"),
                        help="the process group's backend (nccl: with --device cuda)")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                        help="train on the CPU (the tests) or the GPU (scripts/gpu-check.sh)")
    parser.add_argument("--spawn", type=int, default=0,
                        help="start this many ranks with torch.multiprocessing.spawn")
    args = parser.parse_args()
    if args.spawn:
        import torch.multiprocessing as mp
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(free_port()))
        mp.spawn(run_rank, args=(args.spawn, args), nprocs=args.spawn, join=True)
    else:
        run_rank(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), args)


if __name__ == "__main__":
    main()
