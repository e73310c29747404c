"""Eager per-call cost of torch.distributed all_reduce (issue 28), run once with the system NCCL
and once with LD_PRELOAD of libmscclpp_nccl.so.

World size from WORLD_SIZE (default 1; RANK, MASTER_ADDR, MASTER_PORT as torchrun sets them).
For each size (float32, 1 KiB to 64 MiB, x4): a checked call (sum of rank + 1 over the ranks),
warm-up, then REPEATS rounds of CALLS eager calls, each round timed from the first call to the
stream's end (torch.cuda.synchronize); the fastest round's time per call. Prints per size
"TORCH_EAGER rank=<r> world=<n> bytes=<b> us_per_call=<t> ok=<0|1>" and at the end
"TORCH_EAGER_DONE rank=<r> ok=<0|1> nccl_version=<x.y.z>".
"""
import os
import time

import torch
import torch.distributed as dist

SIZES = [1 << k for k in range(10, 27, 2)]  # 1 KiB .. 64 MiB
REPEATS = int(os.environ.get("EAGER_REPEATS", "5"))


def calls_for(nbytes):
    # Enough calls for a stable figure, few at the large sizes (GPU-bound there).
    return 500 if nbytes <= (1 << 20) else (100 if nbytes <= (16 << 20) else 30)


def main():
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29571")
    dev = torch.device("cuda:0")
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=dev)
    all_ok = True
    for nbytes in SIZES:
        n = nbytes // 4
        t = torch.full((n,), float(rank + 1), device=dev, dtype=torch.float32)
        dist.all_reduce(t)
        torch.cuda.synchronize()
        want = world * (world + 1) / 2
        ok = bool(torch.all(t == want).item())
        all_ok &= ok
        t.zero_()  # sums of zeros from here: no overflow over the timed calls
        calls = calls_for(nbytes)
        for _ in range(min(calls, 50)):
            dist.all_reduce(t)
        torch.cuda.synchronize()
        best = None
        for _ in range(REPEATS):
            dist.barrier()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(calls):
                dist.all_reduce(t)
            torch.cuda.synchronize()
            us = (time.perf_counter() - t0) / calls * 1e6
            best = us if best is None else min(best, us)
        print(
            f"TORCH_EAGER rank={rank} world={world} bytes={nbytes} us_per_call={best:.2f} ok={int(ok)}",
            flush=True,
        )
    version = ".".join(str(v) for v in torch.cuda.nccl.version())
    dist.destroy_process_group()
    print(f"TORCH_EAGER_DONE rank={rank} ok={int(all_ok)} nccl_version={version}", flush=True)


if __name__ == "__main__":
    main()
