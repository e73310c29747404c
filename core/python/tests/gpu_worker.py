"""One rank of a GPU (or torch-on-host) test: ``python gpu_worker.py CASE RANK NRANKS ADDRESS``.

torch tensors on GPU ``rank % device_count`` (CUDA builds) or on the CPU (the host backend),
every collective in and out of place in float32, float16 and bfloat16 (sum and max), checked
exactly against torch on the same values; CUDA graph capture and replay; CuPy arrays; the
executor on RawGpuBuffers. ``ranks.run_ranks`` starts the ranks (tests/test_gpu.py).
"""

from __future__ import annotations

import sys
from typing import Any

import torch

import mscclpp

CUDA = mscclpp.backend() == "cuda"
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
COUNTS = [1, 1000, 1 << 16, (1 << 20) + 3]


def device(rank: int) -> torch.device:
    if CUDA:
        torch.cuda.set_device(rank % torch.cuda.device_count())
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def sync() -> None:
    if CUDA:
        torch.cuda.synchronize()


def data(rank: int, count: int, dtype: torch.dtype, dev: torch.device) -> torch.Tensor:
    """Small integral values: exact in every type here, also summed over 8 ranks."""
    return ((torch.arange(count, device=dev, dtype=torch.int64) * 7 + rank * 3) % 11).to(dtype)


def reduce(ts: list[torch.Tensor], op: str) -> torch.Tensor:
    s = torch.stack([t.double() for t in ts])
    r = s.sum(0) if op == "sum" else s.max(0).values
    return r.to(ts[0].dtype)


def check(what: str, got: torch.Tensor, want: torch.Tensor) -> None:
    sync()
    if not torch.equal(got, want):
        bad = (got != want).nonzero().flatten()
        i = int(bad[0])
        raise AssertionError(f"{what}: {bad.numel()} of {want.numel()} differ; first at {i}: got {got[i]}, expected {want[i]}")


def every_allreduce(g: mscclpp.CommGroup, run: Any) -> list[str]:
    """``run(name)`` for every all-reduce algorithm; those the build refuses for this world
    (alike on every rank, before any traffic) are skipped. Returns the names that ran."""
    ran = []
    for name in g.collectives.algorithm_names("allreduce"):
        try:
            run(name)
        except mscclpp.MscclppError as e:
            print(f"allreduce {name}: refused: {e}", flush=True)
            continue
        ran.append(name)
    return ran


def case_collectives(g: mscclpp.CommGroup, dev: torch.device) -> None:
    r, n = g.rank, g.nranks
    for dt in DTYPES:
        for count in COUNTS:
            for op in ("sum", "max"):
                want = reduce([data(p, count, dt, dev) for p in range(n)], op)
                x = data(r, count, dt, dev)
                g.all_reduce(x, op=op)
                check(f"all_reduce in place {dt} {op} {count}", x, want)
                y = torch.full((count,), 99, dtype=dt, device=dev)
                g.all_reduce(data(r, count, dt, dev), y, op=op)
                check(f"all_reduce out of place {dt} {op} {count}", y, want)
                full = reduce([data(p, n * count, dt, dev) for p in range(n)], op)
                y = torch.full((count,), 99, dtype=dt, device=dev)
                g.reduce_scatter(data(r, n * count, dt, dev), y, op=op)
                check(f"reduce_scatter out of place {dt} {op} {count}", y, full[r * count : (r + 1) * count])
                buf = data(r, n * count, dt, dev)
                g.reduce_scatter(buf, op=op)
                check(f"reduce_scatter in place {dt} {op} {count}", buf[r * count : (r + 1) * count], full[r * count : (r + 1) * count])
            want = torch.cat([data(p, count, dt, dev) for p in range(n)])
            y = torch.full((n * count,), 99, dtype=dt, device=dev)
            g.all_gather(data(r, count, dt, dev), y)
            check(f"all_gather out of place {dt} {count}", y, want)
            buf = torch.full((n * count,), 99, dtype=dt, device=dev)
            buf[r * count : (r + 1) * count] = data(r, count, dt, dev)
            g.all_gather(buf)
            check(f"all_gather in place {dt} {count}", buf, want)
            root = n - 1
            y = torch.full((count,), 99, dtype=dt, device=dev)
            g.broadcast(data(r, count, dt, dev), y, root=root)
            check(f"broadcast out of place {dt} {count}", y, data(root, count, dt, dev))
            buf = data(r, count, dt, dev) if r == root else torch.zeros(count, dtype=dt, device=dev)
            g.broadcast(buf, root=root)
            check(f"broadcast in place {dt} {count}", buf, data(root, count, dt, dev))
        print(f"rank {r}: {dt} collectives correct", flush=True)


def case_algorithms(g: mscclpp.CommGroup, dev: torch.device) -> None:
    """Every all-reduce algorithm the build accepts for this world, forced per call."""
    r, n = g.rank, g.nranks
    count = 1 << 18
    want = reduce([data(p, count, torch.float16, dev) for p in range(n)], "sum")

    def run(name: str) -> None:
        x = data(r, count, torch.float16, dev)
        g.all_reduce(x, algorithm=name)
        check(f"all_reduce by {name}", x, want)

    ran = every_allreduce(g, run)
    print(f"rank {r}: all_reduce algorithms run and correct: {ran}", flush=True)
    assert ran, "no all-reduce algorithm ran"


def case_library_memory(g: mscclpp.CommGroup, dev: torch.device) -> None:
    """Tensors of mscclpp.torch.empty (peer-mappable memory): every all-reduce algorithm,
    zero-copy ones included, and every collective, out of place."""
    import mscclpp.torch as mt

    r, n = g.rank, g.nranks
    count = 1 << 16
    want = reduce([data(p, count, torch.bfloat16, dev) for p in range(n)], "sum")
    x, y = mt.empty(count, dtype=torch.bfloat16), mt.empty(count, dtype=torch.bfloat16)
    assert x.device == dev, (x.device, dev)

    def run(name: str) -> None:
        x.copy_(data(r, count, torch.bfloat16, dev))
        g.all_reduce(x, y, algorithm=name)
        check(f"all_reduce by {name} on library memory", y, want)

    ran = every_allreduce(g, run)
    print(f"rank {r}: all_reduce on mscclpp.torch.empty tensors by {ran}", flush=True)
    gathered = mt.empty(n, count, dtype=torch.bfloat16)
    x.copy_(data(r, count, torch.bfloat16, dev))
    g.all_gather(x, gathered)
    check("all_gather on library memory", gathered.flatten(), torch.cat([data(p, count, torch.bfloat16, dev) for p in range(n)]))


def case_graph(g: mscclpp.CommGroup, dev: torch.device) -> None:
    """Every collective and a send/recv ring captured in one CUDA graph on a side stream,
    replayed 5 times with new input data before each replay (the graph reads the tensors'
    current contents), every result checked."""
    if not CUDA:
        print("graph: CUDA only")
        return
    r, n = g.rank, g.nranks
    nxt, prv = (r + 1) % n, (r - 1) % n
    for dt in DTYPES:
        count = 1 << 16
        x = data(r, count, dt, dev)
        src = data(r, count, dt, dev)
        gathered = torch.zeros(n * count, dtype=dt, device=dev)
        rs_in = data(r, n * count, dt, dev)
        rs_out = torch.zeros(count, dtype=dt, device=dev)
        bc = data(r, count, dt, dev)
        ring = torch.zeros(count, dtype=dt, device=dev)

        def calls() -> None:
            g.all_reduce(x)
            g.all_gather(src, gathered)
            g.reduce_scatter(rs_in, rs_out)
            g.broadcast(bc, root=0)
            with g.group():
                g.send(src, nxt)
                g.recv(ring, prv)

        calls()  # once outside capture: the collectives register what they can then
        sync()
        graph = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s), torch.cuda.graph(graph, stream=s):
            calls()
        torch.cuda.current_stream().wait_stream(s)
        for it in range(5):
            # New data every replay: rank p's inputs are data(p + 5 * it).
            def d(p: int, c: int = count) -> torch.Tensor:
                return data(p + 5 * it, c, dt, dev)

            x.copy_(d(r))
            src.copy_(d(r))
            rs_in.copy_(d(r, n * count))
            bc.copy_(d(r))
            for t in (gathered, rs_out, ring):
                t.zero_()
            sync()
            graph.replay()
            check(f"graph replay {it} all_reduce {dt}", x, reduce([d(p) for p in range(n)], "sum"))
            check(f"graph replay {it} all_gather {dt}", gathered, torch.cat([d(p) for p in range(n)]))
            full = reduce([d(p, n * count) for p in range(n)], "sum")
            check(f"graph replay {it} reduce_scatter {dt}", rs_out, full[r * count : (r + 1) * count])
            check(f"graph replay {it} broadcast {dt}", bc, d(0))
            check(f"graph replay {it} send/recv ring {dt}", ring, d(prv))
    print(f"rank {r}: graph capture and 5 replays with new data correct", flush=True)


def case_p2p(g: mscclpp.CommGroup, dev: torch.device) -> None:
    """send/recv of torch tensors on the current stream: a ring, an all-pairs exchange of
    unequal sizes in one batch (with this rank itself), and TorchComm-style single calls."""
    r, n = g.rank, g.nranks
    nxt, prv = (r + 1) % n, (r - 1) % n
    for dt in DTYPES:
        for count in COUNTS:
            y = torch.full((count,), 99, dtype=dt, device=dev)
            with g.group():
                g.send(data(r, count, dt, dev), nxt)
                g.recv(y, prv)
            check(f"send/recv ring {dt} {count}", y, data(prv, count, dt, dev))

        def size(a: int, b: int) -> int:
            return 1 + a * 70001 + b * 1237

        got = {p: torch.zeros(size(p, r), dtype=dt, device=dev) for p in range(n)}
        with g.group():
            for p in range(n):
                g.send(data(r + 7 * p, size(r, p), dt, dev), p)
                g.recv(got[p], p)
        for p, y in got.items():
            check(f"send/recv unequal sizes {dt} from {p}", y, data(p + 7 * r, size(p, r), dt, dev))
    g.p2p.check()
    print(f"rank {r}: send/recv correct", flush=True)


def case_channel_put(g: mscclpp.CommGroup, dev: torch.device) -> None:
    """A kernel compiled at run time (CuPy RawModule, nvcc, -I mscclpp.get_include()) takes
    MemoryChannel device handles (bytes copied to the GPU) and puts this rank's block into
    every peer's tensor of mscclpp.torch.empty, signals and waits; every block checked."""
    import cupy as cp
    import numpy as np

    import mscclpp.torch as mt

    r, n = g.rank, g.nranks
    count = 1 << 16
    nbytes = count * 4
    src = mt.empty(count, dtype=torch.float32)
    src.copy_(data(r, count, torch.float32, dev))
    dst = mt.empty(n * count, dtype=torch.float32)
    dst.zero_()
    sync()
    comm = g.communicator
    src_reg = comm.register_memory(src)
    dst_reg = comm.register_memory(dst)
    peers = [p for p in range(n) if p != r]
    conn_f = {p: comm.connect(p, 11, device=dev.index) for p in peers}
    for p in peers:
        comm.send_memory(dst_reg, p, 12)
    remote = {p: comm.recv_memory(p, 12) for p in peers}
    conns = {p: conn_f[p].get() for p in peers}
    sem_f = {p: comm.build_semaphore(conns[p], p, 13) for p in peers}
    chans = [mscclpp.MemoryChannel(sem_f[p].get(), remote[p].get(), src_reg) for p in peers]
    handles = b"".join(c.device_handle() for c in chans)
    assert len(handles) == 48 * len(chans)
    code = r"""
#include <mscclpp/memory_channel_device.hpp>
extern "C" __global__ void put_all(mscclpp::MemoryChannelDeviceHandle* chans,
                                   unsigned long long bytes, unsigned long long dstOffset) {
  mscclpp::MemoryChannelDeviceHandle& ch = chans[blockIdx.x];
  ch.put(dstOffset, 0, bytes, threadIdx.x, blockDim.x);
  __syncthreads();
  if (threadIdx.x == 0) {
    ch.signal();
    ch.wait(1LL << 32);
  }
}
"""
    with cp.cuda.Device(dev.index):
        mod = cp.RawModule(
            code=code,
            backend="nvcc",
            options=(f"-I{mscclpp.get_include()}", "-std=c++17"),
        )
        kernel = mod.get_function("put_all")
        dev_handles = cp.asarray(np.frombuffer(handles, dtype=np.uint8))
        g.barrier()  # every rank's channels exist before any signal
        kernel((len(chans),), (512,), (dev_handles, cp.uint64(nbytes), cp.uint64(r * nbytes)))
        cp.cuda.Device(dev.index).synchronize()
    g.barrier()  # every peer's kernel finished writing here
    for p in peers:
        check(f"put from rank {p}'s kernel", dst[p * count : (p + 1) * count], data(p, count, torch.float32, dev))
    check("own block untouched", dst[r * count : (r + 1) * count], torch.zeros(count, device=dev))
    print(f"rank {r}: channel put from a run-time-compiled kernel correct", flush=True)


def case_dlpack(g: mscclpp.CommGroup, dev: torch.device) -> None:
    """RawGpuBuffer through torch.from_dlpack (zero-copy, kept alive by the tensor) and a
    DLPack-only producer in the collectives."""
    r, n = g.rank, g.nranks
    buf = mscclpp.RawGpuBuffer(4 * 4096, dev.index if CUDA else None)
    t = torch.from_dlpack(buf).view(torch.float32)
    assert t.data_ptr() == buf.ptr and t.numel() == 4096
    del buf
    t.copy_(data(r, 4096, torch.float32, dev))
    g.all_reduce(t)
    check("all_reduce on a RawGpuBuffer through torch.from_dlpack", t, reduce([data(p, 4096, torch.float32, dev) for p in range(n)], "sum"))
    from worker import DlpackOnly as Only  # a producer that only speaks DLPack

    y = torch.zeros(4096, device=dev)
    sync()
    g.all_reduce(Only(data(r, 4096, torch.float32, dev)), Only(y))
    check("all_reduce of DLPack-only producers", y, reduce([data(p, 4096, torch.float32, dev) for p in range(n)], "sum"))
    print(f"rank {r}: DLPack correct", flush=True)


def case_cupy(g: mscclpp.CommGroup, dev: torch.device) -> None:
    import cupy as cp

    r, n = g.rank, g.nranks
    with cp.cuda.Device(dev.index):
        x = ((cp.arange(4096, dtype=cp.int64) * 7 + r * 3) % 11).astype(cp.float32)
        g.all_reduce(x)
        cp.cuda.get_current_stream().synchronize()
        want = sum(((cp.arange(4096, dtype=cp.int64) * 7 + p * 3) % 11).astype(cp.float32) for p in range(n))
        assert bool((x == want).all()), "cupy all_reduce"
        # mscclpp.GpuBuffer: a CuPy array in library memory.
        a = mscclpp.GpuBuffer((4, 1024), cp.float32, dev.index)
        assert isinstance(a, cp.ndarray) and a.shape == (4, 1024) and not bool(a.any())
        a[:] = ((cp.arange(4096, dtype=cp.int64) * 7 + r * 3) % 11).astype(cp.float32).reshape(4, 1024)
        g.all_reduce(a)
        cp.cuda.get_current_stream().synchronize()
        assert bool((a.reshape(-1) == want).all()), "all_reduce of a mscclpp.GpuBuffer"
    print(f"rank {r}: CuPy all_reduce (and on a GpuBuffer) correct", flush=True)


def case_executor(g: mscclpp.CommGroup, dev: torch.device, plan_path: str) -> None:
    r, n = g.rank, g.nranks
    plan = g.load_plan(plan_path)
    nbytes = 1 << 16
    count = nbytes // 4
    sb = mscclpp.RawGpuBuffer(nbytes, dev.index if CUDA else None)
    rb = sb if plan.is_in_place else mscclpp.RawGpuBuffer(nbytes, dev.index if CUDA else None)
    if CUDA:
        send = torch.as_tensor(sb, device=dev).view(torch.float32)
        recv = torch.as_tensor(rb, device=dev).view(torch.float32)
    else:
        send = torch.frombuffer(sb, dtype=torch.float32)
        recv = torch.frombuffer(rb, dtype=torch.float32)
    want = reduce([data(p, count, torch.float32, dev) for p in range(n)], "sum")
    for it in range(3):
        send.copy_(data(r, count, torch.float32, dev))
        sync()
        g.execute(plan, sb, rb, dtype="float32")
        check(f"plan {plan.name} run {it}", recv, want)
    print(f"rank {r}: plan {plan.name} correct", flush=True)


def main() -> None:
    case, rank, nranks, addr, *rest = sys.argv[1:]
    r, n = int(rank), int(nranks)
    dev = device(r)
    g = mscclpp.CommGroup(r, n, addr, device=dev.index if CUDA else None)
    fn: Any = globals()[f"case_{case}"]
    fn(g, dev, *rest)
    sync()
    g.barrier()
    print(f"rank {r}: {case} passed", flush=True)


if __name__ == "__main__":
    main()
