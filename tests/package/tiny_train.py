"""Two steps of a small model on the gloo ranks torchrun starts, with
gradients averaged by all_reduce. Knows nothing of OpGuard.
PLANT_DIVERGENCE=RANK:STEP scales that rank's input at that step by 1.001
(the same ops, other bits): the divergence a diff must name."""
import os

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
torch.manual_seed(0)
planted = tuple(int(v) for v in os.environ["PLANT_DIVERGENCE"].split(":")) \
    if os.environ.get("PLANT_DIVERGENCE") else None
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(2):
    scale = 1.001 if planted == (dist.get_rank(), step) else 1.0
    x = torch.randn(4, 8) * scale  # PLANTED_LINE
    loss = model(x).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= dist.get_world_size()
    optimizer.step()
    print(f"rank {dist.get_rank()} step {step} loss {loss.item():.6f}")
dist.destroy_process_group()
