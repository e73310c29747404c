#!/usr/bin/env python3
"""Writes the execution plans shipped with mscclpp-rs (core/plans/*.json).

Plans are in upstream MSCCL++'s JSON execution-plan format, written for this project (not
produced by upstream's DSL). Every plan is single-node and names its world size in the file
name; the top-level "nranks_per_node" field (ignored by upstream) lets the plan cache match
it. Run `python3 core/plans/gen_plans.py` after changing this file; CI checks the committed
files are what it writes (`--check`).

Families (r = this rank, p = a peer, pos(q, r) = index of q among r's peers):
  allreduce_simple   in place; start sync, barrier, rre of chunk r over all peers (split over
                     the thread blocks), barrier, signal/wait, get each peer's chunk, end sync.
  allreduce_oop      out of place; rres (reads peers' inputs, writes everyone's outputs).
  allreduce_put      in place; put chunks into peers' scratch, re+put or res of chunk r.
  allreduce_ll       LL, double scratch; ppkt, respkt (split), upkt.
  allreduce_ll_fwd   LL, double scratch; ppkt, recspkt / repkt+cpkt+rppkt / recpkt+rppkt, upkt.
  allgather_simple   in place; rlxsignal/rlxwait start sync, put, signal/wait.
  allgather_oop      out of place; copy, put, signal/wait.
  allgather_ll       LL, double scratch; ppkt, upkt.
  allgather_ll_fwd   LL, double scratch; cpkt, rppkt, upkt.
  allgather_port     in place; port channels: signal/wait, pws+flush or pwsf, device semaphores.
  allgather_pipeline in place; pipeline of puts (unit 1 KiB), barrier.
  allreduce_nvls     in place; one switch channel over every rank's input (NVLS): start sync,
                     glres of chunk r (load-reduce through the switch, store to every rank),
                     nop, end sync.
  allreduce_nvls_ls  as allreduce_nvls with glre of chunk r into the local input, nop, then
                     gstore of it through the switch.
"""

import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def peers(r, n):
    return [q for q in range(n) if q != r]


def pos(q, r):
    """Index of q among r's peers."""
    return q if q < r else q - 1


def ch(ty, index, size=1):
    return {"type": ty, "index": index, "size": size}


def rch(slot, index, size=1):
    return {"buffer_id": slot, "index": index, "size": size}


class Gpu:
    def __init__(self, rank, ic, oc, sc):
        self.rank, self.ic, self.oc, self.sc = rank, ic, oc, sc
        self.chans = {"memory": [], "port": []}
        self.switch = []  # (buffer type, ranks)
        self.remote = []  # (rank, type, set(access))
        self.sems = []
        self.tbs = []

    def channel(self, ty, peer):
        self.chans[ty].append(peer)
        return len(self.chans[ty]) - 1

    def rbuf(self, rank, ty, access):
        for i, (r, t, a) in enumerate(self.remote):
            if r == rank and t == ty:
                a.add(access)
                return i
        self.remote.append((rank, ty, {access}))
        return len(self.remote) - 1

    def tb(self):
        t = Tb(self, len(self.tbs))
        self.tbs.append(t)
        return t

    def to_json(self):
        return {
            "id": self.rank,
            "input_chunks": self.ic,
            "output_chunks": self.oc,
            "scratch_chunks": self.sc,
            "channels": [{"channel_type": t, "connected_to": p} for t, p in self.chans.items() if p]
            + [
                {"channel_type": "switch", "buffer_type": b, "rank_groups": [{"size": len(rs), "ranks": rs}]}
                for b, rs in self.switch
            ],
            "remote_buffers": [
                {"rank": r, "type": t, "access_channel_types": sorted(a)} for r, t, a in self.remote
            ],
            "semaphores": [{"init_value": v} for v in self.sems],
            "threadblocks": [t.to_json() for t in self.tbs],
        }


class Tb:
    def __init__(self, gpu, id):
        self.gpu, self.id = gpu, id
        self.chans = {"memory": [], "port": [], "switch": []}
        self.rbufs = {"memory": [], "port": []}
        self.ops = []

    def chan(self, ty, peer):
        """Local index of the rank's channel of type `ty` to `peer` (created on first use)."""
        g = self.gpu
        for i, c in enumerate(self.chans[ty]):
            if g.chans[ty][c] == peer:
                return i
        self.chans[ty].append(g.channel(ty, peer))
        return len(self.chans[ty]) - 1

    def rb(self, ty, rank, btype):
        """Local slot of rank `rank`'s buffer `btype` reached through `ty` channels."""
        idx = self.gpu.rbuf(rank, btype, ty)
        if idx not in self.rbufs[ty]:
            self.rbufs[ty].append(idx)
        return self.rbufs[ty].index(idx)

    def op(self, name, **kw):
        o = {"name": name}
        o.update(kw)
        self.ops.append(o)
        return o

    def sync(self, ty, peer, relaxed=False):
        c = self.chan(ty, peer)
        self.op("rlxsignal" if relaxed else "signal", channel_ids=[c], channel_type=ty)
        self.op("rlxwait" if relaxed else "wait", channel_ids=[c], channel_type=ty)
        self.op("nop")

    def to_json(self):
        return {
            "id": self.id,
            "channels": [{"channel_type": t, "channel_ids": c} for t, c in self.chans.items() if c],
            "remote_buffer_refs": [
                {"access_channel_type": t, "remote_buffer_ids": b} for t, b in self.rbufs.items() if b
            ],
            "ops": self.ops,
        }


def plan(name, coll, n, proto, inplace, gpus, double=False):
    return {
        "name": name,
        "collective": coll,
        "protocol": proto,
        "inplace": inplace,
        "reuse_resources": False,
        "num_threads_per_block": 1024 if proto == "Simple" else 512,
        "use_double_scratch_buffer": double,
        "buffer_alignment": 16,
        "min_message_size": 0,
        "max_message_size": 2**64 - 1,
        "nranks_per_node": n,
        "gpus": [g.to_json() for g in gpus],
    }


def tbg(j, n):
    return {"tb_id": j, "tbg_size": n}


def barrier(t, n):
    if n > 1:
        t.op("barrier", barrier_id=0, num_threadblocks=n)
    else:
        t.op("nop")


def allreduce_simple(n):
    gpus = []
    for r in range(n):
        g = Gpu(r, n, n, 0)
        ps = peers(r, n)
        for j, p in enumerate(ps):
            t = g.tb()
            t.sync("memory", p)
            barrier(t, n - 1)
            src = [ch("i", r)] + [rch(t.rb("memory", q, "i"), r) for q in ps]
            t.op("rre", src_buff=src, dst_buff=[ch("i", r)], channel_type="memory",
                 reduce_op="sum", tbg_info=tbg(j, n - 1))
            barrier(t, n - 1)
            t.sync("memory", p)
            t.op("get", src_buff=[rch(t.rb("memory", p, "i"), p)], dst_buff=[ch("i", p)],
                 channel_ids=[t.chan("memory", p)], channel_type="memory")
            # The peer reads our chunk p the same way: neither may return (and let its user
            # overwrite the buffer) before the other finished reading.
            t.op("nop")
            t.sync("memory", p)
        gpus.append(g)
    return plan(f"allreduce_simple_n{n}", "allreduce", n, "Simple", True, gpus)


def allreduce_oop(n):
    gpus = []
    for r in range(n):
        g = Gpu(r, n, n, 0)
        ps = peers(r, n)
        for j, p in enumerate(ps):
            t = g.tb()
            t.sync("memory", p)
            barrier(t, n - 1)
            src = [ch("i", r)] + [rch(t.rb("memory", q, "i"), r) for q in ps]
            dst = [ch("o", r)] + [rch(t.rb("memory", q, "o"), r) for q in ps]
            t.op("rres", src_buff=src, dst_buff=dst, channel_type="memory", reduce_op="sum",
                 tbg_info=tbg(j, n - 1))
            barrier(t, n - 1)
            t.sync("memory", p)
        gpus.append(g)
    return plan(f"allreduce_oop_n{n}", "allreduce", n, "Simple", False, gpus)


def allreduce_put(n):
    gpus = []
    for r in range(n):
        g = Gpu(r, n, n, n - 1)
        ps = peers(r, n)
        for j, p in enumerate(ps):
            t = g.tb()
            t.sync("memory", p)
            t.op("put", src_buff=[ch("i", p)], dst_buff=[rch(t.rb("memory", p, "s"), pos(r, p))],
                 channel_type="memory")
            t.op("nop")
            t.sync("memory", p)
            barrier(t, n - 1)
            src = [ch("i", r)] + [ch("s", k) for k in range(n - 1)]
            remote = [rch(t.rb("memory", q, "i"), r) for q in ps]
            if r % 2 == 0:
                t.op("res", src_buff=src, dst_buff=[ch("i", r)] + remote, channel_type="memory",
                     reduce_op="sum", tbg_info=tbg(j, n - 1))
            else:
                t.op("re", src_buff=src, dst_buff=[ch("i", r)], reduce_op="sum",
                     tbg_info=tbg(j, n - 1))
                t.op("nop")
                t.op("put", src_buff=[ch("i", r)] * len(ps), dst_buff=remote,
                     channel_type="memory", tbg_info=tbg(j, n - 1))
            barrier(t, n - 1)
            t.sync("memory", p)
        gpus.append(g)
    return plan(f"allreduce_put_n{n}", "allreduce", n, "Simple", True, gpus)


def allreduce_ll(n):
    gpus = []
    for r in range(n):
        g = Gpu(r, n, n, 2 * (n - 1))
        ps = peers(r, n)
        for j, p in enumerate(ps):
            t = g.tb()
            t.op("ppkt", src_buff=[ch("i", p)], dst_buff=[rch(t.rb("memory", p, "s"), pos(r, p))],
                 channel_type="memory")
        for j, p in enumerate(ps):
            t = g.tbs[j]
            src = [ch("i", r)] + [ch("s", k) for k in range(n - 1)]
            dst = [ch("i", r)] + [rch(t.rb("memory", q, "s"), n - 1 + pos(r, q)) for q in ps]
            t.op("respkt", src_buff=src, dst_buff=dst, channel_type="memory", reduce_op="sum",
                 tbg_info=tbg(j, n - 1))
            t.op("upkt", src_buff=[ch("s", n - 1 + j)], dst_buff=[ch("i", p)])
        gpus.append(g)
    return plan(f"allreduce_ll_n{n}", "allreduce", n, "LL", True, gpus, double=True)


def allreduce_ll_fwd(n):
    """Like allreduce_ll, but the result travels by forwarding packets: rank r % 3 == 0
    reduce-copy-sends, 1 reduces then copies to packets then forwards, 2 reduce-copies then
    forwards."""
    gpus = []
    c = 2 * (n - 1)  # scratch slot of this rank's own result packets
    for r in range(n):
        g = Gpu(r, n, n, c + 1)
        ps = peers(r, n)
        for p in ps:
            t = g.tb()
            t.op("ppkt", src_buff=[ch("i", p)], dst_buff=[rch(t.rb("memory", p, "s"), pos(r, p))],
                 channel_type="memory")
        for j, p in enumerate(ps):
            t = g.tbs[j]
            src = [ch("i", r)] + [ch("s", k) for k in range(n - 1)]
            remote = [rch(t.rb("memory", q, "s"), n - 1 + pos(r, q)) for q in ps]
            g_ = tbg(j, n - 1)
            if r % 3 == 0:
                t.op("recspkt", src_buff=src, dst_buff=[ch("i", r), ch("s", c)] + remote,
                     channel_type="memory", reduce_op="sum", tbg_info=g_)
            else:
                if r % 3 == 1:
                    t.op("repkt", src_buff=src, dst_buff=[ch("i", r)], reduce_op="sum", tbg_info=g_)
                    t.op("nop")
                    t.op("cpkt", src_buff=[ch("i", r)], dst_buff=[ch("s", c)], tbg_info=g_)
                else:
                    t.op("recpkt", src_buff=src, dst_buff=[ch("i", r), ch("s", c)], reduce_op="sum",
                         tbg_info=g_)
                t.op("rppkt", src_buff=[ch("s", c)], dst_buff=remote, channel_type="memory",
                     tbg_info=g_)
            t.op("upkt", src_buff=[ch("s", n - 1 + j)], dst_buff=[ch("i", p)])
        gpus.append(g)
    return plan(f"allreduce_ll_fwd_n{n}", "allreduce", n, "LL", True, gpus, double=True)


def sync_all(t, ps):
    """Signal every peer, then wait for every peer (memory channels), then nop."""
    cs = [t.chan("memory", p) for p in ps]
    t.op("signal", channel_ids=cs, channel_type="memory")
    t.op("wait", channel_ids=cs, channel_type="memory")
    t.op("nop")


def allreduce_nvls_family(n, name, load_store):
    gpus = []
    for r in range(n):
        g = Gpu(r, n, n, 0)
        g.switch.append(("i", list(range(n))))
        ps = peers(r, n)
        t = g.tb()
        t.chans["switch"].append(0)
        # Every rank's input is ready before anyone reduces through the switch.
        sync_all(t, ps)
        sw = {"switch_channel_id": 0, "index": r, "size": 1}
        if load_store:
            t.op("glre", src_buff=[sw], dst_buff=[ch("i", r)], channel_type="switch")
            t.op("nop")
            t.op("gstore", src_buff=[ch("i", r)], dst_buff=[sw], channel_type="switch")
        else:
            t.op("glres", src_buff=[sw], dst_buff=[sw], channel_type="switch")
        # Every rank's stores landed before anyone returns (nop first: each thread signals
        # one peer, after every thread's share of the stores is done).
        t.op("nop")
        sync_all(t, ps)
        gpus.append(g)
    return plan(f"{name}_n{n}", "allreduce", n, "Simple", True, gpus)


def allreduce_nvls(n):
    return allreduce_nvls_family(n, "allreduce_nvls", False)


def allreduce_nvls_ls(n):
    return allreduce_nvls_family(n, "allreduce_nvls_ls", True)


def allgather_simple(n):
    gpus = []
    for r in range(n):
        g = Gpu(r, 1, n, 0)
        for p in peers(r, n):
            t = g.tb()
            t.sync("memory", p, relaxed=True)
            t.op("put", src_buff=[ch("o", r)], dst_buff=[rch(t.rb("memory", p, "o"), r)],
                 channel_type="memory")
            t.op("nop")
            t.sync("memory", p)
        gpus.append(g)
    return plan(f"allgather_simple_n{n}", "allgather", n, "Simple", True, gpus)


def allgather_oop(n):
    gpus = []
    for r in range(n):
        g = Gpu(r, 1, n, 0)
        for j, p in enumerate(peers(r, n)):
            t = g.tb()
            if j == 0:
                t.op("copy", src_buff=[ch("i", 0)], dst_buff=[ch("o", r)])
            barrier(t, n - 1)
            t.sync("memory", p)
            t.op("put", src_buff=[ch("i", 0)], dst_buff=[rch(t.rb("memory", p, "o"), r)],
                 channel_type="memory")
            t.op("nop")
            t.sync("memory", p)
        gpus.append(g)
    return plan(f"allgather_oop_n{n}", "allgather", n, "Simple", False, gpus)


def allgather_ll(n):
    gpus = []
    for r in range(n):
        g = Gpu(r, 1, n, n - 1)
        for j, p in enumerate(peers(r, n)):
            t = g.tb()
            t.op("ppkt", src_buff=[ch("o", r)], dst_buff=[rch(t.rb("memory", p, "s"), pos(r, p))],
                 channel_type="memory")
            t.op("upkt", src_buff=[ch("s", j)], dst_buff=[ch("o", p)])
        gpus.append(g)
    return plan(f"allgather_ll_n{n}", "allgather", n, "LL", True, gpus, double=True)


def allgather_ll_fwd(n):
    gpus = []
    for r in range(n):
        g = Gpu(r, 1, n, n)
        ps = peers(r, n)
        t = g.tb()
        t.op("cpkt", src_buff=[ch("o", r)], dst_buff=[ch("s", n - 1)])
        t.op("nop")
        t.op("rppkt", src_buff=[ch("s", n - 1)],
             dst_buff=[rch(t.rb("memory", p, "s"), pos(r, p)) for p in ps], channel_type="memory")
        for j, p in enumerate(ps):
            t.op("upkt", src_buff=[ch("s", j)], dst_buff=[ch("o", p)])
        gpus.append(g)
    return plan(f"allgather_ll_fwd_n{n}", "allgather", n, "LL", True, gpus, double=True)


def allgather_port(n):
    gpus = []
    for r in range(n):
        g = Gpu(r, 1, n, 0)
        g.sems = [0]
        ps = peers(r, n)
        for j, p in enumerate(ps):
            t = g.tb()
            t.sync("port", p)
            c = t.chan("port", p)
            dst = [rch(t.rb("port", p, "o"), r)]
            if j % 2 == 0:
                t.op("pws", src_buff=[ch("o", r)], dst_buff=dst, channel_ids=[c], channel_type="port")
                t.op("flush", channel_ids=[c], channel_type="port")
            else:
                t.op("pwsf", src_buff=[ch("o", r)], dst_buff=dst, channel_ids=[c], channel_type="port")
            t.op("wait", channel_ids=[c], channel_type="port")
            t.op("nop")
            # Thread blocks 1.. report to block 0 through device semaphore 0.
            if j > 0:
                t.op("sem_release", semaphore_ids=[0])
        if n > 2:
            g.tbs[0].op("sem_acquire", semaphore_ids=[0] * (n - 2))
        gpus.append(g)
    return plan(f"allgather_port_n{n}", "allgather", n, "Simple", True, gpus)


def allgather_pipeline(n):
    gpus = []
    for r in range(n):
        g = Gpu(r, 1, n, 0)
        ps = peers(r, n)
        for j, p in enumerate(ps):
            t = g.tb()
            t.sync("memory", p)
            barrier(t, n - 1)
            t.op("pipeline", iter_context={"unit_size": 1024, "num_chunks": 1}, ops=[
                {"name": "put", "src_buff": [ch("o", r)],
                 "dst_buff": [rch(t.rb("memory", p, "o"), r)], "channel_type": "memory"},
            ])
            t.op("nop")
            t.sync("memory", p)
        gpus.append(g)
    return plan(f"allgather_pipeline_n{n}", "allgather", n, "Simple", True, gpus)


def render(p):
    """JSON with one operation per line (readable, and a few times smaller than indented)."""
    ops = []

    def stash(obj):
        for g in obj["gpus"]:
            for t in g["threadblocks"]:
                for i, o in enumerate(t["ops"]):
                    ops.append(json.dumps(o, separators=(",", ":")))
                    t["ops"][i] = f"@@OP{len(ops) - 1}@@"
        return obj

    text = json.dumps(stash(json.loads(json.dumps(p))), indent=1)
    for i, o in enumerate(ops):
        text = text.replace(f'"@@OP{i}@@"', o, 1)
    return text + "\n"


FAMILIES = [
    allreduce_simple, allreduce_oop, allreduce_put, allreduce_ll, allreduce_ll_fwd,
    allgather_simple, allgather_oop, allgather_ll, allgather_ll_fwd, allgather_port,
    allgather_pipeline, allreduce_nvls, allreduce_nvls_ls,
]


def main():
    check = "--check" in sys.argv[1:]
    bad = 0
    for f in FAMILIES:
        for n in (2, 4, 8):
            p = f(n)
            path = os.path.join(HERE, p["name"] + ".json")
            text = render(p)
            if check:
                try:
                    with open(path) as fh:
                        same = fh.read() == text
                except OSError:
                    same = False
                if not same:
                    print(f"stale: {path} (run core/plans/gen_plans.py)")
                    bad += 1
            else:
                with open(path, "w") as fh:
                    fh.write(text)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
