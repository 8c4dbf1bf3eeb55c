"""Two steps of a small model on the gloo ranks torchrun starts, with
gradients averaged by all_reduce. Knows nothing of OpGuard."""
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(2):
    x = torch.randn(4, 8)
    loss = model(x).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= dist.get_world_size()
    optimizer.step()
    print(f"rank {dist.get_rank()} step {step} loss {loss.item():.6f}")
dist.destroy_process_group()
