"""One DSL program per collective, for any number of ranks (the tests run them at 2, 4 and 8
ranks on the host backend; docs/dsl-tutorial.md explains the all-reduce line by line).

    python -m mscclpp.language.examples.collectives allreduce 4 > allreduce_n4.json

prints the plan of ``allreduce``, ``allgather``, ``reducescatter`` or ``alltoall`` for N ranks
(``--instances K``, ``--ll`` for the LL all-reduce, ``--min/--max`` bytes).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from mscclpp.language import (
    AllGather,
    AllReduce,
    AllToAll,
    Buffer,
    CollectiveProgram,
    MemoryChannel,
    Rank,
    ReduceScatter,
    SyncType,
    ThreadBlockGroup,
)


def _peers(r: int, n: int) -> list[int]:
    return [q for q in range(n) if q != r]


def _explicit(kw: dict[str, Any]) -> dict[str, Any]:
    """These programs write their synchronisation out (``data_sync``, barriers): no
    ``auto_sync`` unless asked."""
    return {"auto_sync": False, **kw}


def _start_sync(n: int) -> dict[tuple[int, int], MemoryChannel]:
    """A memory channel from every rank to every peer, thread block j of rank r serving its
    j-th peer; every block signals its peer and waits for it (the peer entered the call)."""
    ch = {}
    for r in range(n):
        for j, p in enumerate(_peers(r, n)):
            ch[r, p] = MemoryChannel(p, r)
            ch[r, p].signal(j, SyncType.none)
            ch[r, p].wait(j, SyncType.after)
    return ch


def _end_sync(n: int, ch: dict[tuple[int, int], MemoryChannel]) -> None:
    """Every block tells its peer it is done with the peer's buffers, and waits to hear the
    same: no rank returns (and lets its caller reuse the buffers) while a peer still uses them."""
    for r in range(n):
        for j, p in enumerate(_peers(r, n)):
            ch[r, p].signal(j, SyncType.before)
            ch[r, p].wait(j, SyncType.after)


def allreduce(n: int, instances: int = 1, **kw: Any) -> CollectiveProgram:
    """In place, Simple: rank r read-reduces chunk r over every peer (its blocks split the
    chunk), then writes the sum into every peer's chunk r."""
    coll = AllReduce(n, 1, True)
    with CollectiveProgram(f"dsl_allreduce_n{n}", coll, n, instances=instances, **_explicit(kw)) as prog:
        ch = _start_sync(n)
        for r in range(n):
            rank, data = Rank(r), Rank(r).get_input_buffer()
            blocks = list(range(n - 1))
            rank.barrier(blocks)  # every peer entered the call (each block synced with one)
            group = ThreadBlockGroup(blocks)
            for q in _peers(r, n):  # fused into one read-reduce over the peers
                ch[r, q].reduce(data[r], [Rank(q).get_input_buffer()[r]], tb_group=group)
            for q in _peers(r, n):  # and with it: reduce, then put to every peer (rres)
                ch[r, q].put(Rank(q).get_input_buffer()[r], data[r], tb_group=group)
            rank.barrier(blocks)
        _end_sync(n, ch)
    return prog


def allreduce_ll(n: int, instances: int = 1, **kw: Any) -> CollectiveProgram:
    """In place, LL packets through double scratch: chunk p goes to peer p as packets; rank r
    reduces the packets of chunk r and sends the sum as packets to every peer, which unpacks it."""
    kw.setdefault("num_threads_per_block", 512)
    with CollectiveProgram(f"dsl_allreduce_ll_n{n}", AllReduce(n, 1, True), n, protocol="LL",
                           use_double_scratch_buffer=True, instances=instances, **_explicit(kw)) as prog:
        scratch = [Buffer(r, 2 * (n - 1)) for r in range(n)]
        for r in range(n):
            rank, data, peers = Rank(r), Rank(r).get_input_buffer(), _peers(r, n)
            ch = {p: MemoryChannel(p, r) for p in peers}
            slot = {p: peers.index(p) for p in peers}  # where p's packets land in my scratch
            for j, p in enumerate(peers):
                ch[p].put_packets(scratch[p][_peers(p, n).index(r)], data[p], tb=j)
            group = ThreadBlockGroup(range(n - 1))
            rank.reduce(data[r], [scratch[r][slot[p]] for p in peers], tb_group=group, packet=True)
            for p in peers:
                ch[p].put_packets(scratch[p][n - 1 + _peers(p, n).index(r)], data[r], tb_group=group)
            for j, p in enumerate(peers):
                rank.unpack_packets(data[p], scratch[r][n - 1 + slot[p]], tb=j)
    return prog


def allgather(n: int, instances: int = 1, **kw: Any) -> CollectiveProgram:
    """Out of place: rank r copies its input to output chunk r and puts it into every peer's
    output chunk r."""
    coll = AllGather(n, 1, False)
    with CollectiveProgram(f"dsl_allgather_n{n}", coll, n, instances=instances, **_explicit(kw)) as prog:
        ch = _start_sync(n)
        for r in range(n):
            rank, inp, out = Rank(r), Rank(r).get_input_buffer(), Rank(r).get_output_buffer()
            rank.copy(out[r], inp[0], tb=0)
            for j, p in enumerate(_peers(r, n)):
                ch[r, p].put(Rank(p).get_output_buffer()[r], inp[0], tb=j)
        _end_sync(n, ch)
    return prog


def reduce_scatter(n: int, instances: int = 1, **kw: Any) -> CollectiveProgram:
    """Out of place: rank r's output is its input chunk r read-reduced with every peer's."""
    with CollectiveProgram(f"dsl_reducescatter_n{n}", ReduceScatter(n, 1, False), n, instances=instances,
                           **_explicit(kw)) as prog:
        ch = _start_sync(n)
        for r in range(n):
            rank, inp, out = Rank(r), Rank(r).get_input_buffer(), Rank(r).get_output_buffer()
            blocks = list(range(n - 1))
            rank.barrier(blocks)
            group = ThreadBlockGroup(blocks)
            for q in _peers(r, n):
                ch[r, q].reduce(inp[r], [Rank(q).get_input_buffer()[r]], tb_group=group, local_dst_chunk=out[0])
            rank.barrier(blocks)
        _end_sync(n, ch)
    return prog


def alltoall(n: int, instances: int = 1, **kw: Any) -> CollectiveProgram:
    """Out of place: rank r's input chunk p goes to rank p's output chunk r."""
    coll = AllToAll(n, 1, False)
    with CollectiveProgram(f"dsl_alltoall_n{n}", coll, n, instances=instances, **_explicit(kw)) as prog:
        ch = _start_sync(n)
        for r in range(n):
            rank, inp, out = Rank(r), Rank(r).get_input_buffer(), Rank(r).get_output_buffer()
            rank.copy(out[r], inp[r], tb=0)
            for j, p in enumerate(_peers(r, n)):
                ch[r, p].put(Rank(p).get_output_buffer()[r], inp[p], tb=j)
        _end_sync(n, ch)
    return prog


PROGRAMS = {
    "allreduce": allreduce,
    "allreduce_ll": allreduce_ll,
    "allgather": allgather,
    "reducescatter": reduce_scatter,
    "alltoall": alltoall,
}


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m mscclpp.language.examples.collectives", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("collective", choices=sorted(PROGRAMS))
    ap.add_argument("nranks", type=int)
    ap.add_argument("--instances", type=int, default=1)
    ap.add_argument("--name", help="the plan's name (default dsl_<collective>_n<N>)")
    ap.add_argument("--min", type=int, default=0, help="smallest message (bytes) the plan is for")
    ap.add_argument("--max", type=int, default=2**64 - 1, help="largest message (bytes) the plan is for")
    a = ap.parse_args(argv)
    prog = PROGRAMS[a.collective](a.nranks, a.instances, min_message_size=a.min, max_message_size=a.max)
    if a.name:
        prog.name = a.name
    sys.stdout.write(prog.json())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
