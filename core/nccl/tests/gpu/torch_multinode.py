"""PyTorch check of libmscclpp_nccl across 2 emulated nodes on one GPU (LD_PRELOAD of our .so).

Run as 4 processes (RANK=0..3, WORLD_SIZE=4, MASTER_ADDR/MASTER_PORT set, every rank on
cuda:0, under MPS); ranks 0-1 and 2-3 get different MSCCLPP_HOSTIDs before the process group
starts, so our library sees 2 nodes of 2 ranks and runs the hierarchical collectives (no NCCL
fallback is configured, so a collective it could not run natively fails the check).
all_reduce (sum, avg), all_gather_into_tensor, reduce_scatter_tensor and broadcast of
rank-dependent float32/float16/bfloat16 tensors are compared with what NCCL must produce.
Prints "TORCH_MULTINODE rank=<r> ok=<0|1>".
"""
import os

rank = int(os.environ["RANK"])
world = int(os.environ["WORLD_SIZE"])
os.environ["MSCCLPP_HOSTID"] = f"torch-node-{rank // 2}"

import torch  # noqa: E402  (after the host id is set)
import torch.distributed as dist  # noqa: E402


def main():
    dev = torch.device("cuda:0")
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=dev)
    ok = True

    def check(name, got, want):
        nonlocal ok
        if not torch.allclose(got.float(), want.float(), rtol=1e-2, atol=1e-2):
            print(f"rank {rank}: {name}: wrong result (max diff {(got.float() - want.float()).abs().max()})")
            ok = False

    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        for n in (1, 1000, 4099, 1 << 20):
            base = torch.arange(n, device=dev, dtype=torch.float32).remainder(17)
            t = (base + rank).to(dtype)
            dist.all_reduce(t)
            check(f"all_reduce sum {dtype} n={n}", t, (base * world + sum(range(world))).to(dtype))
            t = (base + rank).to(dtype)
            dist.all_reduce(t, op=dist.ReduceOp.AVG)
            check(f"all_reduce avg {dtype} n={n}", t, (base + sum(range(world)) / world).to(dtype))
    x = torch.arange(4096, device=dev, dtype=torch.float32) + 1000 * rank
    y = torch.empty(world * 4096, device=dev, dtype=torch.float32)
    dist.all_gather_into_tensor(y, x)
    check("all_gather", y, torch.cat([torch.arange(4096, device=dev, dtype=torch.float32) + 1000 * r for r in range(world)]))
    big = torch.arange(world * 4096, device=dev, dtype=torch.float32) + rank
    z = torch.empty(4096, device=dev, dtype=torch.float32)
    dist.reduce_scatter_tensor(z, big)
    mine = torch.arange(rank * 4096, (rank + 1) * 4096, device=dev, dtype=torch.float32)
    check("reduce_scatter", z, mine * world + sum(range(world)))
    b = x.clone()
    dist.broadcast(b, src=1)
    check("broadcast", b, torch.arange(4096, device=dev, dtype=torch.float32) + 1000)
    torch.cuda.synchronize()
    dist.destroy_process_group()
    print(f"TORCH_MULTINODE rank={rank} ok={int(ok)}")


if __name__ == "__main__":
    main()
