"""All-reduce through the plugin from PyTorch (two or more processes, one GPU each).

Run with torchrun, e.g.:
  LD_LIBRARY_PATH=$PWD/dist NCCL_NET_PLUGIN=ha NCCL_NET=HA HA_NCCL_FABRIC=sock \
    torchrun --nproc-per-node 2 scripts/nccl/torch_allreduce.py

Every rank fills its tensor with (rank + 1) * (i + 1) for element i; after all_reduce each
element must equal (i + 1) * world * (world + 1) / 2. Exits non-zero on any mismatch.
"""
import os
import sys

import torch
import torch.distributed as dist


def main() -> int:
    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    total = world * (world + 1) // 2
    bad = 0
    for n in [1, 7, 1024, 1 << 20, 1 << 24]:  # elements of float64 (8 B .. 128 MiB)
        idx = torch.arange(1, n + 1, dtype=torch.float64, device="cuda")
        t = idx * (rank + 1)
        dist.all_reduce(t)
        expect = idx * total
        ok = torch.equal(t, expect)
        bad += not ok
        if rank == 0:
            print(f"all_reduce {n * 8:>10} B: {'ok' if ok else 'WRONG'} (sum[0]={t[0].item()}, expected {expect[0].item()})", flush=True)
    flag = torch.tensor([bad], device="cuda")
    dist.all_reduce(flag)
    if rank == 0:
        print(f"torch all_reduce: {'PASS' if flag.item() == 0 else 'FAIL'} on {world} ranks, NCCL {torch.cuda.nccl.version()}", flush=True)
    dist.destroy_process_group()
    return 0 if flag.item() == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
