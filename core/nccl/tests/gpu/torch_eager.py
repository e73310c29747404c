"""Eager per-call cost of torch.distributed all_reduce (issue 28), run once with the system NCCL
and once with LD_PRELOAD of libmscclpp_nccl.so.

World size from WORLD_SIZE (default 1; RANK, MASTER_ADDR, MASTER_PORT as torchrun sets them).
For each size (float32, 1 KiB to 256 MiB, x4): a checked call (sum of rank + 1 over the ranks)
and warm-up; then EAGER_REPEATS rounds (default 15), each timing CALLS eager calls of every
size in turn (the order rotated from round to round), each batch timed from the first call to
the stream's end (torch.cuda.synchronize). Per size: the fastest batch's time per call and the
median batch's. The sizes take turns because the host's speed changes over seconds (round 13
on the H100: one run of a library 14 us per call at 1 KiB, the next 24): with one size timed
after the other, a slow phase landed on some sizes and not on others and made a step that was
not there; taking turns, every size sees every phase. Prints per size
"TORCH_EAGER rank=<r> world=<n> bytes=<b> us_per_call=<t> issue_us=<i> median_us=<m> ok=<0|1>"
(issue_us: the host time per call of the fastest batch up to the last call's return, before the
synchronize: when it is close to us_per_call the calls are host-bound, when far below it the
GPU is the bound) and at the end "TORCH_EAGER_DONE rank=<r> ok=<0|1> nccl_version=<x.y.z>".

EAGER_PROFILE=1: also, at the sizes of EAGER_PROFILE_SIZES (default 16 KiB and 64 KiB, the two
sides of the jump measured on the H200), 50 calls under torch.profiler (CPU and CUDA): the
busiest rows by host time, "TORCH_EAGER_PROF bytes=<b> calls=<c> name=<op> count=<k>
cpu_us=<total>", so the runtime/driver calls and GPU work of one library can be put next to
the other's.
"""
import os
import time

import torch
import torch.distributed as dist

SIZES = [1 << k for k in range(10, 29, 2)]  # 1 KiB .. 256 MiB
REPEATS = int(os.environ.get("EAGER_REPEATS", "15"))
PROFILE = os.environ.get("EAGER_PROFILE", "0") == "1"
PROFILE_SIZES = [int(x) for x in os.environ.get("EAGER_PROFILE_SIZES", "16384,65536").split(",") if x]


def calls_for(nbytes):
    # Enough calls for a stable figure, few at the large sizes (GPU-bound there).
    return 200 if nbytes <= (1 << 20) else (100 if nbytes <= (16 << 20) else 30)


def profile(rank, t, nbytes, calls=50, rows=8):
    """Prints the busiest rows (host time) of `calls` eager all-reduces of `t` under
    torch.profiler."""
    from torch.profiler import ProfilerActivity, profile as prof

    torch.cuda.synchronize()
    with prof(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
        for _ in range(calls):
            dist.all_reduce(t)
        torch.cuda.synchronize()
    avg = sorted(p.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    for e in avg[:rows]:
        print(
            f"TORCH_EAGER_PROF rank={rank} bytes={nbytes} calls={calls} name={e.key.replace(' ', '_')} "
            f"count={e.count} cpu_us={e.self_cpu_time_total:.1f}",
            flush=True,
        )

    def dev_us(e):
        return getattr(e, "self_device_time_total", getattr(e, "self_cuda_time_total", 0))

    # GPU work (kernels, copies, memsets) the calls queued: none at all for an in-place call at
    # world size 1.
    for e in sorted((e for e in p.key_averages() if dev_us(e) > 0), key=dev_us, reverse=True)[:6]:
        print(
            f"TORCH_EAGER_PROF rank={rank} bytes={nbytes} calls={calls} gpu={e.key.replace(' ', '_')} "
            f"count={e.count} gpu_us={dev_us(e):.1f}",
            flush=True,
        )


def main():
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29571")
    dev = torch.device("cuda:0")
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=dev)
    all_ok = True
    tensors, oks = {}, {}
    for nbytes in SIZES:
        n = nbytes // 4
        t = torch.full((n,), float(rank + 1), device=dev, dtype=torch.float32)
        dist.all_reduce(t)
        torch.cuda.synchronize()
        want = world * (world + 1) / 2
        ok = bool(torch.all(t == want).item())
        all_ok &= ok
        oks[nbytes] = ok
        t.zero_()  # sums of zeros from here: no overflow over the timed calls
        for _ in range(min(calls_for(nbytes), 50)):
            dist.all_reduce(t)
        torch.cuda.synchronize()
        tensors[nbytes] = t
    # (time per call, issue time per call) of every batch, per size.
    batches = {nbytes: [] for nbytes in SIZES}
    for rnd in range(REPEATS):
        k = rnd % len(SIZES)
        for nbytes in SIZES[k:] + SIZES[:k]:
            t, calls = tensors[nbytes], calls_for(nbytes)
            dist.barrier()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(calls):
                dist.all_reduce(t)
            t1 = time.perf_counter()
            torch.cuda.synchronize()
            us = (time.perf_counter() - t0) / calls * 1e6
            batches[nbytes].append((us, (t1 - t0) / calls * 1e6))
    for nbytes in SIZES:
        b = sorted(batches[nbytes])
        best, median = b[0], b[len(b) // 2][0]
        print(
            f"TORCH_EAGER rank={rank} world={world} bytes={nbytes} us_per_call={best[0]:.2f} "
            f"issue_us={best[1]:.2f} median_us={median:.2f} ok={int(oks[nbytes])}",
            flush=True,
        )
    if PROFILE:
        for nbytes in PROFILE_SIZES:
            if nbytes not in tensors:
                continue
            try:
                profile(rank, tensors[nbytes], nbytes)
            except Exception as e:  # a diagnostic: never the verdict
                print(f"TORCH_EAGER_PROF rank={rank} bytes={nbytes} error={type(e).__name__}:{e}", flush=True)
    version = ".".join(str(v) for v in torch.cuda.nccl.version())
    dist.destroy_process_group()
    print(f"TORCH_EAGER_DONE rank={rank} ok={int(all_ok)} nccl_version={version}", flush=True)


if __name__ == "__main__":
    main()
