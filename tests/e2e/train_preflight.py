"""A small data-parallel training on gloo ranks for the preflight tests
(test_preflight.py). Everything it trains is bitwise reproducible, except a
logged metric: `planted::shuffled_sum_` accumulates a weight's elements in an
order drawn from a per-process random permutation (as a kernel accumulating
with atomics takes them in whatever order its threads arrive), so two runs of
the same job get other bits from the same inputs there. The metric is only
printed; the model never sees it.

  --steps N     steps to train (opguard preflight stops the job earlier)
  --bug STEP    rank 1 scales its hidden activations by 1 + 2^-10 at STEP
                instead of by 1: a real divergence, later than the metric's
  --spawn N     start N ranks with torch.multiprocessing.spawn (else the
                environment names the rank, as torchrun's does)
"""
import argparse
import os
import random
import socket
import struct

import torch
import torch.distributed as dist
import torch.nn as nn

# A Python implementation of an op, so that it is one op to the recorder (its
# inner work is nested in it) and reads its input as any op does.
_LIB = torch.library.Library("planted", "DEF")
# It adds into a zeroed buffer, as a kernel accumulating with atomics does.
_LIB.define("shuffled_sum_(Tensor(a!) out, Tensor x) -> Tensor(a!)")
_ORDER = random.Random(os.getpid())  # another permutation in every process


def _round32(v):
    return struct.unpack("f", struct.pack("f", v))[0]


def _shuffled_sum_(out, x):
    values = x.reshape(-1).tolist()
    order = list(range(len(values)))
    _ORDER.shuffle(order)
    acc = out.item()
    # A decayed sum in float32, as a smoothed statistic over samples taken in
    # arrival order: the order decides the result, not only its rounding (a
    # plain sum's low bits would agree for two orders now and then).
    for i in order:
        acc = _round32(0.9 * acc + values[i])
    return out.fill_(acc)


_LIB.impl("shuffled_sum_", _shuffled_sum_, "CPU")


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(16, 32)
        self.out = nn.Linear(32, 4)

    def forward(self, x, scale):
        h = torch.relu(self.inp(x))
        h = h * scale  # the --bug line
        return self.out(h)


def train(rank, world, args):
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    data = torch.Generator().manual_seed(100 + rank)
    metric = torch.zeros(())
    for step in range(args.steps):
        x = torch.randn(8, 16, generator=data)
        y = torch.randn(8, 4, generator=data)
        scale = 1.0 + 2.0 ** -10 if rank == 1 and step == args.bug else 1.0
        out = model(x, scale)
        loss = ((out - y) ** 2).mean()
        with torch.no_grad():
            metric.zero_()
            torch.ops.planted.shuffled_sum_(metric, model.inp.weight.detach())  # the planted nondeterministic op
        opt.zero_grad()
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad.div_(world)
        opt.step()
        if rank == 0:
            print(f"step {step} loss {loss.item():.6f} smoothed {metric.item():.9g}", flush=True)
    dist.destroy_process_group()


def run_rank(rank, world, args):
    os.environ["RANK"] = str(rank)
    train(rank, world, args)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--bug", type=int, default=-1)
    parser.add_argument("--spawn", type=int, default=0)
    args = parser.parse_args()
    if args.spawn:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(port))
        import torch.multiprocessing as mp
        mp.spawn(run_rank, args=(args.spawn, args), nprocs=args.spawn)
    else:
        train(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), args)


if __name__ == "__main__":
    main()
