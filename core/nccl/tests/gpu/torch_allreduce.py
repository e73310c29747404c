"""PyTorch check of libmscclpp_nccl at world size 1 (run with and without LD_PRELOAD).

torch.distributed with the NCCL backend: all_reduce (sum) of float32/float16/bfloat16 tensors
of several sizes must leave them unchanged (one rank), broadcast / all_gather_into_tensor /
reduce_scatter_tensor must copy; then the time per all_reduce call of 1 KiB. Prints one line
"TORCH_RESULT ok=<0|1> nccl_version=<x.y.z> us_per_call=<t>".
"""
import os
import time

import torch
import torch.distributed as dist


def main():
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29561")
    dev = torch.device("cuda:0")
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=dev)
    ok = True
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        for n in (1, 1000, 1 << 20, 1 << 26):
            t = torch.arange(n, device=dev, dtype=torch.float32).remainder(1000).to(dtype)
            ref = t.clone()
            dist.all_reduce(t)
            torch.cuda.synchronize()
            if not torch.equal(t, ref):
                print(f"all_reduce {dtype} n={n}: wrong result")
                ok = False
    x = torch.arange(4096, device=dev, dtype=torch.float32)
    y = torch.empty_like(x)
    dist.all_gather_into_tensor(y, x)
    z = torch.empty_like(x)
    dist.reduce_scatter_tensor(z, x)
    b = x.clone()
    dist.broadcast(b, src=0)
    torch.cuda.synchronize()
    for name, got in (("all_gather", y), ("reduce_scatter", z), ("broadcast", b)):
        if not torch.equal(got, x):
            print(f"{name}: wrong result")
            ok = False
    small = torch.ones(256, device=dev, dtype=torch.float32)
    for _ in range(100):
        dist.all_reduce(small)
    torch.cuda.synchronize()
    calls = 2000
    t0 = time.perf_counter()
    for _ in range(calls):
        dist.all_reduce(small)
    torch.cuda.synchronize()
    us = (time.perf_counter() - t0) / calls * 1e6
    version = ".".join(str(v) for v in torch.cuda.nccl.version())
    dist.destroy_process_group()
    print(f"TORCH_RESULT ok={int(ok)} nccl_version={version} us_per_call={us:.2f}")


if __name__ == "__main__":
    main()
