"""PyTorch check of libmscclpp_nccl with the allocator registration hook (issue 28).

Run as WORLD_SIZE processes on one GPU shared by every rank (MPS), RANK/WORLD_SIZE/MASTER_ADDR/
MASTER_PORT set, with LD_PRELOAD of our .so and TORCH_NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK=1
(PyTorch then calls ncclCommRegister on every segment of its caching allocator, and
ncclCommDeregister when it frees one); PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True makes
the segments cuMem memory. See reg_gpu.sh.
Every collective is compared exactly (integer-valued data): all_reduce (sum; float32, float16,
bfloat16; 1 KiB to 64 MiB, the large ones above the zero-copy threshold, out of place through
new tensors and in place), all_gather_into_tensor, reduce_scatter_tensor, broadcast from every
root; then torch.cuda.empty_cache() (segments deregistered and freed) and the same again on new
memory, possibly at the same addresses. Each check prints "PASS <name>" or "FAIL <name>: <why>";
the last line is "TORCH_REG rank=<r> world=<w> passed=<n> failed=<m> hook=<0|1>"; exit code 1 on
any failure.
"""
import os
import sys
import traceback

from gpu_env import setup  # noqa: E402  (this folder)

rank, world = setup(29595)

import datetime  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

outcomes = []  # one bool per check


def check(name, ok, why=""):
    outcomes.append(bool(ok))
    print(f"PASS {name}" if ok else f"FAIL {name}: {why}", flush=True)


def values(r, n, dtype, dev):
    """Rank r's input: small integers, exact in every dtype used here."""
    return (torch.arange(n, device=dev, dtype=torch.int64).remainder(13) + r + 1).to(dtype)


def reduced(n, dtype, dev):
    return sum(values(r, n, torch.float32, dev) for r in range(world)).to(dtype)


def round_of_checks(dev, tag):
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        for nbytes in (1 << 10, 1 << 20, 4 << 20, 64 << 20):
            n = nbytes // torch.tensor([], dtype=dtype).element_size()
            want = reduced(n, dtype, dev)
            t = values(rank, n, dtype, dev)
            dist.all_reduce(t)
            torch.cuda.synchronize()
            check(f"{tag} all_reduce in place {dtype} {nbytes} B", torch.equal(t, want),
                  f"max |diff| {(t.float() - want.float()).abs().max().item()}")
    n = (8 << 20) // 4
    x = values(rank, n, torch.float32, dev)
    y = torch.empty(n * world, device=dev, dtype=torch.float32)
    dist.all_gather_into_tensor(y, x)
    torch.cuda.synchronize()
    want = torch.cat([values(r, n, torch.float32, dev) for r in range(world)])
    check(f"{tag} all_gather_into_tensor {n * 4} B per rank", torch.equal(y, want))
    big = values(rank, n * world, torch.float32, dev)
    z = torch.empty(n, device=dev, dtype=torch.float32)
    dist.reduce_scatter_tensor(z, big)
    torch.cuda.synchronize()
    want = reduced(n * world, torch.float32, dev)[rank * n:(rank + 1) * n]
    check(f"{tag} reduce_scatter_tensor {n * 4} B per rank", torch.equal(z, want))
    for root in range(world):
        b = values(rank, n, torch.float32, dev)
        dist.broadcast(b, src=root)
        torch.cuda.synchronize()
        check(f"{tag} broadcast from {root}", torch.equal(b, values(root, n, torch.float32, dev)))


def main():
    dev = torch.device("cuda:0")
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=dev,
                            timeout=datetime.timedelta(seconds=120))
    hook = os.environ.get("TORCH_NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK") == "1"
    try:
        round_of_checks(dev, "first")
        dist.barrier()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()  # every free segment deregistered and released
        round_of_checks(dev, "after empty_cache")
        maps = [ln for ln in open("/proc/self/maps") if "libmscclpp_nccl" in ln]
        check("libmscclpp_nccl is loaded", len(maps) > 0)
    except Exception:  # a failed collective leaves the others waiting: report and stop
        traceback.print_exc()
        check("no exception", False, "see the traceback")
    failed = outcomes.count(False)
    print(f"TORCH_REG rank={rank} world={world} passed={outcomes.count(True)} failed={failed} hook={int(hook)}")
    sys.stdout.flush()
    try:
        dist.destroy_process_group()
    except Exception:
        pass
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
