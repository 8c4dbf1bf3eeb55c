"""Training code written the way LLM teams write it, for the bug zoo
(test_zoo.py): a small GPT on 2 gloo ranks whose attention is a custom
autograd Function with a hand-written backward, whose MLP recomputes its
activation in backward (hand-written recompute), with gradient accumulation
over two micro-batches, gradients averaged with dist.all_reduce, and a
hand-written optimizer (no torch.optim). Two projections are issued from
identical source lines in two branches.

--fault NAME:RANK:STEP plants one bug in this code on that rank from that step
on (-1: every rank); --variant NAME makes a benign change that must compare
identical. Both are the training code's own: OpGuard is never told.

Launch: python3 zoo_train.py --spawn 2 [--steps 3] [--fault ...] [--variant ...]
"""
import argparse
import datetime
import math

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from fault_plan import Plan
from train_gpt import before_process_groups, spawn_ranks

FAULTS = {
    "attention_backward": "the attention's hand-written backward misses a transpose",
    "attention_forward": "the attention's forward masks one position too many",
    "recompute": "the MLP's recompute in backward runs on the wrong micro-batch's input",
    "optimizer": "the hand-written optimizer's momentum update uses the raw gradient twice",
    "bitflip": "one bit of a reduced gradient flips on one rank before the update",
    "branch": "one of the two identical projection lines reads the wrong weight",
}
VARIANTS = {
    "reordered": "q, k and v split into heads in another order (independent computations "
                 "through one helper's lines)",
    "logging": "extra logging ops each step (gradient norms, activation statistics)",
    "other_branch": "the other of two branches whose projection lines are identical",
    "optimizer_function": "the same update math in another function, called from elsewhere",
}


PLAN = None


class Attention(torch.autograd.Function):
    """Causal softmax attention with a hand-written backward, as fused
    attention kernels are wrapped."""

    @staticmethod
    def forward(ctx, q, k, v):
        scale = 1.0 / math.sqrt(q.shape[-1])
        scores = torch.matmul(q, k.transpose(-2, -1)) * scale
        t = q.shape[-2]
        masked = torch.ones(t, t).triu(1 if not PLAN.on("attention_forward") else 0).bool()
        scores = scores.masked_fill(masked, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        probs = torch.nan_to_num(probs)
        out = torch.matmul(probs, v)
        ctx.save_for_backward(q, k, v, probs)
        ctx.scale = scale
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, probs = ctx.saved_tensors
        probs_t = probs.transpose(-2, -1) if not PLAN.on("attention_backward") else probs
        grad_v = torch.matmul(probs_t, grad_out)
        grad_probs = torch.matmul(grad_out, v.transpose(-2, -1))
        inner = (grad_probs * probs).sum(dim=-1, keepdim=True)
        grad_scores = probs * (grad_probs - inner) * ctx.scale
        grad_q = torch.matmul(grad_scores, k)
        grad_k = torch.matmul(grad_scores.transpose(-2, -1), q)
        return grad_q, grad_k, grad_v


class RecomputedGelu(torch.autograd.Function):
    """An MLP activation that keeps only its input and recomputes the
    activation in backward (hand-written activation recompute)."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return F.gelu(x)

    @staticmethod
    def backward(ctx, grad_out):
        (x,) = ctx.saved_tensors
        if PLAN.on("recompute"):
            x = torch.roll(x, 1, dims=0)
        with torch.enable_grad():
            x = x.detach().requires_grad_(True)
            y = F.gelu(x)
        (grad_x,) = torch.autograd.grad(y, x, grad_out)
        return grad_x


class Block(nn.Module):
    def __init__(self, d_model, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d_model)
        self.wq = nn.Linear(d_model, d_model)
        self.wk = nn.Linear(d_model, d_model)
        self.wv = nn.Linear(d_model, d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.ln2 = nn.LayerNorm(d_model)
        self.up = nn.Linear(d_model, 4 * d_model)
        self.down = nn.Linear(4 * d_model, d_model)

    def heads_of(self, x):
        b, t, c = x.shape
        return x.view(b, t, self.heads, c // self.heads).transpose(1, 2)

    def forward(self, x, branch):
        h = self.ln1(x)
        if branch == 0:
            q = self.wq(h)
            k = self.wk(h)
            v = self.wv(h)
        else:
            q = self.wq(h)
            k = self.wk(h) if not PLAN.on("branch") else self.wq(h)
            v = self.wv(h)
        if PLAN.variant == "logging":
            stats = torch.stack([h.mean(), h.std(), q.abs().max()])
            del stats
        if PLAN.variant == "reordered":
            kh = self.heads_of(k)
            vh = self.heads_of(v)
            qh = self.heads_of(q)
        else:
            qh, kh, vh = self.heads_of(q), self.heads_of(k), self.heads_of(v)
        att = Attention.apply(qh, kh, vh)
        b, _, t, _ = att.shape
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, -1))
        return x + self.down(RecomputedGelu.apply(self.up(self.ln2(x))))


class TinyGPT(nn.Module):
    def __init__(self, vocab=64, d_model=32, heads=2, layers=2, context=16):
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.pos = nn.Parameter(torch.zeros(context, d_model))
        self.blocks = nn.ModuleList(Block(d_model, heads) for _ in range(layers))
        self.head = nn.Linear(d_model, vocab)

    def forward(self, idx, branch):
        x = self.embed(idx) + self.pos[: idx.shape[1]]
        for block in self.blocks:
            x = block(x, branch)
        return self.head(x)


class Momentum:
    """SGD with momentum written by hand, as framework optimizer wrappers are."""

    def __init__(self, params, lr=0.05, beta=0.9):
        self.params = list(params)
        self.lr, self.beta = lr, beta
        self.buffers = [torch.zeros_like(p) for p in self.params]

    @torch.no_grad()
    def step(self):
        for p, buf in zip(self.params, self.buffers):
            if p.grad is None:
                continue
            grad = p.grad if not PLAN.on("optimizer") else p.grad + p.grad
            buf.mul_(self.beta).add_(grad)
            p.add_(buf, alpha=-self.lr)

    def zero_grad(self):
        for p in self.params:
            p.grad = None


@torch.no_grad()
def momentum_update(params, buffers, lr, beta):
    """The same update as Momentum.step, written elsewhere (a config variant)."""
    for p, buf in zip(params, buffers):
        if p.grad is None:
            continue
        buf.mul_(beta).add_(p.grad)
        p.add_(buf, alpha=-lr)


def average_gradients(model, world):
    for p in model.parameters():
        if p.grad is None:  # a projection a planted bug leaves unused
            continue
        dist.all_reduce(p.grad)
        p.grad.div_(world)
        if PLAN.on("bitflip"):
            p.grad.view(torch.int32).view(-1)[3].bitwise_xor_(1 << 20)


def train(rank, world, steps, fault, variant):
    global PLAN
    before_process_groups()
    dist.init_process_group("gloo", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    PLAN = Plan(fault, variant, rank)
    torch.manual_seed(1234)
    model = TinyGPT()
    opt = Momentum(model.parameters())
    gen = torch.Generator().manual_seed(100 + rank)
    branch = 1 if variant == "other_branch" else (1 if fault.startswith("branch") else 0)
    for step in range(steps):
        PLAN.step = step
        for micro in range(2):
            idx = torch.randint(0, 64, (2, 16), generator=gen)
            logits = model(idx, branch)
            loss = F.cross_entropy(logits.view(-1, 64), torch.roll(idx, -1, 1).view(-1)) / 2
            loss.backward()
        average_gradients(model, world)
        if variant == "optimizer_function":
            momentum_update(opt.params, opt.buffers, opt.lr, opt.beta)
        else:
            opt.step()
        opt.zero_grad()
        if variant == "logging":
            norms = torch.stack([p.detach().norm() for p in model.parameters()])
            del norms
        if rank == 0:
            print(f"step {step} loss {loss.item() * 2:.6f}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--fault", default="", help="NAME:RANK:STEP, NAME one of " + ", ".join(FAULTS))
    parser.add_argument("--variant", default="", help="one of " + ", ".join(VARIANTS))
    parser.add_argument("--spawn", type=int, default=2)
    args = parser.parse_args()
    if args.fault and args.fault.split(":")[0] not in FAULTS:
        parser.error(f"unknown fault {args.fault!r}")
    if args.variant and args.variant not in VARIANTS:
        parser.error(f"unknown variant {args.variant!r}")
    spawn_ranks(train, args.spawn, args.steps, args.fault, args.variant)


if __name__ == "__main__":
    main()
