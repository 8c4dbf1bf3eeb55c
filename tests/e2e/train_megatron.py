"""A Megatron-style model on 2 gloo ranks, written the way tensor-parallel
LLM code is: column- and row-parallel linear layers whose region mappings
are custom autograd Functions issuing all_reduce in forward or backward, a
vocabulary-parallel LM head and cross entropy (all_reduces in the loss's
forward), and an MoE layer whose two experts live one per rank, tokens
dispatched to them and back with all_to_all_single. torch.optim's AdamW,
with a decaying and a non-decaying parameter group, runs its foreach
(--optimizer foreach) or fused (--optimizer fused) implementation.

--fault NAME:RANK:STEP plants a bug in this code on RANK from STEP on:
  nodecay  the group that must not decay (biases, LayerNorms) decays: a
           schedule sets the weight decay of every group

--digests prints a digest of every parameter's bytes after each step (what
the tests check their expectations against, without OpGuard).

Launch: python3 train_megatron.py --spawn 2 [--steps 3] [--optimizer foreach]
"""
import argparse
import datetime
import hashlib

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from train_gpt import before_process_groups, spawn_ranks

WEIGHT_DECAY = 0.1
FAULT = ("", -1, 0)


def fault_on(name, rank, step):
    return FAULT[0] == name and FAULT[1] in (-1, rank) and step >= FAULT[2]


class CopyToTensorParallel(torch.autograd.Function):
    """The input of a column-parallel layer: every rank holds all of it, so
    its gradient is the sum of the ranks' partial gradients."""

    @staticmethod
    def forward(ctx, x):
        return x

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous()
        dist.all_reduce(grad)
        return grad


class ReduceFromTensorParallel(torch.autograd.Function):
    """The output of a row-parallel layer: each rank holds a partial sum."""

    @staticmethod
    def forward(ctx, x):
        x = x.contiguous()
        dist.all_reduce(x)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad


class ColumnParallelLinear(nn.Module):
    def __init__(self, d_in, d_out, world, bias=True):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(d_out // world, d_in) * d_in ** -0.5)
        self.bias = nn.Parameter(torch.zeros(d_out // world)) if bias else None

    def forward(self, x):
        return F.linear(CopyToTensorParallel.apply(x), self.weight, self.bias)


class RowParallelLinear(nn.Module):
    def __init__(self, d_in, d_out, world):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(d_out, d_in // world) * d_in ** -0.5)
        self.bias = nn.Parameter(torch.zeros(d_out))

    def forward(self, x):
        return ReduceFromTensorParallel.apply(F.linear(x, self.weight)) + self.bias


class VocabParallelCrossEntropy(torch.autograd.Function):
    """Cross entropy over logits split by vocabulary: the maximum, the
    target's logit and the softmax's sum are all-reduced."""

    @staticmethod
    def forward(ctx, logits, target, rank):
        part = logits.shape[-1]
        logits_max = logits.max(dim=-1)[0]
        dist.all_reduce(logits_max, op=dist.ReduceOp.MAX)
        logits = logits - logits_max.unsqueeze(-1)
        outside = (target < rank * part) | (target >= (rank + 1) * part)
        local_target = target - rank * part
        local_target[outside] = 0
        flat = logits.view(-1, part)
        rows = torch.arange(flat.shape[0])
        predicted = flat[rows, local_target.view(-1)].view_as(target).clone()
        predicted[outside] = 0.0
        dist.all_reduce(predicted)
        exp_logits = torch.exp(logits)
        sum_exp = exp_logits.sum(dim=-1)
        dist.all_reduce(sum_exp)
        exp_logits.div_(sum_exp.unsqueeze(-1))
        ctx.save_for_backward(exp_logits, outside, local_target)
        return (torch.log(sum_exp) - predicted).mean()

    @staticmethod
    def backward(ctx, grad):
        softmax, outside, local_target = ctx.saved_tensors
        grad_input = softmax.clone()
        flat = grad_input.view(-1, grad_input.shape[-1])
        rows = torch.arange(flat.shape[0])
        flat[rows, local_target.view(-1)] -= 1.0 - outside.view(-1).float()
        grad_input.mul_(grad / outside.numel())
        return grad_input, None, None


class AllToAll(torch.autograd.Function):
    """Tokens to the ranks of their experts (and their gradients back)."""

    @staticmethod
    def forward(ctx, x, out_splits, in_splits):
        ctx.splits = (out_splits, in_splits)
        out = x.new_empty((sum(out_splits),) + tuple(x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), out_splits, in_splits)
        return out

    @staticmethod
    def backward(ctx, grad):
        out_splits, in_splits = ctx.splits
        back = grad.new_empty((sum(in_splits),) + tuple(grad.shape[1:]))
        dist.all_to_all_single(back, grad.contiguous(), in_splits, out_splits)
        return back, None, None


class MoE(nn.Module):
    """Top-1 routing over one expert per rank."""

    def __init__(self, d_model, world):
        super().__init__()
        self.world = world
        self.router = nn.Linear(d_model, world)
        self.up = nn.Linear(d_model, 2 * d_model)
        self.down = nn.Linear(2 * d_model, d_model)

    def forward(self, x):
        b, t, c = x.shape
        tokens = x.reshape(b * t, c)
        probs = torch.softmax(self.router(tokens), dim=-1)
        gate, expert = probs.max(dim=-1)
        order = torch.argsort(expert, stable=True)
        in_counts = torch.bincount(expert, minlength=self.world)
        out_counts = torch.empty_like(in_counts)
        dist.all_to_all_single(out_counts, in_counts)
        in_splits, out_splits = in_counts.tolist(), out_counts.tolist()
        received = AllToAll.apply(tokens[order], out_splits, in_splits)
        processed = self.down(F.gelu(self.up(received)))
        returned = AllToAll.apply(processed, in_splits, out_splits)
        combined = torch.empty_like(returned).index_copy(0, order, returned)
        return (combined * gate.unsqueeze(-1)).view(b, t, c)


class Block(nn.Module):
    def __init__(self, d_model, heads, world):
        super().__init__()
        self.local_heads = heads // world
        self.ln1 = nn.LayerNorm(d_model)
        self.qkv = ColumnParallelLinear(d_model, 3 * d_model, world)
        self.proj = RowParallelLinear(d_model, d_model, world)
        self.ln2 = nn.LayerNorm(d_model)
        self.moe = MoE(d_model, world)

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.qkv(self.ln1(x)).chunk(3, dim=-1)
        q, k, v = (z.view(b, t, self.local_heads, -1).transpose(1, 2) for z in (q, k, v))
        scores = torch.matmul(q, k.transpose(-2, -1)) * q.shape[-1] ** -0.5
        causal = torch.ones(t, t).triu(1).bool()
        att = torch.softmax(scores.masked_fill(causal, float("-inf")), dim=-1)
        y = torch.matmul(att, v).transpose(1, 2).reshape(b, t, -1)
        x = x + self.proj(y)
        return x + self.moe(self.ln2(x))


class MegatronGPT(nn.Module):
    def __init__(self, world, vocab=64, d_model=32, heads=4, layers=2, seq=16):
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.pos = nn.Parameter(torch.zeros(seq, d_model))
        self.blocks = nn.ModuleList(Block(d_model, heads, world) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d_model)
        self.head = ColumnParallelLinear(d_model, vocab, world, bias=False)  # by vocabulary

    def forward(self, idx):
        x = self.embed(idx) + self.pos[: idx.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def parameter_groups(model):
    """Matrices decay; biases and LayerNorms do not (as LLM recipes set it)."""
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    rest = [p for n, p in model.named_parameters() if p.dim() < 2]
    return [{"params": decay, "weight_decay": WEIGHT_DECAY}, {"params": rest, "weight_decay": 0.0}]


def parameter_digest(model):
    """A digest of every parameter's bytes, read without a torch op."""
    digest = hashlib.sha256()
    for p in model.parameters():
        digest.update(p.data.numpy().tobytes())
    return digest.hexdigest()[:16]


def train(rank, world, steps, optimizer, fault, digests):
    global FAULT
    if fault:
        name, fault_rank, fault_step = fault.split(":")
        FAULT = (name, int(fault_rank), int(fault_step))
    before_process_groups()
    dist.init_process_group("gloo", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))
    # The replicated parameters (embeddings, LayerNorms, routers) start
    # alike on every rank, the tensor-parallel shards differ.
    torch.manual_seed(1234)
    model = MegatronGPT(world)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(rank)) * 0.01)
    flavour = {"foreach": {"foreach": True}, "fused": {"fused": True}}[optimizer]
    opt = torch.optim.AdamW(parameter_groups(model), lr=1e-2, **flavour)
    gen = torch.Generator().manual_seed(100)  # tensor parallel: every rank reads the same batch
    for step in range(steps):
        if fault_on("nodecay", rank, step):
            for group in opt.param_groups:
                group["weight_decay"] = WEIGHT_DECAY
        idx = torch.randint(0, 64, (2, 16), generator=gen)
        loss = VocabParallelCrossEntropy.apply(model(idx), torch.roll(idx, -1, 1), rank)
        loss.backward()
        opt.step()
        opt.zero_grad()
        if digests:
            print(f"digest {rank} {step} {parameter_digest(model)}", flush=True)
        if rank == 0:
            print(f"step {step} loss {loss.item():.6f}", flush=True)
    dist.barrier()
    del opt, model
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--optimizer", choices=("foreach", "fused"), default="foreach")
    parser.add_argument("--fault", default="", help="nodecay:RANK:STEP")
    parser.add_argument("--digests", action="store_true",
                        help="print a digest of the parameters after each step")
    parser.add_argument("--spawn", type=int, default=2)
    args = parser.parse_args()
    if args.fault and args.fault.split(":")[0] != "nodecay":
        parser.error(f"unknown fault {args.fault!r}")
    spawn_ranks(train, args.spawn, args.steps, args.optimizer, args.fault, args.digests)


if __name__ == "__main__":
    main()
