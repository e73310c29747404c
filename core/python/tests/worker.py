"""One rank of a multi-process test: ``python worker.py CASE RANK NRANKS ADDRESS [ARGS...]``.

Every case builds a :class:`mscclpp.CommGroup` over 127.0.0.1 (small scratch, so a rank
allocates little), checks its results exactly against NumPy and exits non-zero on the first
mismatch (the traceback says which call). ``ranks.run_ranks`` starts the ranks.
"""

from __future__ import annotations

import os
import pickle
import sys
import time
from typing import Any, Callable

import numpy as np

import mscclpp

DTYPES = [np.float32, np.float16, np.int32, np.float64, np.int8, np.int64]
OPS = ["sum", "max", "min"]
COUNTS = [0, 1, 37, 1024, 65543]
# The default scratch sizes: the default selector picks algorithms by them (a 256 KiB all-reduce
# takes `packet`, which needs 1 MiB of LL scratch).
SMALL: dict[str, Any] = dict(host_timeout=60.0)


def data(rank: int, count: int, dtype: Any) -> np.ndarray:
    """Rank ``rank``'s small integral values, exact in every type and reduction here."""
    return ((np.arange(count, dtype=np.int64) * 7 + rank * 3) % 11).astype(dtype)


def reduce(arrays: list[np.ndarray], op: str) -> np.ndarray:
    stack = np.stack([a.astype(np.float64) for a in arrays])
    out = {"sum": stack.sum(0), "max": stack.max(0), "min": stack.min(0)}[op]
    return out.astype(arrays[0].dtype)


def check(what: str, got: np.ndarray, want: np.ndarray) -> None:
    if got.shape != want.shape or not np.array_equal(got, want):
        bad = np.flatnonzero(got != want) if got.shape == want.shape else []
        i = int(bad[0]) if len(bad) else -1
        raise AssertionError(
            f"{what}: {len(bad)} of {want.size} elements differ; first at {i}: "
            f"got {got[i] if i >= 0 else got.shape}, expected {want[i] if i >= 0 else want.shape}"
        )


def group(rank: int, nranks: int, addr: str, **kw: Any) -> mscclpp.CommGroup:
    return mscclpp.CommGroup(rank, nranks, addr, **{**SMALL, **kw})


def case_allreduce(g: mscclpp.CommGroup, *args: str) -> None:
    r, n = g.rank, g.nranks
    for dt in DTYPES:
        for op in OPS:
            for count in COUNTS:
                want = reduce([data(p, count, dt) for p in range(n)], op)
                x = data(r, count, dt)
                g.all_reduce(x, op=op)
                check(f"all_reduce in place {np.dtype(dt)} {op} {count}", x, want)
                x = data(r, count, dt)
                y = np.full(count, 99, dtype=dt)
                g.all_reduce(x, y, op=op)
                check(f"all_reduce out of place {np.dtype(dt)} {op} {count}", y, want)
                check(f"all_reduce out of place leaves send {np.dtype(dt)} {op} {count}", x, data(r, count, dt))


def case_allgather(g: mscclpp.CommGroup, *args: str) -> None:
    r, n = g.rank, g.nranks
    for dt in DTYPES:
        for count in COUNTS:
            want = np.concatenate([data(p, count, dt) for p in range(n)])
            y = np.full(n * count, 99, dtype=dt)
            g.all_gather(data(r, count, dt), y)
            check(f"all_gather out of place {np.dtype(dt)} {count}", y, want)
            buf = np.full(n * count, 99, dtype=dt)
            buf[r * count : (r + 1) * count] = data(r, count, dt)
            g.all_gather(buf)
            check(f"all_gather in place {np.dtype(dt)} {count}", buf, want)


def case_reducescatter(g: mscclpp.CommGroup, *args: str) -> None:
    r, n = g.rank, g.nranks
    for dt in DTYPES:
        for op in OPS:
            for count in COUNTS:
                full = reduce([data(p, n * count, dt) for p in range(n)], op)
                want = full[r * count : (r + 1) * count]
                y = np.full(count, 99, dtype=dt)
                g.reduce_scatter(data(r, n * count, dt), y, op=op)
                check(f"reduce_scatter out of place {np.dtype(dt)} {op} {count}", y, want)
                buf = data(r, n * count, dt)
                g.reduce_scatter(buf, op=op)
                check(f"reduce_scatter in place {np.dtype(dt)} {op} {count}", buf[r * count : (r + 1) * count], want)


def case_broadcast(g: mscclpp.CommGroup, *args: str) -> None:
    r, n = g.rank, g.nranks
    for dt in DTYPES:
        for root in sorted({0, n - 1}):
            for count in COUNTS:
                want = data(root, count, dt)
                y = np.full(count, 99, dtype=dt)
                g.broadcast(data(r, count, dt), y, root=root)
                check(f"broadcast out of place {np.dtype(dt)} root {root} {count}", y, want)
                buf = data(r, count, dt) if r == root else np.full(count, 99, dtype=dt)
                g.broadcast(buf, root=root)
                check(f"broadcast in place {np.dtype(dt)} root {root} {count}", buf, want)


def case_algorithms(g: mscclpp.CommGroup, *args: str) -> None:
    """Every algorithm of every collective that the host backend can run, forced per call
    (the ones it refuses are refused alike on every rank before any traffic)."""
    r, n = g.rank, g.nranks
    count = 4096
    ran: dict[str, list[str]] = {}
    runs: dict[str, Callable[[str], None]] = {}

    def ar(name: str) -> None:
        x, want = data(r, count, np.float32), reduce([data(p, count, np.float32) for p in range(n)], "sum")
        g.all_reduce(x, algorithm=name)
        check(f"all_reduce by {name}", x, want)

    def ag(name: str) -> None:
        y, want = np.zeros(n * count, np.float32), np.concatenate([data(p, count, np.float32) for p in range(n)])
        g.all_gather(data(r, count, np.float32), y, algorithm=name)
        check(f"all_gather by {name}", y, want)

    def rs(name: str) -> None:
        full = reduce([data(p, n * count, np.float32) for p in range(n)], "sum")
        y = np.zeros(count, np.float32)
        g.reduce_scatter(data(r, n * count, np.float32), y, algorithm=name)
        check(f"reduce_scatter by {name}", y, full[r * count : (r + 1) * count])

    def bc(name: str) -> None:
        y = np.zeros(count, np.float32)
        g.broadcast(data(r, count, np.float32), y, root=n - 1, algorithm=name)
        check(f"broadcast by {name}", y, data(n - 1, count, np.float32))

    runs = {"allreduce": ar, "allgather": ag, "reducescatter": rs, "broadcast": bc}
    for kind, run in runs.items():
        for name in g.collectives.algorithm_names(kind):
            try:
                run(name)
            except mscclpp.MscclppError as e:
                print(f"{kind} {name}: refused: {e}")
                continue
            ran.setdefault(kind, []).append(name)
    print("ran:", ran)
    for kind in runs:
        assert len(ran.get(kind, [])) >= 1, f"no {kind} algorithm ran: {ran}"
    assert len(ran["allreduce"]) >= 3, ran
    # A forced algorithm stays until un-forced.
    g.collectives.force_algorithm("allreduce", ran["allreduce"][-1])
    assert g.collectives.algorithm_for("allreduce", 1 << 20) == ran["allreduce"][-1]
    ar(ran["allreduce"][-1])
    g.collectives.force_algorithm("allreduce", None)
    # The flight recorder: the last call, an all-reduce by the forced algorithm, done.
    calls = g.collectives.recent_calls()
    assert 0 < len(calls) <= 64, calls
    last = calls[-1]
    assert last["collective"] == "allreduce" and last["state"] == "done", last
    assert last["algorithm"] == ran["allreduce"][-1], last
    assert [c["seq"] for c in calls] == list(range(calls[0]["seq"], last["seq"] + 1)), calls


def case_bootstrap(g: mscclpp.CommGroup, *args: str) -> None:
    r, n = g.rank, g.nranks
    b = g.bootstrap
    got = b.all_gather(f"rank {r}".encode())
    assert got == [f"rank {p}".encode() for p in range(n)], got
    b.send(b"hello %d" % r, (r + 1) % n, 7)
    msg = b.recv((r - 1) % n, 7)
    assert msg == b"hello %d" % ((r - 1) % n), msg
    assert g.nranks_per_node == n
    assert g.communicator.rank == r and g.communicator.nranks == n
    g.barrier()


def case_uniqueid(rank: int, nranks: int, addr: str, path: str) -> None:
    """Rank 0 creates a UniqueId and hands its bytes to the others through a file."""
    if rank == 0:
        uid = mscclpp.UniqueId.create()
        assert mscclpp.UniqueId.from_bytes(bytes(uid)) == uid
        assert pickle.loads(pickle.dumps(uid)) == uid
        with open(path + ".tmp", "wb") as f:
            f.write(bytes(uid))
        os.rename(path + ".tmp", path)
        address: Any = uid
    else:
        deadline = time.monotonic() + 60
        while not os.path.exists(path):
            assert time.monotonic() < deadline, "no UniqueId from rank 0"
            time.sleep(0.05)
        with open(path, "rb") as f:
            address = f.read()  # its bytes work as well as the object
    g = group(rank, nranks, address)
    x = data(rank, 100, np.float32)
    g.all_reduce(x)
    check("all_reduce over a UniqueId group", x, reduce([data(p, 100, np.float32) for p in range(nranks)], "sum"))
    g.barrier()


def case_executor(g: mscclpp.CommGroup, plan_path: str) -> None:
    """An all-reduce execution plan on RawGpuBuffers viewed through NumPy."""
    r, n = g.rank, g.nranks
    plan = g.load_plan(plan_path)
    assert plan.world_size == n and plan.collective == "allreduce", plan
    nbytes = 1 << 16
    count = nbytes // 4
    send_buf = mscclpp.RawGpuBuffer(nbytes)
    send = np.frombuffer(send_buf, dtype=np.float32)
    want = reduce([data(p, count, np.float32) for p in range(n)], "sum")
    if plan.is_in_place:
        recv_buf, recv = send_buf, send
    else:
        recv_buf = mscclpp.RawGpuBuffer(nbytes)
        recv = np.frombuffer(recv_buf, dtype=np.float32)
    for it in range(3):
        send[:] = data(r, count, np.float32)
        if recv is not send:
            recv[:] = 0
        g.execute(plan, send_buf, recv_buf, dtype="float32")
        check(f"plan {plan.name} run {it}", recv.copy(), want)
    # Memory the library did not allocate is refused, alike on every rank, before any traffic.
    try:
        g.execute(plan, np.zeros(count, np.float32), np.zeros(count, np.float32))
    except mscclpp.MscclppError as e:
        print("foreign memory refused:", e)
        assert e.code == "ExecutorError", e.code
    else:
        raise AssertionError("the executor ran on NumPy-allocated memory")
    # NumPy views of the library's memory work as well.
    send[:] = data(r, count, np.float32)
    g.execute(plan, send, recv)
    check(f"plan {plan.name} on NumPy views", recv.copy(), want)
    # Tracing: two traced runs count two launches of every block and each op of the plan.
    ex = g.executor
    assert not ex.tracing
    ex.set_trace(True)
    assert ex.tracing
    for it in range(2):
        send[:] = data(r, count, np.float32)
        g.execute(plan, send, recv)
        check(f"plan {plan.name} traced run {it}", recv.copy(), want)
    ex.set_trace(False)
    traces = ex.take_trace()
    assert len(traces) == 1, traces
    t = traces[0]
    assert t["plan"] == plan.name and t["send_size"] == nbytes, t
    assert f"trace of `{plan.name}`" in t["text"], t["text"]
    assert t["blocks"] and all(b["launches"] == 2 for b in t["blocks"]), t
    names = [o["name"] for o in t["blocks"][0]["ops"]]
    assert names and all(o["runs"] >= 2 and o["us"] >= 0 for o in t["blocks"][0]["ops"]), t
    print("trace ops:", names)
    assert ex.take_trace() == [], "reading zeroes the counts"
    g.barrier()


def case_registered(g: mscclpp.CommGroup, *args: str) -> None:
    """register_buffer: calls on registered RawGpuBuffers take the zero-copy algorithms, exact;
    after deregister_buffer the copying ones again."""
    r, n = g.rank, g.nranks
    count = 300_000  # float32 per rank: 1.2 MB, above the 256 KiB from which zero_copy runs
    send_buf = mscclpp.RawGpuBuffer(n * count * 4)
    recv_buf = mscclpp.RawGpuBuffer(n * count * 4)
    send = np.frombuffer(send_buf, dtype=np.float32)
    recv = np.frombuffer(recv_buf, dtype=np.float32)

    def last() -> str:
        return str(g.recent_calls()[-1]["algorithm"])

    def gather(what: str) -> str:
        send[:count] = data(r, count, np.float32)
        recv[:] = 99
        g.all_gather(send[:count], recv)
        check(f"all_gather {what}", recv.copy(), np.concatenate([data(p, count, np.float32) for p in range(n)]))
        return last()

    assert gather("before registering") != "zero_copy", last()
    g.register_buffer(send_buf)
    g.register_buffer(recv_buf)
    assert gather("on registered buffers") == "zero_copy", last()
    # Reduce-scatter in place inside the receive buffer (registered whole at the first call).
    recv[:] = data(r, n * count, np.float32)
    g.reduce_scatter(recv)
    full = reduce([data(p, n * count, np.float32) for p in range(n)], "sum")
    check("reduce_scatter in place on a registered buffer", recv[r * count : (r + 1) * count].copy(), full[r * count : (r + 1) * count])
    assert last() == "zero_copy", last()
    # All-reduce of 2.4 MB (zero-copy above 1 MiB).
    send[:] = data(r, n * count, np.float32)
    g.all_reduce(send, recv)
    check("all_reduce on registered buffers", recv.copy(), reduce([data(p, n * count, np.float32) for p in range(n)], "sum"))
    assert last() == "rsag_zero_copy", last()
    g.deregister_buffer(send_buf)
    g.deregister_buffer(recv_buf)
    assert gather("after deregistering") != "zero_copy", last()
    g.barrier()


P2P_DTYPES = [np.float32, np.float16, np.int8, np.int64]
# Bytes up to 2.4 MiB: several of the host backend's 512 KiB chunks (GPU: 128 KiB).
P2P_COUNTS = [0, 1, 37, 65543, 600001]


def case_p2p_ring(g: mscclpp.CommGroup, *args: str) -> None:
    """Each rank sends to the next and receives from the previous, in one batch (``with
    g.group()``), every dtype and size; then the same through a P2pBatch object, and blocking
    single calls ordered so they cannot deadlock."""
    r, n = g.rank, g.nranks
    nxt, prv = (r + 1) % n, (r - 1) % n
    for dt in P2P_DTYPES:
        for count in P2P_COUNTS:
            y = np.full(count, 99, dtype=dt)
            with g.group():
                g.send(data(r, count, dt), nxt)
                g.recv(y, prv)
            check(f"ring {np.dtype(dt)} {count}", y, data(prv, count, dt))
    b = g.batch()
    y = np.zeros(1000, np.float32)
    b.recv(y, prv)
    b.send(data(r, 1000, np.float32), nxt)
    assert len(b) == 2
    b.run()
    assert len(b) == 0
    check("ring through P2pBatch", y, data(prv, 1000, np.float32))
    # Single calls: rank 0 sends first, the others receive first (a chain, no cycle).
    y = np.zeros(4099, np.int32)
    if r == 0:
        g.send(data(r, 4099, np.int32), nxt)
        g.recv(y, prv)
    else:
        g.recv(y, prv)
        g.send(data(r, 4099, np.int32), nxt)
    check("ring of single calls", y, data(prv, 4099, np.int32))


def case_p2p_pairwise(g: mscclpp.CommGroup, *args: str) -> None:
    """One batch with every peer (this rank included): an all-to-all of blocks, several
    messages per pair matched in call order, nested groups."""
    r, n = g.rank, g.nranks
    for count in [1, 3000, 300000]:
        send = np.concatenate([data(r * n + p, count, np.float32) for p in range(n)])
        recv = np.full(n * count, -1, np.float32)
        with g.group():
            for p in range(n):
                g.send(send[p * count : (p + 1) * count], p)
            with g.group():  # nested: still one batch
                for p in reversed(range(n)):
                    g.recv(recv[p * count : (p + 1) * count], p)
        want = np.concatenate([data(p * n + r, count, np.float32) for p in range(n)])
        check(f"pairwise all-to-all {count}", recv, want)
    # Two messages per pair and direction in one batch arrive in call order.
    firsts = [np.zeros(10, np.int64) for _ in range(n)]
    seconds = [np.zeros(20, np.int64) for _ in range(n)]
    with g.group():
        for p in range(n):
            if p != r:
                g.send(data(r, 10, np.int64), p)
                g.send(data(r + 100, 20, np.int64), p)
                g.recv(firsts[p], p)
                g.recv(seconds[p], p)
    for p in range(n):
        if p != r:
            check(f"first message from {p}", firsts[p], data(p, 10, np.int64))
            check(f"second message from {p}", seconds[p], data(p + 100, 20, np.int64))


def case_p2p_unequal(g: mscclpp.CommGroup, *args: str) -> None:
    """Every pair exchanges messages of different sizes in each direction (sizes made of the
    sender and receiver ranks), and an exception inside a group drops its operations."""
    r, n = g.rank, g.nranks

    def size(src: int, dst: int) -> int:
        return 1 + src * 70001 + dst * 1237

    got = {p: np.zeros(size(p, r), np.float16) for p in range(n) if p != r}
    with g.group():
        for p in range(n):
            if p != r:
                g.send(data(r + 7 * p, size(r, p), np.float16), p)
                g.recv(got[p], p)
    for p, y in got.items():
        check(f"unequal sizes from {p}", y, data(p + 7 * r, size(p, r), np.float16))
    try:
        with g.group():
            g.send(np.zeros(5, np.float32), (r + 1) % n)
            raise KeyError("dropped")
    except KeyError:
        pass
    # Nothing of the dropped group went out: the next exchange sees the right data.
    y = np.zeros(8, np.float32)
    with g.group():
        g.send(data(r, 8, np.float32), (r + 1) % n)
        g.recv(y, (r - 1) % n)
    check("exchange after a dropped group", y, data((r - 1) % n, 8, np.float32))


def case_p2p_mismatch(g: mscclpp.CommGroup, *args: str) -> None:
    """A receive larger than the matching send fails on the receiver, naming both sizes; the
    sender, never acknowledged, fails by the group's p2p_timeout (5 s here)."""
    r = g.rank
    if r == 0:
        t0 = time.monotonic()
        try:
            g.send(np.zeros(10, np.float32), 1)
        except mscclpp.MscclppError as e:
            print("sender saw:", e)
            assert time.monotonic() - t0 < 60, "the sender waited past its timeout"
        else:
            raise AssertionError("a send whose receive refused it succeeded")
    elif r == 1:
        try:
            g.recv(np.zeros(12, np.float32), 0)
        except mscclpp.MscclppError as e:
            msg = str(e)
            assert "40" in msg and "48" in msg, msg
            print("receiver refused:", msg)
        else:
            raise AssertionError("a 48-byte receive of a 40-byte send succeeded")


class DlpackOnly:
    """A producer that only speaks DLPack, delegated to an array or tensor (no buffer
    protocol, no __array__, no __cuda_array_interface__); test_dlpack.py and gpu_worker.py
    use it too."""

    def __init__(self, a: Any) -> None:
        self.a = a

    def __dlpack__(self, **kw: Any) -> Any:
        return self.a.__dlpack__(**kw)

    def __dlpack_device__(self) -> Any:
        return self.a.__dlpack_device__()


def case_p2p_dlpack(g: mscclpp.CommGroup, *args: str) -> None:
    """A ring of send/recv and an all-reduce whose buffers are DLPack producers and
    RawGpuBuffer exports."""
    r, n = g.rank, g.nranks
    y = np.zeros(5000, np.float32)
    with g.group():
        g.send(DlpackOnly(data(r, 5000, np.float32)), (r + 1) % n)
        g.recv(DlpackOnly(y), (r - 1) % n)
    check("ring of DLPack producers", y, data((r - 1) % n, 5000, np.float32))
    buf = mscclpp.RawGpuBuffer(4000)
    view = np.from_dlpack(buf).view(np.int32)
    view[:] = data(r, 1000, np.int32)
    g.all_reduce(buf, dtype="int32")
    check("all_reduce on a RawGpuBuffer seen through DLPack", view.copy(), reduce([data(p, 1000, np.int32) for p in range(n)], "sum"))


def case_channels(g: mscclpp.CommGroup, *args: str) -> None:
    """The low-level API between every pair: register and exchange memory, connect (CudaIpc),
    build semaphores; then a MemoryChannel put+signal+wait, a PortChannel put through the
    proxy, and a Connection write with a Host2HostSemaphore, each into its own region of
    every peer's buffer, checked exactly; the device handles' bytes checked field by field
    against the C headers' layout."""
    import struct

    r, n = g.rank, g.nranks
    comm = g.communicator
    block = 4096
    src_buf = mscclpp.RawGpuBuffer(block)
    np.from_dlpack(src_buf).view(np.int32)[:] = data(r, block // 4, np.int32)
    dst_buf = mscclpp.RawGpuBuffer(3 * n * block)
    src = comm.register_memory(src_buf)
    dst = comm.register_memory(dst_buf, ["cudaipc"])
    assert src.size == block and src.data == src_buf.ptr and src.transports == ["CudaIpc"], src
    peers = [p for p in range(n) if p != r]
    conn_f = {p: comm.connect(p, 1) for p in peers}
    for p in peers:
        comm.send_memory(dst, p, 2)
    mem_f = {p: comm.recv_memory(p, 2) for p in peers}
    conns = {p: f.get() for p, f in conn_f.items()}
    assert all(conn_f[p].ready() and conn_f[p].get() is conns[p] for p in peers)
    remote = {p: f.get() for p, f in mem_f.items()}
    for p in peers:
        assert conns[p].transport == "CudaIpc" and conns[p].remote_rank == p, conns[p]
        assert remote[p].size == 3 * n * block and remote[p].data != 0, remote[p]
    sem_f = {(p, k): comm.build_semaphore(conns[p], p, 3 + k) for p in peers for k in range(3)}
    sems = {key: f.get() for key, f in sem_f.items()}

    # 1. Memory channels: put into region 0 of the peer's buffer, signal, wait for the peer's.
    mem_ch = {p: mscclpp.MemoryChannel(sems[p, 0], remote[p], src) for p in peers}
    for p in peers:
        h = mem_ch[p].device_handle()
        assert len(h) == 48, len(h)
        inbound, remote_inbound, expected, dst_ptr, src_ptr, packets = struct.unpack("<6Q", h)
        assert dst_ptr == remote[p].data and src_ptr == src_buf.ptr and packets == 0, h
        assert inbound and remote_inbound and expected and len({inbound, remote_inbound, expected}) == 3
        d2d = mscclpp.MemoryDevice2DeviceSemaphore(sems[p, 0]).device_handle()
        assert len(d2d) == 24 and struct.unpack("<3Q", d2d)[:2] == (inbound, remote_inbound)
        assert mscclpp.BaseMemoryChannel(sems[p, 0]).device_handle()[:16] == h[:16]
        mem_ch[p].put(r * block, 0, block)
        mem_ch[p].signal()
    for p in peers:
        mem_ch[p].wait(60)

    # 2. Port channels through a proxy: region 1.
    proxy = mscclpp.ProxyService()
    src_id = proxy.add_memory(src)
    port_ch = {}
    for p in peers:
        sid = proxy.add_semaphore(sems[p, 1])
        dst_id = proxy.add_memory(remote[p])
        port_ch[p] = proxy.port_channel(sid, dst_id, src_id)
        h = port_ch[p].device_handle()
        assert len(h) == 72, len(h)
        sem_id, pad, in_tok, exp_tok, triggers, head, tail, tail_cache, fifo_size, fpad, d_id, s_id = struct.unpack("<II2Q4QIIII", h)
        assert (sem_id, d_id, s_id) == (sid, dst_id, src_id) and port_ch[p].semaphore_id == sid, h
        assert in_tok and exp_tok and triggers and head and tail and fifo_size > 0, h
        base = proxy.base_port_channel(sid).device_handle()
        assert len(base) == 64 and base == h[:64]
        h2d = mscclpp.Host2DeviceSemaphore(sems[p, 1]).device_handle()
        assert len(h2d) == 16 and struct.unpack("<Q", h2d[:8])[0] == in_tok
    proxy.start_proxy()
    for p in peers:
        port_ch[p].put_with_signal(n * block + r * block, 0, block)
    for p in peers:
        port_ch[p].flush(60)
    for p in peers:
        port_ch[p].wait(60)

    # 3. Connection.write and a host-to-host semaphore: region 2.
    h2h = {p: mscclpp.Host2HostSemaphore(sems[p, 2]) for p in peers}
    for p in peers:
        conns[p].write(remote[p], 2 * n * block + r * block, src, 0, block)
        h2h[p].signal()
    for p in peers:
        h2h[p].wait(60)

    got = np.from_dlpack(dst_buf).view(np.int32).reshape(3, n, block // 4)
    for k, what in enumerate(["MemoryChannel.put", "PortChannel.put_with_signal", "Connection.write"]):
        for p in peers:
            check(f"{what} from rank {p}", got[k, p].copy(), data(p, block // 4, np.int32))
    # A put outside the peer's buffer is refused before any copy.
    try:
        mem_ch[peers[0]].put(3 * n * block - 8, 0, 16)
    except mscclpp.MscclppError as e:
        assert "expected ranges inside" in str(e), e
    else:
        raise AssertionError("a put past the end of dst ran")
    g.barrier()
    proxy.stop_proxy()


def main() -> None:
    case, rank, nranks, addr, *rest = sys.argv[1:]
    r, n = int(rank), int(nranks)
    fn = globals()[f"case_{case}"]
    if case == "uniqueid":
        fn(r, n, addr, *rest)
    else:
        g = group(r, n, addr, **({"p2p_timeout": 5.0} if case == "p2p_mismatch" else {}))
        fn(g, *rest)
        if case != "p2p_mismatch":
            g.barrier()
    print(f"rank {r}: {case} passed")


if __name__ == "__main__":
    main()
