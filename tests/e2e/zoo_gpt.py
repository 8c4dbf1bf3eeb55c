"""Training code for the torch 2.x bug zoo (test_zoo_gpt.py), written the way
nanoGPT- and Megatron-style jobs are, on 2 gloo ranks on the CPU:

--mode ddp       nanoGPT: SDPA attention, blocks under non-reentrant
                 torch.utils.checkpoint with dropout, DDP, gradient
                 accumulation with no_sync, clip_grad_norm_, a warmup + cosine
                 LR schedule set by hand, AdamW(foreach=True) with decay and
                 no-decay parameter groups; optionally a hand-written comm hook.
--mode fsdp      the same GPT under FSDP2 (fully_shard per block and the root).
--mode tp        the same GPT with DTensor tensor parallelism
                 (parallelize_module, ColwiseParallel/RowwiseParallel).
--mode megatron  hand-written Megatron-style tensor + sequence parallelism:
                 Column/Row parallel layers whose region mappings are custom
                 autograd Functions issuing all_gather / reduce_scatter /
                 all_to_all in forward and backward, an MoE layer (one expert
                 per rank) dispatching with all_to_all_single, sequence-parallel
                 gradients all-reduced by hand, AdamW(fused=True).

--fault NAME:RANK:STEP plants a bug (FAULTS) on RANK (-1: every rank) from STEP
on; --variant NAME makes a benign change (VARIANTS) that must compare
identical. Both are this script's own code; OpGuard is never told.

--digests DIR: each rank writes DIR/rank<R>.json, the sha256 of its bytes at
each phase: its parameters after init ("init", step -1), and per step the
first micro-batch's loss ("loss"), the gradients the optimizer reads
("grads") and the parameters after the update ("params"), each rank's local
shards. They are read from memory (no aten op), so they add nothing to the
recorded trace, and they tell independently of OpGuard at which step and on
which rank the values first differ.

--oplog DIR: each rank writes DIR/rank<R>.oplog.json, a positional log of every op
(zoo_oplog.py), for runs without OpGuard: a second baseline.

Launch: python3 zoo_gpt.py --spawn 2 --mode ddp [--steps 2] [--fault ...] [--variant ...]
"""
import argparse
import contextlib
import ctypes
import datetime
import hashlib
import json
import math
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from fault_plan import Plan
from train_gpt import before_process_groups, spawn_ranks

FAULTS = {
    # ddp
    "sdpa_scale": "one rank's attention passes scale=1/head_dim (a muP-style setting) to SDPA",
    "accum_divisor": "the loss is divided by accumulation steps times world size on one rank",
    "ckpt_rng": "checkpoint(preserve_rng_state=False) around blocks with dropout: the "
                "recompute draws another dropout mask",
    "lr_warmup": "the warmup formula is off by one (lr 0 at the first step), every rank",
    "clip_max": "one rank clips gradients to another max_norm (its config differs)",
    "hook_div": "a hand-written DDP comm hook divides by twice the world size on one rank",
    "double_average": "gradients averaged by hand after DDP has averaged them, every rank",
    # fsdp
    "shard_flip": "one bit of a parameter shard flips in memory on one rank",
    "seed": "the model is initialised with a per-rank seed (seed + rank) on one rank",
    # tp
    "tp_data": "one tensor-parallel rank reads another batch than its peer",
    "tp_flip": "one bit of a local weight shard flips in memory on one rank",
    # megatron
    "sp_narrow": "the sequence-parallel scatter keeps another rank's chunk on one rank",
    "moe_combine": "the MoE combine weights expert outputs by router logits, not probabilities",
    "a2a_flip": "one bit of the tokens an expert receives by all_to_all flips on one rank",
    "lr_cosine": "the cosine decay runs over another number of steps, every rank",
    "sp_grad_sync": "the LayerNorm gradients of the sequence-parallel region are not "
                    "all-reduced, every rank",
}
VARIANTS = {
    # ddp
    "sdpa_explicit_scale": "SDPA given scale=1/sqrt(head_dim), its default, explicitly",
    "accum_mul": "the loss multiplied by 1/accumulation steps instead of divided",
    "ckpt_off": "no activation checkpointing (the recompute gave the same bits)",
    "lr_lambda": "the same LR schedule through torch.optim.lr_scheduler.LambdaLR",
    "clip_loop": "clip_grad_norm_(foreach=False): a norm and a mul_ per gradient",
    "comm_hook": "a hand-written DDP comm hook that averages as DDP does",
    "grad_norm_log": "each gradient's norm logged before the update",
    # fsdp
    "reshard": "fully_shard(reshard_after_forward=False)",
    "fsdp_grad_norm_log": "each gradient shard's norm logged before the update",
    # tp
    "tp_reorder": "q, k and v split into heads in another order",
    "tp_log": "the loss and activation statistics logged each step",
    "tp_grad_norm_log": "each gradient's norm logged before the per-parameter AdamW step",
    # megatron
    "mg_logging": "the loss averaged over ranks by an extra all_reduce and logged",
    "grad_sync_reversed": "the sequence-parallel gradients all-reduced in reverse order",
    "moe_reorder": "the router's argmax taken before its softmax (independent work reordered)",
}
MODES = ("ddp", "fsdp", "tp", "megatron")

VOCAB, D_MODEL, HEADS, LAYERS, SEQ, BATCH = 64, 32, 2, 2, 16, 2
ACCUM = 2  # micro-batches per step (ddp)
SEED = 1234


PLAN = None


class Digests:
    """sha256 of local tensor bytes per phase, read so that no aten op is run
    (nothing is added to the recorded trace)."""

    def __init__(self, folder, rank):
        self.path = os.path.join(folder, f"rank{rank}.json") if folder else None
        self.entries = []

    @staticmethod
    def local_bytes(t):
        """The bytes of `t` (a DTensor's: its shard on this rank), read from
        memory: not through numpy, which would make the storage unresizable
        (FSDP2 resizes storages)."""
        t = getattr(t, "_local_tensor", t)
        assert t.is_contiguous()
        return ctypes.string_at(t.data_ptr(), t.numel() * t.element_size())

    def add(self, step, phase, tensors):
        if not self.path:
            return
        h = hashlib.sha256()
        for t in tensors:
            if t is not None:
                h.update(self.local_bytes(t))
        self.entries.append({"step": step, "phase": phase, "digest": h.hexdigest()})

    def write(self):
        if self.path:
            with open(self.path, "w") as f:
                json.dump(self.entries, f)


def flip_one_bit(tensor, bit):
    """Silent data corruption: one bit of the first element (of this rank's
    shard) flips in memory."""
    with torch.no_grad():
        local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
        local.view(torch.int32).view(-1)[0].bitwise_xor_(1 << bit)


# ---- the nanoGPT-style model (ddp, fsdp, tp) ---------------------------------


class CausalSelfAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.q = nn.Linear(D_MODEL, D_MODEL)
        self.k = nn.Linear(D_MODEL, D_MODEL)
        self.v = nn.Linear(D_MODEL, D_MODEL)
        self.c_proj = nn.Linear(D_MODEL, D_MODEL)
        self.head_dim = D_MODEL // HEADS

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.q(x), self.k(x), self.v(x)
        if PLAN.variant == "tp_reorder":
            k = k.view(b, t, -1, self.head_dim).transpose(1, 2)
            v = v.view(b, t, -1, self.head_dim).transpose(1, 2)
            q = q.view(b, t, -1, self.head_dim).transpose(1, 2)
        else:
            q = q.view(b, t, -1, self.head_dim).transpose(1, 2)
            k = k.view(b, t, -1, self.head_dim).transpose(1, 2)
            v = v.view(b, t, -1, self.head_dim).transpose(1, 2)
        if PLAN.on("sdpa_scale"):
            scale = 1.0 / self.head_dim
        elif PLAN.variant == "sdpa_explicit_scale":
            scale = 1.0 / math.sqrt(self.head_dim)
        else:
            scale = None
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
        y = y.transpose(1, 2).contiguous().view(b, t, -1)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self, dropout):
        super().__init__()
        self.c_fc = nn.Linear(D_MODEL, 4 * D_MODEL)
        self.c_proj = nn.Linear(4 * D_MODEL, D_MODEL)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(F.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, dropout):
        super().__init__()
        self.ln_1 = nn.LayerNorm(D_MODEL)
        self.attn = CausalSelfAttention()
        self.ln_2 = nn.LayerNorm(D_MODEL)
        self.mlp = MLP(dropout)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, dropout=0.0, checkpointed=False):
        super().__init__()
        self.wte = nn.Embedding(VOCAB, D_MODEL)
        self.wpe = nn.Embedding(SEQ, D_MODEL)
        self.h = nn.ModuleList(Block(dropout) for _ in range(LAYERS))
        self.ln_f = nn.LayerNorm(D_MODEL)
        self.lm_head = nn.Linear(D_MODEL, VOCAB, bias=False)
        self.checkpointed = checkpointed

    def forward(self, idx):
        pos = torch.arange(idx.shape[1])
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            if self.checkpointed:
                x = torch.utils.checkpoint.checkpoint(
                    block, x, use_reentrant=False,
                    preserve_rng_state=not PLAN.on("ckpt_rng"))
            else:
                x = block(x)
        return self.lm_head(self.ln_f(x))


def decay_groups(model, weight_decay):
    """nanoGPT's parameter groups: matrices decay, biases and norms do not."""
    params = [p for p in model.parameters() if p.requires_grad]
    return [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]


MAX_LR, MIN_LR, WARMUP, DECAY_STEPS = 3e-3, 3e-4, 2, 20


def warmup_cosine_factor(it):
    """nanoGPT's schedule as a factor of the peak LR: linear warmup, then
    cosine decay to MIN_LR."""
    if it < WARMUP:
        return (it + 1) / (WARMUP + 1) if not PLAN.on("lr_warmup") else it / WARMUP
    ratio = (it - WARMUP) / (DECAY_STEPS - WARMUP)
    return (MIN_LR + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (MAX_LR - MIN_LR)) / MAX_LR


def averaging_hook(state, bucket):
    """A DDP comm hook averaging a bucket as DDP does: divide, then sum."""
    buffer = bucket.buffer()
    world = dist.get_world_size()
    buffer.div_(world if not PLAN.on("hook_div") else 2 * world)
    work = dist.all_reduce(buffer, async_op=True)
    return work.get_future().then(lambda fut: fut.value()[0])


def batch(gen):
    idx = torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=gen)
    return idx[:, :-1], idx[:, 1:]


def train_ddp(rank, world, steps, digests):
    from torch.nn.parallel import DistributedDataParallel as DDP
    torch.manual_seed(SEED)
    raw = GPT(dropout=0.1, checkpointed=PLAN.variant != "ckpt_off")
    digests.add(-1, "init", raw.parameters())
    model = DDP(raw)
    if PLAN.variant == "comm_hook" or PLAN.fault == "hook_div":
        model.register_comm_hook(None, averaging_hook)
    opt = torch.optim.AdamW(decay_groups(raw, 0.1), lr=MAX_LR, betas=(0.9, 0.95), foreach=True)
    schedule = None
    if PLAN.variant == "lr_lambda":
        schedule = torch.optim.lr_scheduler.LambdaLR(opt, warmup_cosine_factor)
    gen = torch.Generator().manual_seed(100 + rank)
    for step in range(steps):
        PLAN.step = step
        if schedule is None:
            lr = MAX_LR * warmup_cosine_factor(step)
            for group in opt.param_groups:
                group["lr"] = lr
        for micro in range(ACCUM):
            x, y = batch(gen)
            sync = contextlib.nullcontext() if micro == ACCUM - 1 else model.no_sync()
            with sync:
                logits = model(x)
                loss = F.cross_entropy(logits.view(-1, VOCAB), y.reshape(-1))
                if PLAN.variant == "accum_mul":
                    loss = loss * (1.0 / ACCUM)
                else:
                    loss = loss / (ACCUM if not PLAN.on("accum_divisor") else ACCUM * world)
                if micro == 0:
                    digests.add(step, "loss", [loss])
                loss.backward()
        params = list(raw.parameters())
        if PLAN.on("double_average"):
            for p in params:
                p.grad.div_(world)
        digests.add(step, "grads", [p.grad for p in params])
        if PLAN.variant == "grad_norm_log":
            norms = [p.grad.norm() for p in params]
            del norms
        max_norm = 0.05 if not PLAN.on("clip_max") else 0.04
        torch.nn.utils.clip_grad_norm_(params, max_norm, foreach=PLAN.variant != "clip_loop")
        opt.step()
        if schedule is not None:
            schedule.step()
        opt.zero_grad(set_to_none=True)
        digests.add(step, "params", params)


def train_fsdp(rank, world, steps, digests):
    from torch.distributed.fsdp import fully_shard
    torch.manual_seed(SEED + (rank if PLAN.on("seed") else 0))
    model = GPT()
    digests.add(-1, "init", model.parameters())
    reshard = PLAN.variant != "reshard"
    for block in model.h:
        fully_shard(block, reshard_after_forward=reshard)
    fully_shard(model, reshard_after_forward=reshard)
    opt = torch.optim.AdamW(decay_groups(model, 0.1), lr=MAX_LR, foreach=True)
    gen = torch.Generator().manual_seed(100 + rank)
    for step in range(steps):
        PLAN.step = step
        if PLAN.on("shard_flip"):
            flip_one_bit(model.h[0].mlp.c_fc.weight, 20)
        x, y = batch(gen)
        logits = model(x)
        loss = F.cross_entropy(logits.view(-1, VOCAB), y.reshape(-1))
        digests.add(step, "loss", [loss])
        loss.backward()
        params = list(model.parameters())
        digests.add(step, "grads", [p.grad for p in params])
        if PLAN.variant == "fsdp_grad_norm_log":
            norms = [p.grad.to_local().norm() for p in params]
            del norms
        opt.step()
        opt.zero_grad(set_to_none=True)
        digests.add(step, "params", params)


def train_tp(rank, world, steps, digests):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   parallelize_module)
    torch.manual_seed(SEED)
    model = GPT()
    digests.add(-1, "init", model.parameters())
    mesh = init_device_mesh("cpu", (world,))
    plan = {"attn.q": ColwiseParallel(), "attn.k": ColwiseParallel(),
            "attn.v": ColwiseParallel(), "attn.c_proj": RowwiseParallel(),
            "mlp.c_fc": ColwiseParallel(), "mlp.c_proj": RowwiseParallel()}
    for block in model.h:
        parallelize_module(block, mesh, plan)
    # Per-parameter AdamW: DTensor shards and replicated tensors side by side.
    opt = torch.optim.AdamW(model.parameters(), lr=MAX_LR, foreach=False)
    # Tensor-parallel ranks must read the same batch.
    gen = torch.Generator().manual_seed(100)
    rank_gen = torch.Generator().manual_seed(100 + rank)
    for step in range(steps):
        PLAN.step = step
        if PLAN.on("tp_flip"):
            flip_one_bit(model.h[1].mlp.c_fc.weight, 20)
        x, y = batch(gen if not PLAN.on("tp_data") else rank_gen)
        logits = model(x)
        loss = F.cross_entropy(logits.view(-1, VOCAB), y.reshape(-1))
        digests.add(step, "loss", [loss])
        if PLAN.variant == "tp_log":
            stats = torch.stack([logits.mean(), logits.std(), loss.detach()])
            print(f"rank {rank} step {step} stats {stats.tolist()}", flush=True)
        loss.backward()
        params = list(model.parameters())
        digests.add(step, "grads", [p.grad for p in params])
        if PLAN.variant == "tp_grad_norm_log":
            norms = [p.grad.norm() for p in params]
            del norms
        opt.step()
        opt.zero_grad(set_to_none=True)
        digests.add(step, "params", params)


# ---- Megatron-style tensor + sequence parallelism ------------------------------
# Activations are [sequence, batch, hidden]; inside a block the sequence is
# split over the ranks (sequence parallelism) and the hidden dimension of the
# linear layers' weights (tensor parallelism).


def gather_sequence(x):
    out = torch.empty((x.shape[0] * dist.get_world_size(), *x.shape[1:]), dtype=x.dtype)
    dist.all_gather_into_tensor(out, x.contiguous())
    return out


def reduce_scatter_sequence(x):
    out = torch.empty((x.shape[0] // dist.get_world_size(), *x.shape[1:]), dtype=x.dtype)
    dist.reduce_scatter_tensor(out, x.contiguous())
    return out


def own_sequence_chunk(x):
    world, rank = dist.get_world_size(), dist.get_rank()
    chunk = x.shape[0] // world
    own = rank if not PLAN.on("sp_narrow") else world - 1 - rank
    return x.narrow(0, own * chunk, chunk).contiguous()


class ScatterToSequence(torch.autograd.Function):
    """Keeps this rank's chunk of the sequence; backward gathers it."""

    @staticmethod
    def forward(ctx, x):
        return own_sequence_chunk(x)

    @staticmethod
    def backward(ctx, grad):
        return gather_sequence(grad)


class GatherFromSequence(torch.autograd.Function):
    """All-gathers the sequence. Backward: reduce-scatter where each rank's
    gradient is a partial sum (a column-parallel layer follows), else this
    rank's chunk (every rank computed the whole gradient)."""

    @staticmethod
    def forward(ctx, x, grad_is_partial):
        ctx.grad_is_partial = grad_is_partial
        return gather_sequence(x)

    @staticmethod
    def backward(ctx, grad):
        if ctx.grad_is_partial:
            return reduce_scatter_sequence(grad), None
        return own_sequence_chunk(grad), None


class ReduceScatterToSequence(torch.autograd.Function):
    """Sums the row-parallel partial outputs, keeping this rank's sequence chunk."""

    @staticmethod
    def forward(ctx, x):
        return reduce_scatter_sequence(x)

    @staticmethod
    def backward(ctx, grad):
        return gather_sequence(grad)


class AllToAll(torch.autograd.Function):
    """Expert-parallel dispatch: equal splits, sent and returned by all_to_all_single."""

    @staticmethod
    def forward(ctx, x):
        out = torch.empty_like(x)
        dist.all_to_all_single(out, x.contiguous())
        return out

    @staticmethod
    def backward(ctx, grad):
        out = torch.empty_like(grad)
        dist.all_to_all_single(out, grad.contiguous())
        return out


def shard_of(full, dim):
    """This rank's slice of a weight initialised whole on every rank (the same
    seed everywhere), as Megatron initialises its master weights."""
    return nn.Parameter(full.chunk(dist.get_world_size(), dim)[dist.get_rank()].clone())


def master_weight(rows, cols):
    w = torch.empty(rows, cols)
    nn.init.normal_(w, std=0.02)
    return w


def sequence_parallel(*params):
    """Marks parameters whose gradients are partial sums over the sequence chunks."""
    for p in params:
        p.sequence_parallel = True


class ColumnParallelLinear(nn.Module):
    def __init__(self, d_in, d_out):
        super().__init__()
        self.weight = shard_of(master_weight(d_out, d_in), 0)
        self.bias = nn.Parameter(torch.zeros(d_out // dist.get_world_size()))

    def forward(self, x):
        x = GatherFromSequence.apply(x, True)
        return F.linear(x, self.weight, self.bias)


class RowParallelLinear(nn.Module):
    def __init__(self, d_in, d_out):
        super().__init__()
        self.weight = shard_of(master_weight(d_out, d_in), 1)
        self.bias = nn.Parameter(torch.zeros(d_out))
        sequence_parallel(self.bias)

    def forward(self, x):
        y = ReduceScatterToSequence.apply(F.linear(x, self.weight))
        return y + self.bias


class ParallelBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1 = nn.LayerNorm(D_MODEL)
        self.qkv = ColumnParallelLinear(D_MODEL, 3 * D_MODEL)
        self.proj = RowParallelLinear(D_MODEL, D_MODEL)
        self.ln_2 = nn.LayerNorm(D_MODEL)
        self.fc1 = ColumnParallelLinear(D_MODEL, 4 * D_MODEL)
        self.fc2 = RowParallelLinear(4 * D_MODEL, D_MODEL)
        sequence_parallel(*self.ln_1.parameters(), *self.ln_2.parameters())
        self.head_dim = D_MODEL // HEADS

    def forward(self, x):
        qkv = self.qkv(self.ln_1(x))
        s, b, _ = qkv.shape
        qkv = qkv.view(s, b, -1, 3 * self.head_dim).permute(1, 2, 0, 3)
        q, k, v = qkv.chunk(3, dim=-1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.permute(2, 0, 1, 3).reshape(s, b, -1))
        return x + self.fc2(F.gelu(self.fc1(self.ln_2(x))))


class MoE(nn.Module):
    """Top-1 routing to one expert per rank. Each rank's tokens go into a slot
    per (expert, token) (capacity = tokens: none dropped), all_to_all_single
    brings each expert the slots meant for it, and the outputs go back the
    same way."""

    def __init__(self):
        super().__init__()
        world, rank = dist.get_world_size(), dist.get_rank()
        self.ln = nn.LayerNorm(D_MODEL)
        self.router = nn.Linear(D_MODEL, world, bias=False)
        sequence_parallel(*self.ln.parameters(), self.router.weight)
        w1 = torch.stack([master_weight(D_MODEL, 2 * D_MODEL) for _ in range(world)])
        w2 = torch.stack([master_weight(2 * D_MODEL, D_MODEL) for _ in range(world)])
        self.w1, self.w2 = nn.Parameter(w1[rank].clone()), nn.Parameter(w2[rank].clone())

    def forward(self, x):
        s, b, d = x.shape
        tokens = self.ln(x).reshape(-1, d)
        n, experts = tokens.shape[0], dist.get_world_size()
        logits = self.router(tokens)
        if PLAN.variant == "moe_reorder":
            expert = logits.argmax(dim=-1)
            probs = torch.softmax(logits, dim=-1)
        else:
            probs = torch.softmax(logits, dim=-1)
            expert = logits.argmax(dim=-1)
        slots = expert * n + torch.arange(n)
        send = torch.zeros(experts * n, d).index_copy(0, slots, tokens)
        received = AllToAll.apply(send)
        if PLAN.on("a2a_flip"):
            flip_one_bit(received, 22)
        hidden = F.gelu(torch.matmul(received, self.w1))
        returned = AllToAll.apply(torch.matmul(hidden, self.w2))
        gate = (probs if not PLAN.on("moe_combine") else logits).gather(-1, expert.unsqueeze(-1))
        out = returned.index_select(0, slots) * gate
        return x + out.view(s, b, d)


class MegatronGPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(VOCAB, D_MODEL)
        self.wpe = nn.Parameter(torch.randn(SEQ, D_MODEL) * 0.02)
        self.blocks = nn.ModuleList(ParallelBlock() for _ in range(LAYERS))
        self.moe = MoE()
        self.ln_f = nn.LayerNorm(D_MODEL)
        self.head = nn.Linear(D_MODEL, VOCAB, bias=False)

    def forward(self, idx):
        x = (self.wte(idx) + self.wpe).transpose(0, 1)  # [s, b, d]
        x = ScatterToSequence.apply(x)
        for block in self.blocks:
            x = block(x)
        x = self.moe(x)
        x = GatherFromSequence.apply(x, False)
        return self.head(self.ln_f(x)).transpose(0, 1)


def allreduce_sequence_parallel_grads(model):
    """Megatron's all-reduce of the gradients that are partial sums over the
    sequence chunks (LayerNorms, row-parallel biases, the router)."""
    grads = [(name, p.grad) for name, p in model.named_parameters()
             if getattr(p, "sequence_parallel", False)]
    if PLAN.variant == "grad_sync_reversed":
        grads.reverse()
    for name, grad in grads:
        if PLAN.on("sp_grad_sync") and ".ln_" in name:
            continue
        dist.all_reduce(grad)


def megatron_lr(it):
    """Cosine decay from MAX_LR to MIN_LR over DECAY_STEPS (no warmup)."""
    decay_steps = DECAY_STEPS if not PLAN.on("lr_cosine") else DECAY_STEPS // 2
    ratio = min(it / decay_steps, 1.0)
    return MIN_LR + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (MAX_LR - MIN_LR)


def train_megatron(rank, world, steps, digests):
    torch.manual_seed(SEED)
    model = MegatronGPT()
    digests.add(-1, "init", model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=MAX_LR, fused=True)
    gen = torch.Generator().manual_seed(100)  # one tensor-parallel group: one batch
    for step in range(steps):
        PLAN.step = step
        for group in opt.param_groups:
            group["lr"] = megatron_lr(step)
        x, y = batch(gen)
        logits = model(x)
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1))
        digests.add(step, "loss", [loss])
        if PLAN.variant == "mg_logging":
            logged = loss.detach().clone()
            dist.all_reduce(logged)
            if rank == 0:
                print(f"step {step} loss {logged.item() / world:.6f}", flush=True)
        loss.backward()
        allreduce_sequence_parallel_grads(model)
        params = list(model.parameters())
        digests.add(step, "grads", [p.grad for p in params])
        opt.step()
        opt.zero_grad(set_to_none=True)
        digests.add(step, "params", params)


TRAINERS = {"ddp": train_ddp, "fsdp": train_fsdp, "tp": train_tp, "megatron": train_megatron}


def train(rank, world, mode, steps, fault, variant, digest_dir, oplog_dir):
    global PLAN
    before_process_groups()
    dist.init_process_group("gloo", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    PLAN = Plan(fault, variant, rank)
    digests = Digests(digest_dir, rank)
    oplog = None
    if oplog_dir:  # the positional baseline (zoo_oplog.py), for runs without OpGuard
        from zoo_oplog import OpLog
        oplog = OpLog(PLAN)
    with oplog or contextlib.nullcontext():
        TRAINERS[mode](rank, world, steps, digests)
    digests.write()
    if oplog:
        oplog.write(os.path.join(oplog_dir, f"rank{rank}.oplog.json"))
    dist.barrier()
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=MODES, required=True)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--fault", default="",
                        help="NAME:RANK:STEP, NAME one of " + ", ".join(FAULTS))
    parser.add_argument("--variant", default="", help="one of " + ", ".join(VARIANTS))
    parser.add_argument("--digests", default="", help="folder for each rank's digests")
    parser.add_argument("--oplog", default="",
                        help="folder for each rank's positional op log (zoo_oplog.py)")
    parser.add_argument("--spawn", type=int, default=2)
    args = parser.parse_args()
    if args.fault and args.fault.split(":")[0] not in FAULTS:
        parser.error(f"unknown fault {args.fault!r}")
    if args.variant and args.variant not in VARIANTS:
        parser.error(f"unknown variant {args.variant!r}")
    spawn_ranks(train, args.spawn, args.mode, args.steps, args.fault, args.variant, args.digests,
                args.oplog)


if __name__ == "__main__":
    main()
