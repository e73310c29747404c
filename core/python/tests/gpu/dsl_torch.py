"""PyTorch all_reduce through libmscclpp_nccl (LD_PRELOAD) with a DSL plan in the plan
directory (MSCCLPP_CACHE_DIR, set by the caller): run by dsl_plan_gpu.sh, one process per rank
(RANK, WORLD_SIZE, MASTER_ADDR/PORT, as torchrun sets them), rank on cuda:LOCAL_RANK modulo the
GPUs (on a one-GPU machine every rank shares cuda:0, under MPS).

Plans run only on memory the library allocated, so the tensors come from the NCCL backend's
memory pool (``ProcessGroupNCCL.mem_allocator``: ncclMemAlloc, which is ours under
LD_PRELOAD). In-place all_reduce (sum) of float32 tensors of several sizes, checked exactly,
then the time per call. Prints ``DSL_TORCH rank=R ok=0|1`` and ``DSL_TORCH_TIME bytes=B us=T``
lines.
"""

import contextlib
import os
import time

import torch
import torch.distributed as dist

SIZES = [1 << 10, 1 << 14, 1 << 18, 1 << 22, 1 << 24]  # bytes


def main() -> None:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)) % torch.cuda.device_count())
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=dev)
    backend = dist.group.WORLD._get_backend(dev)
    try:
        pool = torch.cuda.MemPool(backend.mem_allocator)
    except RuntimeError as e:
        # PyTorch builds without NCCL's allocator hook ("not supported in this NCCL version"):
        # plain caching-allocator tensors, which the library registers on first use.
        print(f"rank {rank}: NCCL memory pool unavailable ({e}); plain torch tensors")
        pool = None
    with torch.cuda.use_mem_pool(pool) if pool is not None else contextlib.nullcontext():
        bufs = {b: torch.empty(b // 4, device=dev, dtype=torch.float32) for b in SIZES}
    ok = True
    for b, x in bufs.items():
        n = x.numel()
        base = torch.arange(n, device=dev, dtype=torch.float32).remainder(11)
        for it in range(3):
            x.copy_(base + rank * 3 + it)
            dist.all_reduce(x)
            torch.cuda.synchronize()
            want = base * world + sum(r * 3 + it for r in range(world))
            if not torch.equal(x, want):
                bad = (x != want).nonzero()[0].item()
                print(f"FAIL rank {rank}: all_reduce of {b} bytes call {it}: element {bad} is {x[bad].item()}, expected {want[bad].item()}")
                ok = False
    for b, x in bufs.items():
        calls = 50 if b <= 1 << 18 else 10
        for _ in range(5):
            dist.all_reduce(x)
        torch.cuda.synchronize()
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(calls):
            dist.all_reduce(x)
        torch.cuda.synchronize()
        us = (time.perf_counter() - t0) / calls * 1e6
        if rank == 0:
            print(f"DSL_TORCH_TIME bytes={b} us={us:.1f}")
    del bufs
    dist.destroy_process_group()
    print(f"DSL_TORCH rank={rank} ok={int(ok)}")


if __name__ == "__main__":
    main()
