"""The program being built: its recorded operations, the checks made while it is built and at
its end, operation fusion, instances, and the lowering to the JSON execution plan (upstream
MSCCL++'s format, the one ``mscclpp.ExecutionPlan`` reads).

Standard library only: this module never imports the native extension.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from typing import Any, Iterator

_PKG_DIR = os.path.dirname(os.path.abspath(__file__))


class DslError(ValueError):
    """A malformed program. The message starts with ``FILE:LINE:`` of the user's statement
    that caused it."""


def caller_site() -> tuple[str, int]:
    """(file, line) of the innermost frame outside this package: the user's statement."""
    f = sys._getframe(1)
    while f is not None and os.path.dirname(os.path.abspath(f.f_code.co_filename)) == _PKG_DIR:
        f = f.f_back  # type: ignore[assignment]
    if f is None:
        return ("<unknown>", 0)
    return (f.f_code.co_filename, f.f_lineno)


def fail(msg: str, site: tuple[str, int] | None = None) -> DslError:
    """A DslError naming ``site`` (default: the caller's statement)."""
    file, line = site if site is not None else caller_site()
    return DslError(f"{file}:{line}: {msg}")


BUFFER_NAMES = {"i": "input", "o": "output", "s": "scratch"}

_CURRENT: list[CollectiveProgram] = []


def get_program() -> CollectiveProgram:
    """The program of the innermost active ``with CollectiveProgram(...)``."""
    if not _CURRENT:
        raise fail("no CollectiveProgram is active: build the program inside `with CollectiveProgram(...):`")
    return _CURRENT[-1]


# ---------------------------------------------------------------------------------------------
# Recorded operations (before fusion and instances).


@dataclass(frozen=True)
class Ref:
    """An operand: ``kind`` local (buffer of the op's rank), remote (``rank``'s buffer reached
    through channels of ``access``) or switch (slot of switch channel ``switch``)."""

    kind: str
    buffer: str
    index: int
    size: int
    rank: int = -1
    access: str = ""
    switch: Any = None

    def same_local(self, other: Ref) -> bool:
        return self.kind == other.kind == "local" and (self.buffer, self.index, self.size) == (
            other.buffer,
            other.index,
            other.size,
        )


@dataclass
class Op:
    """One recorded operation of a thread block."""

    name: str
    site: tuple[str, int]
    src: list[Ref] = field(default_factory=list)
    dst: list[Ref] = field(default_factory=list)
    channels: list[Any] = field(default_factory=list)  # channel objects named by channel_ids
    channel_type: str | None = None
    reduce_op: str | None = None
    tbg: tuple[Any, int, int] | None = None  # (group, position, size)
    barrier: tuple[int, int] | None = None  # (barrier id, thread blocks)
    semaphores: list[int] = field(default_factory=list)
    loop: Any = None  # LoopIterationContext the op was recorded in
    before: bool = False  # __syncthreads before / after (nop), from data_sync
    after: bool = False
    nofuse: bool = False


# Fields each op writes, in the order they appear in the JSON.
_LOCAL = ("src", "dst", "tbg")
_FIELDS: dict[str, tuple[str, ...]] = {
    "nop": (),
    "barrier": ("barrier",),
    "signal": ("ids", "ctype"),
    "wait": ("ids", "ctype"),
    "rlxsignal": ("ids", "ctype"),
    "rlxwait": ("ids", "ctype"),
    "flush": ("ids", "ctype"),
    "put": ("src", "dst", "ids?", "ctype", "tbg"),
    "ppkt": ("src", "dst", "ids?", "ctype", "tbg"),
    "rppkt": ("src", "dst", "ids?", "ctype", "tbg"),
    "pws": ("src", "dst", "ids", "ctype", "tbg"),
    "pwsf": ("src", "dst", "ids", "ctype", "tbg"),
    "get": ("src", "dst", "ids", "ctype", "tbg"),
    "copy": _LOCAL,
    "cpkt": _LOCAL,
    "upkt": _LOCAL,
    "re": ("src", "dst", "rop", "tbg"),
    "repkt": ("src", "dst", "rop", "tbg"),
    "recpkt": ("src", "dst", "rop", "tbg"),
    "rre": ("src", "dst", "ctype", "rop", "tbg"),
    "res": ("src", "dst", "ctype", "rop", "tbg"),
    "rres": ("src", "dst", "ctype", "rop", "tbg"),
    "respkt": ("src", "dst", "ctype", "rop", "tbg"),
    "recspkt": ("src", "dst", "ctype", "rop", "tbg"),
    "glre": ("src", "dst", "ctype"),
    "glres": ("src", "dst", "ctype"),
    "gstore": ("src", "dst", "ctype"),
    "sem_acquire": ("sems",),
    "sem_release": ("sems",),
}

SIGNALS = ("signal", "rlxsignal", "pws", "pwsf")
WAITS = ("wait", "rlxwait")


def _is_put_result(prev: Op, cur: Op) -> bool:
    """``cur`` sends (every source) the local result ``prev.dst[0]``, split alike."""
    return (
        prev.tbg == cur.tbg
        and bool(cur.src)
        and all(s.same_local(prev.dst[0]) for s in cur.src)
        and all(d.kind == "remote" for d in cur.dst)
    )


def fuse(prev: Op, cur: Op) -> Op | None:
    """``prev`` and ``cur`` as one operation of the format, or None."""
    if cur.nofuse or prev.loop is not cur.loop:
        return None
    same = prev.name == cur.name and prev.channel_type == cur.channel_type and prev.tbg == cur.tbg
    merged = None
    if same and prev.name in ("signal", "wait", "rlxsignal", "rlxwait", "flush"):
        if not any(c in prev.channels for c in cur.channels):
            merged = Op(prev.name, prev.site, channels=prev.channels + cur.channels, channel_type=prev.channel_type)
    elif same and prev.name in ("sem_acquire", "sem_release"):
        merged = Op(prev.name, prev.site, semaphores=prev.semaphores + cur.semaphores)
    elif same and prev.name in ("put", "ppkt") and prev.channel_type == "memory":
        merged = Op(prev.name, prev.site, prev.src + cur.src, prev.dst + cur.dst, channel_type="memory")
    elif same and prev.name == "rppkt" and prev.src == cur.src and prev.channel_type == "memory":
        merged = Op("rppkt", prev.site, prev.src, prev.dst + cur.dst, channel_type="memory")
    elif same and prev.name == "rre" and prev.reduce_op == cur.reduce_op:
        if prev.src[0] == cur.src[0] and prev.dst == cur.dst:
            merged = Op("rre", prev.site, prev.src + cur.src[1:], prev.dst, channel_type="memory")
    elif cur.name == "put" and cur.channel_type == "memory" and prev.name in ("re", "res", "rre", "rres"):
        if _is_put_result(prev, cur):
            name = {"re": "res", "rre": "rres"}.get(prev.name, prev.name)
            merged = Op(name, prev.site, prev.src, prev.dst + cur.dst, channel_type="memory")
    elif cur.name == "ppkt" and cur.channel_type == "memory" and prev.name in ("repkt", "respkt"):
        if _is_put_result(prev, cur):
            merged = Op("respkt", prev.site, prev.src, prev.dst + cur.dst, channel_type="memory")
    elif cur.name == "cpkt" and prev.name == "repkt" and prev.tbg == cur.tbg:
        if cur.src[0].same_local(prev.dst[0]):
            merged = Op("recpkt", prev.site, prev.src, prev.dst + cur.dst)
    elif cur.name == "rppkt" and cur.channel_type == "memory" and prev.name in ("recpkt", "recspkt"):
        if prev.tbg == cur.tbg and cur.src[0].same_local(prev.dst[1]):
            merged = Op("recspkt", prev.site, prev.src, prev.dst + cur.dst, channel_type="memory")
    elif prev.channel_type == cur.channel_type == "port" and prev.channels == cur.channels and prev.tbg == cur.tbg:
        if (prev.name, cur.name) == ("put", "signal"):
            merged = Op("pws", prev.site, prev.src, prev.dst, channels=prev.channels, channel_type="port")
        elif (prev.name, cur.name) == ("pws", "flush"):
            merged = Op("pwsf", prev.site, prev.src, prev.dst, channels=prev.channels, channel_type="port")
    elif (prev.name, cur.name) == ("glre", "gstore") and cur.src[0].same_local(prev.dst[0]):
        sw = prev.src[0]
        if sw == cur.dst[0] and sw.switch.buffer_type == prev.dst[0].buffer and sw.index == prev.dst[0].index:
            merged = Op("glres", prev.site, [sw], [sw], channel_type="switch")
    if merged is None:
        return None
    merged.reduce_op = prev.reduce_op
    merged.tbg = prev.tbg
    merged.loop = prev.loop
    merged.before = prev.before or cur.before
    merged.after = prev.after or cur.after
    return merged


def _loop_key(op: Op) -> tuple[int, int] | None:
    """Signals and waits pair up per iteration context (the executor counts them alike)."""
    return None if op.loop is None else (op.loop.unit_size, op.loop.num_chunks)


# ---------------------------------------------------------------------------------------------
# Per-rank state.


class _Tb:
    def __init__(self) -> None:
        self.ops: list[Op] = []
        self.channels: dict[str, list[Any]] = {"memory": [], "port": [], "switch": []}
        self.refs: dict[str, list[tuple[int, str]]] = {"memory": [], "port": []}


class _Gpu:
    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.channels: dict[str, list[Any]] = {"memory": [], "port": []}
        self.switches: list[Any] = []
        self.remote: list[tuple[int, str, set[str]]] = []
        self.semaphores: list[Any] = []
        self.scratch_chunks = 0
        self.tbs: dict[int, _Tb] = {}
        self.barriers: dict[tuple[int, ...], int] = {}

    def tb(self, tb: int) -> _Tb:
        return self.tbs.setdefault(tb, _Tb())


class CollectiveProgram:
    """A collective program: ``with CollectiveProgram(name, collective, gpu_size, ...) as prog:``
    then build it with :class:`Rank`, buffers, channels and their operations; after the block
    (which runs the end-of-program checks) ``prog.to_json()`` is the plan.

    Parameters (upstream's names): ``protocol`` ``"Simple"`` or ``"LL"``; ``instr_fusion``
    fuses adjacent operations into the format's combined ones (put+signal = pws, reduce+put =
    res/rres/respkt, ...); ``auto_sync`` (upstream's default, True) puts a ``__syncthreads()``
    (``nop``) between every two operations of a thread block (after fusion): always safe, where
    upstream inserts one only between dependent operations; programs that place their own
    (``data_sync=``, ``Rank.nop``) pass False. ``instances`` replicates the program that many
    times, each instance on its own thread blocks, channels and slice of every chunk
    (``replication_policy`` is accepted for upstream's programs; interleaved is the only one);
    ``nranks_per_node`` (ours, default ``gpu_size``) lets the plan cache match multi-node
    plans.
    """

    def __init__(
        self,
        name: str,
        collective: Any,
        gpu_size: int,
        instances: int = 1,
        protocol: str = "Simple",
        instr_fusion: bool = True,
        auto_sync: bool = True,
        replication_policy: Any = None,
        num_threads_per_block: int = 1024,
        use_double_scratch_buffer: bool = False,
        buffer_alignment: int = 16,
        min_message_size: int = 0,
        max_message_size: int = 2**64 - 1,
        reuse_resources: bool = False,
        nranks_per_node: int | None = None,
    ) -> None:
        site = caller_site()
        if protocol not in ("Simple", "LL"):
            raise fail(f"protocol {protocol!r}: expected 'Simple' or 'LL'", site)
        if gpu_size < 1 or collective.num_ranks != gpu_size:
            raise fail(f"gpu_size {gpu_size}: expected the collective's {collective.num_ranks} ranks", site)
        if instances < 1:
            raise fail(f"instances {instances}: expected at least 1", site)
        if not 0 <= min_message_size <= max_message_size:
            raise fail(f"message sizes {min_message_size}..{max_message_size}: expected min <= max", site)
        self.name, self.collective, self.num_ranks, self.instances = name, collective, gpu_size, instances
        self.protocol, self.instr_fusion, self.reuse_resources = protocol, instr_fusion, reuse_resources
        self.auto_sync = auto_sync
        self.num_threads_per_block, self.buffer_alignment = num_threads_per_block, buffer_alignment
        self.use_double_scratch_buffer = use_double_scratch_buffer
        self.min_message_size, self.max_message_size = min_message_size, max_message_size
        self.nranks_per_node = nranks_per_node if nranks_per_node is not None else gpu_size
        self.gpus = [_Gpu(r) for r in range(gpu_size)]
        self.loop: Any = None
        self.finished = False

    # -- context manager ------------------------------------------------------------------
    def __enter__(self) -> CollectiveProgram:
        _CURRENT.append(self)
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        _CURRENT.remove(self)
        if exc_type is None:
            self.check()
            self.finished = True

    # -- building ---------------------------------------------------------------------------
    def check_rank(self, rank: Any, what: str = "rank") -> int:
        if not isinstance(rank, int) or isinstance(rank, bool) or not 0 <= rank < self.num_ranks:
            raise fail(f"{what} {rank!r}: expected a rank in 0..{self.num_ranks - 1} (gpu_size {self.num_ranks})")
        return rank

    def check_tb(self, tb: Any) -> int:
        if not isinstance(tb, int) or isinstance(tb, bool) or tb < 0:
            raise fail(f"tb {tb!r}: expected a thread block id >= 0")
        return tb

    def buffer_chunks(self, rank: int, buffer: str) -> int:
        if buffer == "s":
            return self.gpus[rank].scratch_chunks
        return int(self.collective.chunks(buffer))

    def add_op(self, rank: int, tb: int, op: Op) -> None:
        op.loop = self.loop
        g = self.gpus[rank]
        t = g.tb(self.check_tb(tb))
        for c in op.channels:
            if c not in g.channels[c.channel_type]:
                g.channels[c.channel_type].append(c)
            if c not in t.channels[c.channel_type]:
                t.channels[c.channel_type].append(c)
        for r in op.src + op.dst:
            if r.kind == "remote":
                self.remote_ref(rank, t, r)
            elif r.kind == "switch" and r.switch not in t.channels["switch"]:
                t.channels["switch"].append(r.switch)
        t.ops.append(op)

    def remote_ref(self, rank: int, t: _Tb, r: Ref) -> None:
        g = self.gpus[rank]
        for i, (owner, buf, access) in enumerate(g.remote):
            if (owner, buf) == (r.rank, r.buffer):
                access.add(r.access)
                break
        else:
            g.remote.append((r.rank, r.buffer, {r.access}))
        if (r.rank, r.buffer) not in t.refs[r.access]:
            t.refs[r.access].append((r.rank, r.buffer))

    def barrier_id(self, rank: int, tbs: tuple[int, ...]) -> int:
        b = self.gpus[rank].barriers
        return b.setdefault(tbs, len(b))

    # -- end-of-program checks ----------------------------------------------------------------
    def _all_ops(self, rank: int) -> Iterator[tuple[int, Op]]:
        for tb, t in sorted(self.gpus[rank].tbs.items()):
            for op in t.ops:
                yield tb, op

    def check(self) -> None:
        """Every wait is matched by the peer's signals; semaphores are acquired as often as
        released. Errors name the line of an unmatched operation."""
        for ctype in ("memory", "port"):
            for a in range(self.num_ranks):
                for b in range(self.num_ranks):
                    self._check_pair(ctype, a, b)
        for g in self.gpus:
            for sem in g.semaphores:
                ops = [op for _, op in self._all_ops(g.rank) if sem.id in op.semaphores]
                acq = sum(op.semaphores.count(sem.id) for op in ops if op.name == "sem_acquire")
                rel = sum(op.semaphores.count(sem.id) for op in ops if op.name == "sem_release")
                if acq != rel:
                    raise fail(
                        f"semaphore {sem.id} of rank {g.rank} is acquired {acq} time(s) and released {rel}",
                        ops[0].site if ops else sem.site,
                    )

    def _check_pair(self, ctype: str, a: int, b: int) -> None:
        """Signals of rank a to rank b equal b's waits, channel by channel: the k-th channel a
        uses to b (in the order of first use by an operation) pairs with b's k-th to a."""
        mine = [c for c in self.gpus[a].channels[ctype] if c.dst_rank == b]
        back = [c for c in self.gpus[b].channels[ctype] if c.dst_rank == a]
        for k in range(max(len(mine), len(back))):
            sig = [o for _, o in self._all_ops(a) if k < len(mine) and o.name in SIGNALS and mine[k] in o.channels]
            waits = [o for _, o in self._all_ops(b) if k < len(back) and o.name in WAITS and back[k] in o.channels]
            for key in {_loop_key(o) for o in sig + waits}:
                s = [o for o in sig if _loop_key(o) == key]
                w = [o for o in waits if _loop_key(o) == key]
                if len(s) != len(w):
                    site = (s[len(w)] if len(s) > len(w) else w[len(s)]).site
                    sent = (
                        f"through the #{k} {ctype} channel it uses to rank {b}"
                        if k < len(mine)
                        else f"(it uses {len(mine)} {ctype} channel(s) to rank {b}, no #{k})"
                    )
                    got = (
                        f"on its #{k} {ctype} channel to rank {a}"
                        if k < len(back)
                        else f"(it uses {len(back)} {ctype} channel(s) to rank {a}, no #{k})"
                    )
                    raise fail(
                        f"unmatched signal/wait: rank {a} signals rank {b} {len(s)} time(s) {sent}; rank {b} "
                        f"waits {len(w)} time(s) {got} (channels pair in the order each rank first uses them)"
                        + ("" if key is None else f", inside LoopIterationContext{key}"),
                        site,
                    )

    # -- lowering -------------------------------------------------------------------------------
    def _fused(self, ops: list[Op]) -> list[Op]:
        out: list[Op] = []
        for op in ops:
            m = fuse(out[-1], op) if self.instr_fusion and out and out[-1].name != "nop" else None
            if m is not None:
                out[-1] = m
            else:
                out.append(op)
        return out

    def _chunk(self, ref: Ref, inst: int, tb: _Tb) -> dict[str, Any]:
        k = self.instances
        index, size = ref.index * k + inst * ref.size, ref.size
        if ref.kind == "local":
            return {"type": ref.buffer, "index": index, "size": size}
        if ref.kind == "remote":
            return {"buffer_id": tb.refs[ref.access].index((ref.rank, ref.buffer)), "index": index, "size": size}
        return {"switch_channel_id": tb.channels["switch"].index(ref.switch), "index": index, "size": size}

    def _op_json(self, op: Op, tb: _Tb, inst: int) -> dict[str, Any]:
        k = self.instances
        o: dict[str, Any] = {"name": op.name}
        for f in _FIELDS[op.name]:
            if f == "src":
                o["src_buff"] = [self._chunk(r, inst, tb) for r in op.src]
            elif f == "dst":
                o["dst_buff"] = [self._chunk(r, inst, tb) for r in op.dst]
            elif f == "ids" or (f == "ids?" and op.channel_type == "port"):
                o["channel_ids"] = [tb.channels[c.channel_type].index(c) for c in op.channels]
            elif f == "ctype":
                o["channel_type"] = op.channel_type
            elif f == "rop":
                o["reduce_op"] = op.reduce_op
            elif f == "tbg" and op.tbg is not None:
                o["tbg_info"] = {"tb_id": op.tbg[1], "tbg_size": op.tbg[2]}
            elif f == "barrier":
                assert op.barrier is not None
                o["barrier_id"] = op.barrier[0] * k + inst
                o["num_threadblocks"] = op.barrier[1]
            elif f == "sems":
                o["semaphore_ids"] = [s * k + inst for s in op.semaphores]
        return o

    def _tb_ops(self, ops: list[Op], tb: _Tb, inst: int) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        loop_json: dict[str, Any] | None = None
        loop = None
        for op in self._fused(ops):
            if op.loop is None:
                loop_json = None
            elif loop_json is None or op.loop is not loop:
                ctx = {"unit_size": op.loop.unit_size, "num_chunks": op.loop.num_chunks}
                loop_json = {"name": "pipeline", "iter_context": ctx, "ops": []}
                out.append(loop_json)
            loop = op.loop
            dest = out if loop_json is None else loop_json["ops"]
            if (op.before or self.auto_sync) and dest and dest[-1]["name"] != "nop":
                dest.append({"name": "nop"})
            dest.append(self._op_json(op, tb, inst))
            if op.after:
                dest.append({"name": "nop"})
        return out

    def to_json(self) -> dict[str, Any]:
        """The execution plan as a JSON object (dict)."""
        if not self.finished:
            raise fail("the program is not finished: call to_json() after its `with` block")
        k = self.instances
        gpus = []
        for g in self.gpus:
            ntb = max(g.tbs) + 1 if g.tbs else 0
            tbs = []
            for t in range(ntb):
                tb = g.tbs.get(t, _Tb())
                for inst in range(k):
                    tb_chans = [
                        {"channel_type": ty, "channel_ids": [g_idx * k + inst for g_idx in self._gpu_ids(g, ty, cs)]}
                        for ty, cs in tb.channels.items()
                        if cs
                    ]
                    refs = [
                        {
                            "access_channel_type": ty,
                            "remote_buffer_ids": [
                                [(o, b) for o, b, _ in g.remote].index(rb) for rb in rbs
                            ],
                        }
                        for ty, rbs in tb.refs.items()
                        if rbs
                    ]
                    tbs.append(
                        {
                            "id": t * k + inst,
                            "channels": tb_chans,
                            "remote_buffer_refs": refs,
                            "ops": self._tb_ops(tb.ops, tb, inst),
                        }
                    )
            chans: list[dict[str, Any]] = [
                {"channel_type": ty, "connected_to": [c.dst_rank for c in cs for _ in range(k)]}
                for ty, cs in g.channels.items()
                if cs
            ]
            for sw in g.switches:
                for _ in range(k):
                    chans.append(
                        {
                            "channel_type": "switch",
                            "buffer_type": sw.buffer_type,
                            "rank_groups": [{"size": len(sw.ranks), "ranks": list(sw.ranks)}],
                        }
                    )
            gpus.append(
                {
                    "id": g.rank,
                    "input_chunks": self.collective.chunks("i") * k,
                    "output_chunks": self.collective.chunks("o") * k,
                    "scratch_chunks": g.scratch_chunks * k,
                    "channels": chans,
                    "remote_buffers": [
                        {"rank": o, "type": b, "access_channel_types": sorted(a)} for o, b, a in g.remote
                    ],
                    "semaphores": [{"init_value": s.initial_value} for s in g.semaphores for _ in range(k)],
                    "threadblocks": tbs,
                }
            )
        return {
            "name": self.name,
            "collective": self.collective.name,
            "protocol": self.protocol,
            "inplace": self.collective.inplace,
            "reuse_resources": self.reuse_resources,
            "num_threads_per_block": self.num_threads_per_block,
            "use_double_scratch_buffer": self.use_double_scratch_buffer,
            "buffer_alignment": self.buffer_alignment,
            "min_message_size": self.min_message_size,
            "max_message_size": self.max_message_size,
            "nranks_per_node": self.nranks_per_node,
            "gpus": gpus,
        }

    @staticmethod
    def _gpu_ids(g: _Gpu, ty: str, cs: list[Any]) -> list[int]:
        if ty == "switch":
            return [g.switches.index(c) for c in cs]
        return [g.channels[ty].index(c) for c in cs]

    def json(self) -> str:
        """The plan as text: indented, one operation per line."""
        return render(self.to_json())

    def save(self, path: str | os.PathLike[str]) -> None:
        """Writes :meth:`json` to ``path``."""
        with open(path, "w") as f:
            f.write(self.json())


def render(plan: dict[str, Any]) -> str:
    """JSON text with one operation per line (readable, and several times smaller than fully
    indented)."""
    ops: list[str] = []
    copy = json.loads(json.dumps(plan))
    for g in copy["gpus"]:
        for t in g["threadblocks"]:
            for i, o in enumerate(t["ops"]):
                ops.append(json.dumps(o, separators=(",", ":")))
                t["ops"][i] = f"@@OP{len(ops) - 1}@@"
    text = json.dumps(copy, indent=1)
    for i, o in enumerate(ops):
        text = text.replace(f'"@@OP{i}@@"', o, 1)
    return text + "\n"
