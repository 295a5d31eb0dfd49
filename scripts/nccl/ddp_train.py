"""Small deterministic DDP training loop through the plugin, for failover runs.

Every rank trains the same MLP on the same synthetic data shard scheme with fixed seeds; the
gradients (~16 MiB per step) are all-reduced by DDP over NCCL. Prints the loss and step time
every 25 steps, then the final loss and a SHA-256 of all final weights: two runs (one with a
rail cut mid-run) must print the same checksum.

Environment: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (as torchrun sets them), STEPS (300).
"""
import hashlib
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn


def main() -> int:
    torch.manual_seed(1234)
    torch.use_deterministic_algorithms(True)
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dev = torch.device("cuda")
    model = nn.Sequential(nn.Linear(1024, 2048), nn.ReLU(), nn.Linear(2048, 1024), nn.ReLU(), nn.Linear(1024, 10)).to(dev)
    ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=4)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
    gen = torch.Generator(device="cpu").manual_seed(99 + rank)
    steps = int(os.environ.get("STEPS", "300"))
    t0 = last = time.time()
    slowest = 0.0
    for step in range(1, steps + 1):
        x = torch.randn(256, 1024, generator=gen).to(dev)
        y = torch.randint(0, 10, (256,), generator=gen).to(dev)
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(ddp(x), y)
        loss.backward()
        opt.step()
        torch.cuda.synchronize()
        now = time.time()
        slowest = max(slowest, now - last)
        last = now
        if rank == 0 and step % 25 == 0:
            print(f"step {step} loss {loss.item():.6f} t={now - t0:.2f}s", flush=True)
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().cpu().numpy().tobytes())
    if rank == 0:
        print(f"final loss {loss.item():.9f} weights sha256 {h.hexdigest()} slowest_step {slowest * 1000:.0f} ms total {time.time() - t0:.1f}s", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
