"""PyTorch check of libmscclpp_nccl's point-to-point on one GPU shared by every rank (MPS).

Run as WORLD_SIZE processes (2 or 4; RANK from RANK or OMPI_COMM_WORLD_RANK, MASTER_ADDR and
MASTER_PORT set, every rank on cuda:0) with LD_PRELOAD of our .so; see gpu_p2p_run.sh.
torch.distributed with the NCCL backend runs, each result compared exactly with what NCCL
must produce:
  batch_isend_irecv ring and pairwise, blocking send/recv pairs, all_to_all_single with equal
  and unequal (zero included) splits, gather, scatter, all_reduce on new_group subgroups, and
  an all_reduce and an all_to_all_single captured in CUDA graphs, each replayed 5 times with
  changing data.
Each check prints "PASS <name>" or "FAIL <name>: <why>"; a check that raises ends the run
(a failed collective leaves the others waiting). The last line is
"TORCH_P2P rank=<r> world=<w> passed=<n> failed=<m>"; the exit code is 1 on any failure.
TORCH_P2P_EXPECT_MSCCLPP=1 also checks that libmscclpp_nccl is loaded in the process.
"""
import os
import sys
import traceback

from gpu_env import setup  # noqa: E402  (this folder)

rank, world = setup(29571)

import datetime  # noqa: E402
import torch  # noqa: E402  (after the variables above are set)
import torch.distributed as dist  # noqa: E402

DEV = torch.device("cuda:0")
passed = 0
failed = 0


def result(name, ok, why=""):
    global passed, failed
    if ok:
        passed += 1
        print(f"PASS {name}", flush=True)
    else:
        failed += 1
        print(f"FAIL {name}: {why}", flush=True)


def check(name, got, want):
    """Exact comparison (all values are small integers, exact in every type used)."""
    torch.cuda.synchronize()
    got, want = got.float().cpu(), want.float().cpu()
    if got.shape != want.shape:
        result(name, False, f"shape {tuple(got.shape)}, expected {tuple(want.shape)}")
        return
    bad = (got != want).nonzero()
    if bad.numel():
        i = bad[0].tolist()
        result(name, False, f"{bad.shape[0]} wrong elements, first at {i}: {got[tuple(i)]} expected {want[tuple(i)]}")
    else:
        result(name, True)


def val(src, dst, n, dtype=torch.float32):
    """What rank `src` sends to rank `dst`: n small integers, distinct per pair."""
    return ((torch.arange(n, device=DEV) + src * 7 + dst * 3) % 100).to(dtype)


def p2p_exchange(name, sends, recvs, n, dtype):
    """batch_isend_irecv: an isend of val(rank, p) to each p in `sends`, an irecv from each
    p in `recvs`; checks every received tensor."""
    out = {p: torch.full((n,), 127, device=DEV, dtype=dtype) for p in recvs}  # never a val()
    ops = [dist.P2POp(dist.irecv, out[p], p) for p in recvs]
    ops += [dist.P2POp(dist.isend, val(rank, p, n, dtype), p) for p in sends]
    for req in dist.batch_isend_irecv(ops):
        req.wait()
    for p in recvs:
        check(f"{name} {dtype} n={n} from rank {p}", out[p], val(p, rank, n, dtype))


def uneven(src, dst, k):
    """Elements rank src sends rank dst in the unequal all-to-all: 0 to 3 blocks of k."""
    return ((src * 3 + dst * 5) % 4) * k


def run_checks():
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    for n, dtype in ((1, torch.int8), ((1 << 20) + 3, torch.int8), (4099, torch.float16), (1 << 20, torch.float32)):
        p2p_exchange("batch_isend_irecv ring", [nxt], [prv], n, dtype)
    partner = rank ^ 1
    for n, dtype in ((1, torch.uint8), (65537, torch.bfloat16), ((1 << 22) + 1, torch.float32)):
        p2p_exchange("batch_isend_irecv pairwise", [partner], [partner], n, dtype)
    others = [p for p in range(world) if p != rank]
    p2p_exchange("batch_isend_irecv every peer", others, others, 12345, torch.float32)

    # Blocking send/recv pairs (0,1), (2,3): the even rank sends first.
    for n in (1000, (1 << 21) + 5):
        mine = val(rank, partner, n)
        got = torch.full((n,), -1.0, device=DEV)
        if rank % 2 == 0:
            dist.send(mine, partner)
            dist.recv(got, partner)
        else:
            dist.recv(got, partner)
            dist.send(mine, partner)
        check(f"send/recv pair n={n}", got, val(partner, rank, n))

    # all_to_all_single, equal splits: block j of rank i's input lands at block i of rank j's output.
    for n, dtype in ((1, torch.float32), (1000, torch.bfloat16), (1 << 18, torch.float32)):
        inp = torch.cat([val(rank, j, n, dtype) for j in range(world)])
        out = torch.full((world * n,), 127, device=DEV, dtype=dtype)
        dist.all_to_all_single(out, inp)
        check(f"all_to_all_single equal {dtype} n={n}", out, torch.cat([val(i, rank, n, dtype) for i in range(world)]))

    # all_to_all_single, unequal splits (some zero, as PyTorch's alltoallv issues them).
    for k in (1, 1000):
        in_splits = [uneven(rank, j, k) for j in range(world)]
        out_splits = [uneven(i, rank, k) for i in range(world)]
        inp = torch.cat([val(rank, j, s) for j, s in enumerate(in_splits)])
        out = torch.full((sum(out_splits),), -1.0, device=DEV)
        dist.all_to_all_single(out, inp, out_splits, in_splits)
        check(f"all_to_all_single unequal k={k} splits={in_splits}", out,
              torch.cat([val(i, rank, s) for i, s in enumerate(out_splits)]))

    # gather and scatter to/from every root.
    for root in range(world):
        n = 3000 + root
        mine = val(rank, root, n)
        bufs = [torch.full((n,), -1.0, device=DEV) for _ in range(world)] if rank == root else None
        dist.gather(mine, bufs, dst=root)
        if rank == root:
            for i in range(world):
                check(f"gather root={root} block {i}", bufs[i], val(i, root, n))
        parts = [val(root, j, n) for j in range(world)] if rank == root else None
        got = torch.full((n,), -1.0, device=DEV)
        dist.scatter(got, parts, src=root)
        check(f"scatter root={root}", got, val(root, rank, n))

    # new_group all-reduce: the whole world in a new communicator, and groups of the ranks of
    # one parity (every rank creates every group, in the same order).
    everyone = dist.new_group(list(range(world)))
    t = val(rank, 0, 4096)
    dist.all_reduce(t, group=everyone)
    check("new_group (all ranks) all_reduce", t, sum(val(r, 0, 4096) for r in range(world)))
    if world >= 4:
        parity = [dist.new_group([r for r in range(world) if r % 2 == p]) for p in (0, 1)]
        mates = [r for r in range(world) if r % 2 == rank % 2]
        t = val(rank, 1, 5000)
        dist.all_reduce(t, group=parity[rank % 2])
        check(f"new_group {mates} all_reduce", t, sum(val(r, 1, 5000) for r in mates))

    # A CUDA graph that captured one all_reduce, replayed 5 times with new data.
    n = 1 << 16
    static = torch.zeros(n, device=DEV)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            dist.all_reduce(static)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        dist.all_reduce(static)
    base = torch.arange(n, device=DEV, dtype=torch.float32) % 97
    for it in range(5):
        static.copy_(base * (it + 1) + rank)
        graph.replay()
        check(f"CUDA graph all_reduce replay {it}", static, base * (it + 1) * world + sum(range(world)))

    # A CUDA graph that captured an all_to_all_single of 1 MiB blocks (ncclAlltoAll: core's
    # direct path registers the output at capture and the ranks write straight into each
    # other's), replayed 5 times with new data.
    n = 1 << 18
    a2a_in = torch.zeros(world * n, device=DEV)
    a2a_out = torch.full((world * n,), -1.0, device=DEV)
    with torch.cuda.stream(side):
        for _ in range(3):
            dist.all_to_all_single(a2a_out, a2a_in)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        dist.all_to_all_single(a2a_out, a2a_in)
    for it in range(5):
        a2a_in.copy_(torch.cat([val(rank, j, n) * (it + 1) for j in range(world)]))
        a2a_out.fill_(-1.0)
        graph.replay()
        check(f"CUDA graph all_to_all_single replay {it}", a2a_out,
              torch.cat([val(i, rank, n) * (it + 1) for i in range(world)]))


def main():
    torch.cuda.set_device(DEV)
    if os.environ.get("TORCH_P2P_EXPECT_MSCCLPP") == "1":
        with open("/proc/self/maps") as f:
            loaded = "libmscclpp_nccl" in f.read()
        result("libmscclpp_nccl is loaded (LD_PRELOAD)", loaded, "not in /proc/self/maps")
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=DEV,
                            timeout=datetime.timedelta(seconds=120))
    ok_end = True
    try:
        run_checks()
    except Exception as e:  # a failed call: report it and stop (the peers cannot go on)
        result("the run ended early", False, f"{type(e).__name__}: {e}")
        traceback.print_exc()
        ok_end = False
    print(f"TORCH_P2P rank={rank} world={world} passed={passed} failed={failed}", flush=True)
    if ok_end:
        torch.cuda.synchronize()
        dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(1 if failed else 0)


if __name__ == "__main__":
    main()
