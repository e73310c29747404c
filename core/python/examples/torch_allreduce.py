"""mscclpp's all-reduce (and the other collectives) on torch tensors, through
``mscclpp.torch.TorchComm`` made from the torch.distributed world:

    torchrun --nproc-per-node 2 core/python/examples/torch_allreduce.py

CUDA build and GPUs: CUDA tensors of GPU ``LOCAL_RANK % device_count`` on torch's current
stream, plus a send/recv ring and a CUDA graph capture and replay; the host backend: CPU
tensors. Every result is
checked exactly; rank 0 prints one line per check.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

import mscclpp
import mscclpp.torch


def main() -> None:
    cuda = mscclpp.backend() == "cuda" and torch.cuda.is_available()
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if cuda:
        torch.cuda.set_device(local % torch.cuda.device_count())
    dist.init_process_group("gloo")  # carries the UniqueId only
    comm = mscclpp.torch.TorchComm()
    rank, n = comm.rank, comm.world_size
    dev = torch.device("cuda") if cuda else torch.device("cpu")

    def say(msg: str) -> None:
        if rank == 0:
            print(msg, flush=True)

    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        for count in (1024, 1 << 20):
            x = torch.full((count,), float(rank + 1), dtype=dtype, device=dev)
            comm.all_reduce(x)
            if cuda:
                torch.cuda.synchronize()
            want = n * (n + 1) / 2
            assert bool((x == want).all()), f"rank {rank}: all_reduce {dtype} {count}: {x[:4]} != {want}"
            say(f"all_reduce {dtype} x {count}: correct")
    count = 4096
    inp = torch.full((count,), float(rank), device=dev)
    out = torch.empty(n * count, device=dev)
    comm.all_gather_into_tensor(out, inp)
    rs = torch.empty(count, device=dev)
    comm.reduce_scatter_tensor(rs, torch.ones(n * count, device=dev))
    b = torch.full((count,), float(rank), device=dev)
    comm.broadcast(b, src=n - 1)
    if cuda:
        torch.cuda.synchronize()
    assert bool((out.view(n, count) == torch.arange(n, device=dev, dtype=out.dtype)[:, None]).all())
    assert bool((rs == n).all()) and bool((b == n - 1).all())
    say("all_gather_into_tensor, reduce_scatter_tensor, broadcast: correct")
    # send/recv: a ring, both calls in one batch (one launch on GPUs).
    got = torch.zeros(count, device=dev)
    with comm.batch():
        comm.send(torch.full((count,), float(rank), device=dev), (rank + 1) % n)
        comm.recv(got, (rank - 1) % n)
    if cuda:
        torch.cuda.synchronize()
    assert bool((got == (rank - 1) % n).all()), f"rank {rank}: send/recv ring: {got[:4]}"
    say("send/recv ring in one batch: correct")
    if cuda:
        g = torch.cuda.CUDAGraph()
        y = torch.ones(1 << 16, device=dev)
        comm.all_reduce(y)  # once outside capture (the collectives set up what they need)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            with torch.cuda.graph(g, stream=s):
                comm.all_reduce(y)
        torch.cuda.current_stream().wait_stream(s)
        for i in range(3):
            y.fill_(1.0)
            g.replay()
        torch.cuda.synchronize()
        assert bool((y == n).all()), f"rank {rank}: graph replay: {y[:4]}"
        say("all_reduce captured in a CUDA graph, replayed 3 times: correct")
    comm.barrier()
    dist.destroy_process_group()
    say(f"torch_allreduce: {n} ranks, {mscclpp.backend()} backend: all correct")


if __name__ == "__main__":
    main()
