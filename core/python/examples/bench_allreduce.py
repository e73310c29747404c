"""Per-call time of ``all_reduce`` from Python on one 1 KiB and one 16 MiB float32 tensor,
eager and inside a CUDA graph, for mscclpp's ``TorchComm`` or for ``torch.distributed``'s
NCCL backend (run that one with LD_PRELOAD=libmscclpp_nccl.so to measure our NCCL library):

    torchrun --nproc-per-node 2 core/python/examples/bench_allreduce.py --impl mscclpp
    LD_PRELOAD=$PWD/target/release/libmscclpp_nccl.so \\
        torchrun --nproc-per-node 2 core/python/examples/bench_allreduce.py --impl torch

Each size: ``--warmup`` calls, then ``--iters`` calls timed with CUDA events on torch's
current stream (eager), then a graph of ``--graph-calls`` calls replayed ``--replays`` times
(graph). The result is checked once per size and mode. Rank 0 prints one line per
measurement: ``BENCH impl=... mode=eager|graph bytes=N ranks=N us_per_call=X``.
"""

from __future__ import annotations

import argparse
import os
from typing import Callable

import torch
import torch.distributed as dist


def timed(fn: Callable[[], None], n: int) -> float:
    """Microseconds per call of ``n`` calls of ``fn`` on the current stream."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(n):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1000.0 / n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--impl", choices=["mscclpp", "torch"], default="mscclpp")
    ap.add_argument("--sizes", default="1024,16777216", help="bytes, comma-separated")
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--graph-calls", type=int, default=50)
    ap.add_argument("--replays", type=int, default=10)
    args = ap.parse_args()

    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local % torch.cuda.device_count())
    dev = torch.device("cuda", torch.cuda.current_device())
    if args.impl == "mscclpp":
        import mscclpp.torch

        dist.init_process_group("gloo")  # carries the UniqueId only
        comm = mscclpp.torch.TorchComm()

        def all_reduce(t: torch.Tensor) -> None:
            comm.all_reduce(t)

    else:
        dist.init_process_group("nccl", device_id=dev)

        def all_reduce(t: torch.Tensor) -> None:
            dist.all_reduce(t)

    rank, n = dist.get_rank(), dist.get_world_size()
    for nbytes in (int(s) for s in args.sizes.split(",")):
        count = nbytes // 4
        x = torch.ones(count, device=dev)
        all_reduce(x)
        torch.cuda.synchronize()
        assert bool((x == n).all()), f"rank {rank}: {args.impl} all_reduce of {nbytes} bytes: {x[:4]} != {n}"
        x.zero_()  # sums of zeros stay finite over every timed call
        for _ in range(args.warmup):
            all_reduce(x)
        torch.cuda.synchronize()
        eager = timed(lambda: all_reduce(x), args.iters)
        if rank == 0:
            print(f"BENCH impl={args.impl} mode=eager bytes={nbytes} ranks={n} us_per_call={eager:.2f}", flush=True)
        graph = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s), torch.cuda.graph(graph, stream=s):
            for _ in range(args.graph_calls):
                all_reduce(x)
        torch.cuda.current_stream().wait_stream(s)
        x.fill_(1.0)
        graph.replay()
        torch.cuda.synchronize()
        want = torch.full_like(x, float(n) ** args.graph_calls)
        assert torch.allclose(x, want, rtol=1e-5), f"rank {rank}: graph of {args.impl} all_reduce: {x[:4]} != {want[0]}"
        graph.replay()  # warm
        x.fill_(0.0)  # sums of zeros stay exact over every replay
        in_graph = timed(graph.replay, args.replays) / args.graph_calls
        if rank == 0:
            print(f"BENCH impl={args.impl} mode=graph bytes={nbytes} ranks={n} us_per_call={in_graph:.2f}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
