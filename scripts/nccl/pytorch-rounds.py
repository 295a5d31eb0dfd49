"""Communicators re-created in one process, as PyTorch users and elastic trainers do it.

ROUNDS times (default 3): init_process_group("nccl") -> all_reduce, broadcast, P2P send/recv
(both directions at once, then one way), all_to_all, and an all_reduce on a sub-group (a second
communicator) -> destroy_process_group(). Every result is checked element by element.

One process per rank; scripts/nccl/pytorch-rounds.sh starts two of them on one GPU. Environment:
  RANK, WORLD_SIZE (2), MASTER_ADDR (127.0.0.1), MASTER_PORT (round r uses MASTER_PORT + r),
  ROUNDS (3), ROUND_TIMEOUT (seconds a round may take before the process dumps its stacks and
  exits through faulthandler, which prints "Timeout (...)!"; default 120), DEVICE (CUDA device
  index; default 0), BACKEND (nccl; gloo runs the same checks on the CPU, to try the script
  on a machine without a GPU).

Prints "round R: ok ..." per round and finally "ROUNDS PASSED n/n" (exit 0). A failed check
prints "round R: WRONG ..." (exit 1); an exception (e.g. NCCL cannot load the plugin again)
prints "round R: FAILED <type>: <message>" (exit 2).
"""
import datetime
import faulthandler
import os
import sys
import time

import torch
import torch.distributed as dist


def check(what, got, want, rnd):
    if not torch.equal(got, want):
        bad = (got != want).nonzero()
        first = bad[0].tolist() if bad.numel() else []
        print(f"round {rnd}: WRONG {what}: {bad.shape[0]} elements differ, first at {first}: "
              f"got {got.flatten()[0].item()} want {want.flatten()[0].item()}", flush=True)
        return False
    return True


def one_round(rnd, rank, world, dev, addr, port, backend):
    """One init -> collectives -> destroy cycle. Returns True when every result is right."""
    t0 = time.monotonic()
    # NCCL: eager init (device_id), so the communicator (and the plugin) is set up here.
    eager = {"device_id": dev} if backend == "nccl" else {}
    dist.init_process_group(
        backend,
        init_method=f"tcp://{addr}:{port + rnd}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=int(os.environ.get("ROUND_TIMEOUT", "120"))),
        **eager,
    )
    ok = True
    n = 1 << 20  # elements per tensor (4 MiB of int32): several network chunks
    idx = torch.arange(n, dtype=torch.int32, device=dev)

    # all_reduce: rank r contributes idx + (r + 1) * (rnd + 1).
    t = idx + (rank + 1) * (rnd + 1)
    dist.all_reduce(t)
    ok &= check("all_reduce", t, idx * world + (rnd + 1) * world * (world + 1) // 2, rnd)

    # broadcast from the last rank.
    src = world - 1
    t = idx * (rnd + 3) if rank == src else torch.zeros(n, dtype=torch.int32, device=dev)
    dist.broadcast(t, src=src)
    ok &= check("broadcast", t, idx * (rnd + 3), rnd)

    # P2P: every rank sends to the next and receives from the previous, at the same time ...
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    out = idx + 1000 * rank + rnd
    got = torch.empty_like(out)
    reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, out, nxt), dist.P2POp(dist.irecv, got, prv)])
    for r in reqs:
        r.wait()
    ok &= check("send/recv ring", got, idx + 1000 * prv + rnd, rnd)
    # ... then rank 0 -> rank 1 alone (blocking send/recv).
    if rank == 0:
        dist.send(idx * 7 + rnd, dst=1)
    elif rank == 1:
        got = torch.empty(n, dtype=torch.int32, device=dev)
        dist.recv(got, src=0)
        ok &= check("send 0->1", got, idx * 7 + rnd, rnd)

    # all_to_all: chunk j of rank r holds r * 100 + j (+ the round); rank r receives chunk r
    # of every rank j.
    chunk = n // world
    inp = (torch.arange(world, device=dev, dtype=torch.int32).repeat_interleave(chunk)
           + rank * 100 + rnd)
    outp = torch.empty_like(inp)
    dist.all_to_all_single(outp, inp)
    want = (torch.arange(world, device=dev, dtype=torch.int32).repeat_interleave(chunk) * 100
            + rank + rnd)
    ok &= check("all_to_all", outp, want, rnd)

    # A sub-group: its own communicator (all ranks, in reverse order).
    sub = dist.new_group(list(reversed(range(world))))
    t = torch.full((4096,), rank + 1, dtype=torch.int32, device=dev)
    dist.all_reduce(t, group=sub)
    ok &= check("sub-group all_reduce", t, torch.full_like(t, world * (world + 1) // 2), rnd)
    dist.destroy_process_group(sub)

    # Agree on the outcome before tearing down, so both ranks report the same.
    flag = torch.tensor([0 if ok else 1], device=dev)
    dist.all_reduce(flag)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    dist.destroy_process_group()
    secs = time.monotonic() - t0
    if flag.item() == 0:
        print(f"round {rnd}: ok (all_reduce, broadcast, send/recv, all_to_all, sub-group) "
              f"in {secs:.2f} s", flush=True)
    elif ok:
        print(f"round {rnd}: WRONG on another rank", flush=True)
    return flag.item() == 0


def main():
    rank = int(os.environ["RANK"])
    world = int(os.environ.get("WORLD_SIZE", "2"))
    addr = os.environ.get("MASTER_ADDR", "127.0.0.1")
    port = int(os.environ.get("MASTER_PORT", "29531"))
    rounds = int(os.environ.get("ROUNDS", "3"))
    limit = int(os.environ.get("ROUND_TIMEOUT", "120"))
    backend = os.environ.get("BACKEND", "nccl")
    if backend == "nccl":
        dev = torch.device("cuda", int(os.environ.get("DEVICE", "0")))
        torch.cuda.set_device(dev)
    else:
        dev = torch.device("cpu")
    print(f"rank {rank}/{world}: torch {torch.__version__}, backend {backend}, NCCL "
          f"{'.'.join(map(str, torch.cuda.nccl.version()))}, {rounds} rounds, "
          f"NCCL_NET_PLUGIN={os.environ.get('NCCL_NET_PLUGIN', '')} "
          f"NCCL_NET={os.environ.get('NCCL_NET', '')} "
          f"NCCL_NET_PLUGIN_REF_COUNT={os.environ.get('NCCL_NET_PLUGIN_REF_COUNT', '(unset)')}",
          flush=True)
    for rnd in range(rounds):
        # A hang (NCCL waiting for a peer that failed) must not stall the runner: dump every
        # thread's stack and exit.
        faulthandler.dump_traceback_later(limit, exit=True)
        try:
            ok = one_round(rnd, rank, world, dev, addr, port, backend)
        except Exception as e:  # noqa: BLE001 - report any failure of the round and stop
            faulthandler.cancel_dump_traceback_later()
            msg = " ".join(str(e).split())[:600]
            print(f"round {rnd}: FAILED {type(e).__name__}: {msg}", flush=True)
            sys.stdout.flush()
            os._exit(2)  # skip interpreter teardown: NCCL state may be half-built
        faulthandler.cancel_dump_traceback_later()
        if not ok:
            os._exit(1)
    print(f"ROUNDS PASSED {rounds}/{rounds}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
