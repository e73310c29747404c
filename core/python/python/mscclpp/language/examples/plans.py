"""The execution plans shipped with mscclpp-rs (core/plans/*.json), as DSL programs.

Every plan is single-node, for 2, 4 or 8 ranks (named in the file name). ``python -m
mscclpp.language.examples.plans DIR`` writes them; ``--check DIR`` tells whether DIR's files are
what the programs produce (CI runs it on core/plans).

Families (r = this rank, p = a peer, pos(q, r) = index of q among r's peers; one thread block
per peer unless said; every LL plan declares max_message_size 1 MiB, see LL_MAX):
  allreduce_simple   in place; start sync, barrier, rre of chunk r over all peers (split over
                     the thread blocks), barrier, signal/wait, get each peer's chunk, end sync.
  allreduce_oop      out of place; rres (reads peers' inputs, writes everyone's outputs).
  allreduce_put      in place; put chunks into peers' scratch, re+put or res of chunk r.
  allreduce_ll       LL, double scratch; ppkt, respkt (split), upkt.
  allreduce_ll_fwd   LL, double scratch; ppkt, recspkt / repkt+cpkt+rppkt / recpkt+rppkt, upkt.
  allreduce_allpair_ll
                     LL, double scratch, out of place (the native allpair_packet's
                     one hop, and its range: up to 16 KiB): ppkt of the whole input to every
                     peer, repkt of the input and every peer's packets into the output (split).
  allgather_simple   in place; rlxsignal/rlxwait start sync, put, signal/wait.
  allgather_oop      out of place; copy, put, signal/wait.
  allgather_ll       LL, double scratch; ppkt, upkt.
  allgather_ll_fwd   LL, double scratch, one thread block; cpkt, rppkt, upkt.
  allgather_port     in place; port channels: signal/wait, pws+flush or pwsf, device semaphores.
  allgather_pipeline in place; pipeline of puts (unit 1 KiB), barrier.
  allreduce_nvls     in place; one switch channel over every rank's input (NVLS): start sync,
                     glres of chunk r (load-reduce through the switch, store to every rank),
                     nop, end sync.
  allreduce_nvls_ls  as allreduce_nvls with glre of chunk r into the local input, nop, then
                     gstore of it through the switch.
"""

from __future__ import annotations

import os
import sys
from typing import Callable

from mscclpp.language import (
    AllGather,
    AllReduce,
    BaseBuffer,
    Buffer,
    BufferType,
    CollectiveProgram,
    LoopIterationContext,
    MemoryChannel,
    PortChannel,
    Rank,
    Semaphore,
    SwitchChannel,
    SyncType,
    ThreadBlockGroup,
)

MAX = 2**64 - 1


def peers(r: int, n: int) -> list[int]:
    return [q for q in range(n) if q != r]


def pos(q: int, r: int) -> int:
    """Index of q among r's peers."""
    return q if q < r else q - 1


def sync(ch: MemoryChannel | PortChannel, tb: int, relaxed: bool = False) -> None:
    """Signal the peer, wait for its signal, then __syncthreads()."""
    ch.signal(tb, SyncType.none, relaxed=relaxed)
    ch.wait(tb, SyncType.after, relaxed=relaxed)


def blocks(r: int, n: int) -> tuple[Rank, list[int], list[int], ThreadBlockGroup, dict[int, MemoryChannel]]:
    """Rank r, its peers, its thread blocks (block j serves peer j), their group and a memory
    channel to every peer."""
    ps, tbs = peers(r, n), list(range(n - 1))
    return Rank(r), ps, tbs, ThreadBlockGroup(tbs), {p: MemoryChannel(p, r) for p in ps}


def sync_peers(ch: dict[int, MemoryChannel], ps: list[int]) -> None:
    """Block j syncs with peer j."""
    for j, p in enumerate(ps):
        sync(ch[p], j)


def send_result(r: int, bufs: list[BaseBuffer], ch: dict[int, MemoryChannel], tbs: list[int]) -> None:
    """Chunk r of rank r's ``bufs`` into every peer's (split over the blocks; fused with a
    reduce just before it), then the end: barrier, every block syncs with its peer."""
    ps = list(ch)
    for q in ps:
        ch[q].put(bufs[q][r], bufs[r][r], tb_group=ThreadBlockGroup(tbs))
    Rank(r).barrier(tbs)
    sync_peers(ch, ps)


LL_MAX = 1 << 20
"""Largest message of an LL plan: an LL packet carries half its bytes, so an LL plan moves about
3x the bytes of a Simple one (packets written, read back, unpacked) and from a few MiB on is
2-4x slower than the Simple algorithms (docs/perf.md, issue 31); the native all-reduce
selector likewise takes its packet algorithms only up to 1 MiB."""


def program(name: str, coll: object, n: int, ll: bool = False, **kw: object) -> CollectiveProgram:
    if ll:
        kw.setdefault("max_message_size", LL_MAX)
    return CollectiveProgram(
        name,
        coll,
        n,
        protocol="LL" if ll else "Simple",
        num_threads_per_block=512 if ll else 1024,
        use_double_scratch_buffer=ll,
        auto_sync=False,
        **kw,  # type: ignore[arg-type]
    )


def inputs(n: int) -> list[BaseBuffer]:
    return [Rank(r).get_input_buffer() for r in range(n)]


def outputs(n: int) -> list[BaseBuffer]:
    return [Rank(r).get_output_buffer() for r in range(n)]


def allreduce_simple(n: int) -> CollectiveProgram:
    with program(f"allreduce_simple_n{n}", AllReduce(n, 1, True), n) as prog:
        inp = inputs(n)
        for r in range(n):
            rank, ps, tbs, group, ch = blocks(r, n)
            sync_peers(ch, ps)
            rank.barrier(tbs)
            for q in ps:
                ch[q].reduce(inp[r][r], [inp[q][r]], tb_group=group)
            rank.barrier(tbs)
            for j, p in enumerate(ps):
                sync(ch[p], j)
                ch[p].get(inp[r][p], inp[p][p], tb=j)
                # The peer reads our chunk p the same way: neither may return (and let its
                # user overwrite the buffer) before the other finished reading.
                rank.nop(j)
                sync(ch[p], j)
    return prog


def allreduce_oop(n: int) -> CollectiveProgram:
    with program(f"allreduce_oop_n{n}", AllReduce(n, 1, False), n) as prog:
        inp, out = inputs(n), outputs(n)
        for r in range(n):
            rank, ps, tbs, group, ch = blocks(r, n)
            sync_peers(ch, ps)
            rank.barrier(tbs)
            for q in ps:  # fused: one rres per block
                ch[q].reduce(inp[r][r], [inp[q][r]], tb_group=group, local_dst_chunk=out[r][r])
            send_result(r, out, ch, tbs)
    return prog


def allreduce_put(n: int) -> CollectiveProgram:
    with program(f"allreduce_put_n{n}", AllReduce(n, 1, True), n) as prog:
        inp = inputs(n)
        scratch = [Buffer(r, n - 1) for r in range(n)]
        for r in range(n):
            rank, ps, tbs, group, ch = blocks(r, n)
            for j, p in enumerate(ps):
                sync(ch[p], j)
                ch[p].put(scratch[p][pos(r, p)], inp[r][p], tb=j)
                rank.nop(j)
                sync(ch[p], j)
            rank.barrier(tbs)
            rank.reduce(inp[r][r], [scratch[r][k] for k in range(n - 1)], tb_group=group)
            if r % 2:  # reduce, then put the result (unfused); even ranks: res
                for j in tbs:
                    rank.nop(j)
            send_result(r, inp, ch, tbs)
    return prog


def allreduce_ll(n: int) -> CollectiveProgram:
    with program(f"allreduce_ll_n{n}", AllReduce(n, 1, True), n, ll=True) as prog:
        inp = inputs(n)
        scratch = [Buffer(r, 2 * (n - 1)) for r in range(n)]
        for r in range(n):
            rank, ps, tbs, group, ch = blocks(r, n)
            for j, p in enumerate(ps):
                ch[p].put_packets(scratch[p][pos(r, p)], inp[r][p], tb=j)
            rank.reduce(inp[r][r], [scratch[r][k] for k in range(n - 1)], tb_group=group, packet=True)
            for q in ps:  # fused with the reduce: respkt
                ch[q].put_packets(scratch[q][n - 1 + pos(r, q)], inp[r][r], tb_group=group)
            for j, p in enumerate(ps):
                rank.unpack_packets(inp[r][p], scratch[r][n - 1 + j], tb=j)
    return prog


def allreduce_ll_fwd(n: int) -> CollectiveProgram:
    """Like allreduce_ll, but the result travels by forwarding packets: rank r % 3 == 0
    reduce-copy-sends, 1 reduces then copies to packets then forwards, 2 reduce-copies then
    forwards."""
    c = 2 * (n - 1)  # scratch slot of this rank's own result packets
    with program(f"allreduce_ll_fwd_n{n}", AllReduce(n, 1, True), n, ll=True) as prog:
        inp = inputs(n)
        scratch = [Buffer(r, c + 1) for r in range(n)]
        for r in range(n):
            rank, ps, tbs, group, ch = blocks(r, n)
            for j, p in enumerate(ps):
                ch[p].put_packets(scratch[p][pos(r, p)], inp[r][p], tb=j)
            rank.reduce(inp[r][r], [scratch[r][k] for k in range(n - 1)], tb_group=group, packet=True)
            if r % 3 == 1:
                for j in tbs:
                    rank.nop(j)
            rank.copy_packets(scratch[r][c], inp[r][r], tb_group=group)
            for i, q in enumerate(ps):
                # r % 3 == 2 keeps the forward apart from the reduce-copy (recpkt, rppkt).
                ch[q].read_put_packets(scratch[q][n - 1 + pos(r, q)], scratch[r][c], tb_group=group,
                                       fuse=not (r % 3 == 2 and i == 0))
            for j, p in enumerate(ps):
                rank.unpack_packets(inp[r][p], scratch[r][n - 1 + j], tb=j)
    return prog


ALLPAIR_MAX = 16 << 10
"""Largest message of allreduce_allpair_ll: the native selector's range of allpair_packet, the
algorithm the plan mirrors. Above it the one hop sends n - 1 copies of the whole input (the
two-hop LL plans send about two): at 1 MiB the plan took 2.6x the native time at 4 ranks
sharing an H100 (docs/perf.md, round 16), and a plan folder holding both should not pick it."""


def allreduce_allpair_ll(n: int) -> CollectiveProgram:
    """One hop, as the native allpair_packet (its selector's choice up to 16 KiB, ALLPAIR_MAX):
    block j puts the whole input as packets into peer j's scratch (slot pos(r, p)), then all
    blocks reduce the input with every peer's packets into the output. Each rank sends n - 1
    copies of its input."""
    with program(f"allreduce_allpair_ll_n{n}", AllReduce(n, 1, False), n, ll=True,
                 max_message_size=ALLPAIR_MAX) as prog:
        inp, out = inputs(n), outputs(n)
        scratch = [Buffer(r, n * (n - 1)) for r in range(n)]
        for r in range(n):
            rank, ps, tbs, group, ch = blocks(r, n)
            for j, p in enumerate(ps):
                k = pos(r, p)
                ch[p].put_packets(scratch[p][k * n:(k + 1) * n], inp[r][0:n], tb=j)
            rank.reduce(inp[r][0:n], [scratch[r][k * n:(k + 1) * n] for k in range(n - 1)], tb_group=group,
                        dst_chunk=out[r][0:n], packet=True)
    return prog


def allreduce_nvls_family(n: int, name: str, load_store: bool) -> CollectiveProgram:
    with program(f"{name}_n{n}", AllReduce(n, 1, True), n) as prog:
        inp = inputs(n)
        switch = SwitchChannel(list(range(n)), BufferType.input)
        for r in range(n):
            rank, ps = Rank(r), peers(r, n)
            ch = {p: MemoryChannel(p, r) for p in ps}
            # Every rank's input is ready before anyone reduces through the switch (the
            # signals, then the waits, fuse into one op each).
            for p in ps:
                ch[p].signal(0, SyncType.none)
            for p in ps:
                ch[p].wait(0, SyncType.after)
            switch.reduce(r, r, 1, inp[r][r], tb=0)
            if load_store:
                rank.nop(0)
            switch.broadcast(r, inp[r][r], r, 1, tb=0)  # without the nop: fused into glres
            # Every rank's stores landed before anyone returns.
            rank.nop(0)
            for p in ps:
                ch[p].signal(0, SyncType.none)
            for p in ps:
                ch[p].wait(0, SyncType.after)
    return prog


def allreduce_nvls(n: int) -> CollectiveProgram:
    return allreduce_nvls_family(n, "allreduce_nvls", False)


def allreduce_nvls_ls(n: int) -> CollectiveProgram:
    return allreduce_nvls_family(n, "allreduce_nvls_ls", True)


def allgather_simple(n: int) -> CollectiveProgram:
    with program(f"allgather_simple_n{n}", AllGather(n, 1, True), n) as prog:
        out = outputs(n)
        for r in range(n):
            for j, p in enumerate(peers(r, n)):
                ch = MemoryChannel(p, r)
                sync(ch, j, relaxed=True)
                ch.put(out[p][r], out[r][r], tb=j)
                ch.signal(j, SyncType.before)
                ch.wait(j, SyncType.after)
    return prog


def allgather_oop(n: int) -> CollectiveProgram:
    with program(f"allgather_oop_n{n}", AllGather(n, 1, False), n) as prog:
        inp, out = inputs(n), outputs(n)
        for r in range(n):
            rank, tbs = Rank(r), list(range(n - 1))
            rank.copy(out[r][r], inp[r][0], tb=0)
            rank.barrier(tbs)
            for j, p in enumerate(peers(r, n)):
                ch = MemoryChannel(p, r)
                sync(ch, j)
                ch.put(out[p][r], inp[r][0], tb=j)
                ch.signal(j, SyncType.before)
                ch.wait(j, SyncType.after)
    return prog


def allgather_ll(n: int) -> CollectiveProgram:
    with program(f"allgather_ll_n{n}", AllGather(n, 1, True), n, ll=True) as prog:
        out = outputs(n)
        scratch = [Buffer(r, n - 1) for r in range(n)]
        for r in range(n):
            for j, p in enumerate(peers(r, n)):
                MemoryChannel(p, r).put_packets(scratch[p][pos(r, p)], out[r][r], tb=j)
                Rank(r).unpack_packets(out[r][p], scratch[r][j], tb=j)
    return prog


def allgather_ll_fwd(n: int) -> CollectiveProgram:
    with program(f"allgather_ll_fwd_n{n}", AllGather(n, 1, True), n, ll=True) as prog:
        out = outputs(n)
        scratch = [Buffer(r, n) for r in range(n)]
        for r in range(n):
            rank, ps = Rank(r), peers(r, n)
            rank.copy_packets(scratch[r][n - 1], out[r][r], tb=0)
            rank.nop(0)
            for p in ps:  # one rppkt to every peer
                MemoryChannel(p, r).read_put_packets(scratch[p][pos(r, p)], scratch[r][n - 1], tb=0)
            for j, p in enumerate(ps):
                rank.unpack_packets(out[r][p], scratch[r][j], tb=0)
    return prog


def allgather_port(n: int) -> CollectiveProgram:
    with program(f"allgather_port_n{n}", AllGather(n, 1, True), n) as prog:
        out = outputs(n)
        for r in range(n):
            sem = Semaphore(r, 0)
            for j, p in enumerate(peers(r, n)):
                ch = PortChannel(p, r)
                sync(ch, j)
                if j % 2 == 0:
                    ch.put_with_signal(out[p][r], out[r][r], tb=j)
                    ch.flush(j, SyncType.none, fuse=False)
                else:
                    ch.put_with_signal_and_flush(out[p][r], out[r][r], tb=j)
                ch.wait(j, SyncType.after)
                # Thread blocks 1.. report to block 0 through the device semaphore.
                if j > 0:
                    sem.release(j, SyncType.none)
                    sem.acquire(0, SyncType.none)
    return prog


def allgather_pipeline(n: int) -> CollectiveProgram:
    with program(f"allgather_pipeline_n{n}", AllGather(n, 1, True), n) as prog:
        out = outputs(n)
        for r in range(n):
            rank, tbs = Rank(r), list(range(n - 1))
            chans = {p: MemoryChannel(p, r) for p in peers(r, n)}
            for j, p in enumerate(peers(r, n)):
                sync(chans[p], j)
            rank.barrier(tbs)
            for j, p in enumerate(peers(r, n)):
                with LoopIterationContext(unit=1024, num_chunks=1):
                    chans[p].put(out[p][r], out[r][r], tb=j)
                rank.nop(j)
                sync(chans[p], j)
    return prog


FAMILIES: list[Callable[[int], CollectiveProgram]] = [
    allreduce_simple,
    allreduce_oop,
    allreduce_put,
    allreduce_ll,
    allreduce_ll_fwd,
    allreduce_allpair_ll,
    allgather_simple,
    allgather_oop,
    allgather_ll,
    allgather_ll_fwd,
    allgather_port,
    allgather_pipeline,
    allreduce_nvls,
    allreduce_nvls_ls,
]

SIZES = (2, 4, 8)


def all_plans() -> dict[str, str]:
    """File name -> plan text of every shipped plan."""
    out = {}
    for f in FAMILIES:
        for n in SIZES:
            prog = f(n)
            out[prog.name + ".json"] = prog.json()
    return out


def bundled() -> list[str]:
    """File names ``python -m mscclpp install-plans`` installs: every shipped plan but the NVLS
    ones (the plan lookup never takes plans with switch channels)."""
    return [f"{f.__name__}_n{n}.json" for f in FAMILIES if f not in (allreduce_nvls, allreduce_nvls_ls) for n in SIZES]


def write(directory: str) -> list[str]:
    """Writes every plan into ``directory``; returns the paths."""
    os.makedirs(directory, exist_ok=True)
    paths = []
    for name, text in all_plans().items():
        path = os.path.join(directory, name)
        with open(path, "w") as f:
            f.write(text)
        paths.append(path)
    return paths


def stale(directory: str) -> list[str]:
    """The plans whose file in ``directory`` is missing or differs from the program's output."""
    bad = []
    for name, text in all_plans().items():
        path = os.path.join(directory, name)
        try:
            with open(path) as f:
                same = f.read() == text
        except OSError:
            same = False
        if not same:
            bad.append(path)
    return bad


def main(argv: list[str]) -> int:
    check = "--check" in argv
    args = [a for a in argv if a != "--check"]
    if len(args) != 1:
        print("usage: python -m mscclpp.language.examples.plans [--check] DIR", file=sys.stderr)
        return 2
    if check:
        bad = stale(args[0])
        for p in bad:
            print(f"stale: {p} (regenerate: python3 core/plans/plans.py)")
        return 1 if bad else 0
    for p in write(args[0]):
        print(p)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
