"""What a program is written with: ranks and their buffers sliced into chunks, channels and
their operations, thread-block groups, semaphores and loop (pipeline) contexts. Every call
records operations into the active :class:`~.program.CollectiveProgram` and checks its
arguments at once; a mistake raises :class:`~.program.DslError` naming the caller's line."""

from __future__ import annotations

from enum import Enum
from typing import Any, Iterable

from .program import BUFFER_NAMES, CollectiveProgram, Op, Ref, caller_site, fail, get_program, render


class BufferType(str, Enum):
    """A rank's buffers: the input, the output and the executor's scratch."""

    input = "i"
    output = "o"
    scratch = "s"


class SyncType(Enum):
    """Where a thread-block-wide ``__syncthreads()`` (a ``nop``) goes around an operation."""

    none = 0
    before = 1
    after = 2
    both = 3


class ReduceOperationType(str, Enum):
    """Reductions of the reduce operations."""

    sum = "sum"
    min = "min"
    max = "max"


def _sync(data_sync: SyncType) -> tuple[bool, bool]:
    if not isinstance(data_sync, SyncType):
        raise fail(f"data_sync {data_sync!r}: expected a SyncType (none, before, after, both)")
    return data_sync in (SyncType.before, SyncType.both), data_sync in (SyncType.after, SyncType.both)


def _reduce_op(op: Any) -> str:
    try:
        return ReduceOperationType(op).value
    except ValueError:
        raise fail(f"reduce_op {op!r}: expected sum, min or max") from None


class Chunk:
    """``size`` consecutive chunks of a rank's buffer, from ``index``."""

    def __init__(self, rank: int, buffer: str, index: int, size: int) -> None:
        self.rank, self.buffer, self.index, self.size = rank, buffer, index, size

    def __repr__(self) -> str:
        return f"Chunk(rank {self.rank} {BUFFER_NAMES[self.buffer]}[{self.index}:{self.index + self.size}])"

    def _ref(self) -> Ref:
        return Ref("local", self.buffer, self.index, self.size)

    def _remote(self, access: str) -> Ref:
        return Ref("remote", self.buffer, self.index, self.size, rank=self.rank, access=access)


class BaseBuffer:
    """``size`` chunks of rank ``rank``'s buffer ``buffer`` from ``offset``; index or slice it
    (``buf[3]``, ``buf[2:4]``) for chunks."""

    def __init__(self, rank: int, buffer: str, offset: int, size: int) -> None:
        self.rank, self.buffer, self.offset, self.size = rank, buffer, offset, size

    def __getitem__(self, key: int | slice) -> Chunk:
        name = f"rank {self.rank}'s {BUFFER_NAMES[self.buffer]} buffer of {self.size} chunks"
        if isinstance(key, int) and not isinstance(key, bool):
            start, stop = key, key + 1
        elif isinstance(key, slice) and key.step in (None, 1):
            start = 0 if key.start is None else key.start
            stop = self.size if key.stop is None else key.stop
        else:
            raise fail(f"{name}: index {key!r}: expected an int or a slice without step")
        if not (isinstance(start, int) and isinstance(stop, int)) or not 0 <= start < stop <= self.size:
            raise fail(f"chunk [{start}:{stop}] out of bounds of {name} (expected 0 <= start < stop <= {self.size})")
        return Chunk(self.rank, self.buffer, self.offset + start, stop - start)

    def __len__(self) -> int:
        return self.size


class Buffer(BaseBuffer):
    """A scratch buffer of ``size`` chunks on ``rank`` (appended to the rank's scratch)."""

    def __init__(self, rank: int, size: int) -> None:
        prog = get_program()
        prog.check_rank(rank)
        if not isinstance(size, int) or size < 1:
            raise fail(f"scratch size {size!r}: expected an int >= 1")
        g = prog.gpus[rank]
        super().__init__(rank, "s", g.scratch_chunks, size)
        g.scratch_chunks += size


class ThreadBlockGroup:
    """Thread blocks that share an operation: each does its slice of the chunks."""

    def __init__(self, tb_list: Iterable[int]) -> None:
        self.tb_list = list(tb_list)
        if not self.tb_list or len(set(self.tb_list)) != len(self.tb_list):
            raise fail(f"ThreadBlockGroup {self.tb_list}: expected distinct thread block ids")

    def get_internal_id(self, tb: int) -> int:
        return self.tb_list.index(tb)

    def numtb(self) -> int:
        return len(self.tb_list)


def _blocks(tb: int | None, tb_group: ThreadBlockGroup | None) -> list[tuple[int, Any]]:
    """(thread block, tbg info) for an op given ``tb=`` or ``tb_group=``."""
    if (tb is None) == (tb_group is None):
        raise fail("expected exactly one of tb= (a thread block id) and tb_group= (a ThreadBlockGroup)")
    if tb_group is None:
        assert tb is not None
        return [(tb, None)]
    if not isinstance(tb_group, ThreadBlockGroup):
        raise fail(f"tb_group {tb_group!r}: expected a ThreadBlockGroup")
    n = tb_group.numtb()
    return [(t, (tuple(tb_group.tb_list), i, n)) for i, t in enumerate(tb_group.tb_list)]


def _check_chunk(c: Any, rank: int, what: str, scratch: bool = False) -> Chunk:
    if not isinstance(c, Chunk):
        raise fail(f"{what}: expected a Chunk (a buffer sliced with [..]), got {c!r}")
    if c.rank != rank:
        raise fail(f"{what}: expected a chunk of rank {rank}, got {c!r}")
    if scratch and c.buffer != "s":
        raise fail(f"{what}: packets live in scratch: expected a scratch chunk (Buffer), got {c!r}")
    return c


def _same_size(chunks: list[Chunk]) -> None:
    if len({c.size for c in chunks}) > 1:
        raise fail(f"chunk sizes differ: {chunks}: expected equal sizes")


class Rank:
    """Rank ``rank`` of the program: its buffers and its local operations."""

    def __init__(self, rank: int) -> None:
        self.prog: CollectiveProgram = get_program()
        self.rank = self.prog.check_rank(rank)

    def get_input_buffer(self) -> BaseBuffer:
        return BaseBuffer(self.rank, "i", 0, self.prog.collective.chunks("i"))

    def get_output_buffer(self) -> BaseBuffer:
        return BaseBuffer(self.rank, "o", 0, self.prog.collective.chunks("o"))

    def _local(self, name: str, dst: Chunk, src: Chunk, tb: Any, tb_group: Any, packet_dst: bool = False,
               packet_src: bool = False) -> None:
        _check_chunk(dst, self.rank, f"{name}: dst_chunk", packet_dst)
        _check_chunk(src, self.rank, f"{name}: src_chunk", packet_src)
        _same_size([dst, src])
        site = caller_site()
        for t, g in _blocks(tb, tb_group):
            self.prog.add_op(self.rank, t, Op(name, site, [src._ref()], [dst._ref()], tbg=g))

    def copy(self, dst_chunk: Chunk, src_chunk: Chunk, tb: int | None = None,
             tb_group: ThreadBlockGroup | None = None) -> None:
        """Copies ``src_chunk`` to ``dst_chunk`` (both this rank's)."""
        self._local("copy", dst_chunk, src_chunk, tb, tb_group)

    def copy_packets(self, dst_chunk: Chunk, src_chunk: Chunk, tb: int | None = None,
                     tb_group: ThreadBlockGroup | None = None) -> None:
        """Writes ``src_chunk`` as LL packets into the scratch chunk ``dst_chunk``."""
        self._local("cpkt", dst_chunk, src_chunk, tb, tb_group, packet_dst=True)

    def unpack_packets(self, dst_chunk: Chunk, src_chunk: Chunk, tb: int | None = None,
                       tb_group: ThreadBlockGroup | None = None) -> None:
        """Waits for the LL packets of the scratch chunk ``src_chunk`` and writes their data to
        ``dst_chunk``."""
        self._local("upkt", dst_chunk, src_chunk, tb, tb_group, packet_src=True)

    def reduce(self, src_chunk: Chunk, other_chunks: list[Chunk], tb: int | None = None,
               tb_group: ThreadBlockGroup | None = None, dst_chunk: Chunk | None = None,
               reduce_op: Any = ReduceOperationType.sum, packet: bool = False) -> None:
        """``dst_chunk`` (default ``src_chunk``) = ``src_chunk`` reduced with ``other_chunks``
        (this rank's; with ``packet=True`` they are LL packets in scratch)."""
        dst = src_chunk if dst_chunk is None else dst_chunk
        _check_chunk(src_chunk, self.rank, "reduce: src_chunk")
        _check_chunk(dst, self.rank, "reduce: dst_chunk")
        if not other_chunks:
            raise fail("reduce: other_chunks: expected at least one chunk")
        for c in other_chunks:
            _check_chunk(c, self.rank, "reduce: other_chunks", packet)
        _same_size([src_chunk, dst, *other_chunks])
        rop, site = _reduce_op(reduce_op), caller_site()
        for t, g in _blocks(tb, tb_group):
            src = [src_chunk._ref()] + [c._ref() for c in other_chunks]
            op = Op("repkt" if packet else "re", site, src, [dst._ref()], reduce_op=rop, tbg=g)
            self.prog.add_op(self.rank, t, op)

    def barrier(self, tb_list: list[int]) -> None:
        """The listed thread blocks wait for each other (one block: a ``nop``)."""
        tbs = tuple(tb_list)
        if not tbs or len(set(tbs)) != len(tbs):
            raise fail(f"barrier {list(tbs)}: expected distinct thread block ids")
        site = caller_site()
        if len(tbs) == 1:
            self.prog.add_op(self.rank, tbs[0], Op("nop", site))
            return
        bid = self.prog.barrier_id(self.rank, tuple(sorted(tbs)))
        for t in tbs:
            self.prog.add_op(self.rank, t, Op("barrier", site, barrier=(bid, len(tbs))))

    def nop(self, tb: int) -> None:
        """``__syncthreads()`` of thread block ``tb`` (also keeps the operations around it from
        being fused)."""
        self.prog.add_op(self.rank, tb, Op("nop", caller_site()))


class _Channel:
    channel_type = ""

    def __init__(self, dst_rank: int, src_rank: int) -> None:
        self.prog = get_program()
        self.site = caller_site()
        self.src_rank = self.prog.check_rank(src_rank, "src_rank")
        self.dst_rank = self.prog.check_rank(dst_rank, "dst_rank")
        if dst_rank == src_rank:
            name = type(self).__name__
            raise fail(f"{name}({dst_rank}, {src_rank}): a channel to itself: expected two different ranks")

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.dst_rank}, {self.src_rank})"

    def _sync_op(self, name: str, tb: int, data_sync: SyncType, fuse: bool = True) -> None:
        before, after = _sync(data_sync)
        op = Op(name, caller_site(), channels=[self], channel_type=self.channel_type, before=before, after=after,
                nofuse=not fuse)
        self.prog.add_op(self.src_rank, tb, op)

    def signal(self, tb: int, data_sync: SyncType = SyncType.both, relaxed: bool = False) -> None:
        """Increments the peer's semaphore of this channel (after this block's earlier writes
        through it)."""
        self._sync_op("rlxsignal" if relaxed else "signal", tb, data_sync)

    def wait(self, tb: int, data_sync: SyncType = SyncType.both, relaxed: bool = False) -> None:
        """Waits for one signal of the peer on this channel."""
        self._sync_op("rlxwait" if relaxed else "wait", tb, data_sync)

    def _transfer(self, name: str, dst: Any, src: Any, tb: Any, tb_group: Any, *, remote_dst: bool,
                  packet_dst: bool = False, packet_src: bool = False, with_ids: bool = False,
                  fuse: bool = True, sync: tuple[bool, bool] = (False, False)) -> None:
        me, peer = self.src_rank, self.dst_rank
        d = _check_chunk(dst, peer if remote_dst else me, f"{name}: dst_chunk", packet_dst)
        s = _check_chunk(src, me if remote_dst else peer, f"{name}: src_chunk", packet_src)
        _same_size([d, s])
        site = caller_site()
        for t, g in _blocks(tb, tb_group):
            sref = s._ref() if remote_dst else s._remote(self.channel_type)
            dref = d._remote(self.channel_type) if remote_dst else d._ref()
            op = Op(name, site, [sref], [dref], channels=[self] if with_ids else [], channel_type=self.channel_type,
                    tbg=g, nofuse=not fuse, before=sync[0], after=sync[1])
            self.prog.add_op(me, t, op)


class MemoryChannel(_Channel):
    """A channel from ``src_rank`` to ``dst_rank`` through mapped peer memory. For signals and
    waits, the k-th channel rank a uses to rank b (in the order of first use by a signal, wait,
    get or port operation) pairs with the k-th channel b uses to a. Data operations (put,
    reduce, packets) reach the peer's buffers directly and name no channel in the plan."""

    channel_type = "memory"

    def put(self, dst_chunk: Chunk, src_chunk: Chunk, tb: int | None = None,
            tb_group: ThreadBlockGroup | None = None, fuse: bool = True) -> None:
        """Writes this rank's ``src_chunk`` to the peer's ``dst_chunk``."""
        self._transfer("put", dst_chunk, src_chunk, tb, tb_group, remote_dst=True, fuse=fuse)

    def get(self, dst_chunk: Chunk, src_chunk: Chunk, tb: int | None = None,
            tb_group: ThreadBlockGroup | None = None) -> None:
        """Reads the peer's ``src_chunk`` into this rank's ``dst_chunk``."""
        self._transfer("get", dst_chunk, src_chunk, tb, tb_group, remote_dst=False, with_ids=True)

    def put_packets(self, dst_chunk: Chunk, src_chunk: Chunk, tb: int | None = None,
                    tb_group: ThreadBlockGroup | None = None, fuse: bool = True) -> None:
        """Writes ``src_chunk`` as LL packets into the peer's scratch chunk ``dst_chunk``."""
        self._transfer("ppkt", dst_chunk, src_chunk, tb, tb_group, remote_dst=True, packet_dst=True, fuse=fuse)

    def read_put_packets(self, dst_chunk: Chunk, src_chunk: Chunk, tb: int | None = None,
                         tb_group: ThreadBlockGroup | None = None, fuse: bool = True) -> None:
        """Forwards the LL packets of this rank's scratch chunk ``src_chunk`` (waiting for
        them) to the peer's scratch chunk ``dst_chunk``."""
        self._transfer("rppkt", dst_chunk, src_chunk, tb, tb_group, remote_dst=True, packet_dst=True,
                       packet_src=True, fuse=fuse)

    def reduce(self, local_src_chunk: Chunk, remote_src_chunks: list[Chunk], tb: int | None = None,
               tb_group: ThreadBlockGroup | None = None, local_dst_chunk: Chunk | None = None,
               reduce_op: Any = ReduceOperationType.sum) -> None:
        """``local_dst_chunk`` (default ``local_src_chunk``) = ``local_src_chunk`` reduced with
        the peer's ``remote_src_chunks``, read through this channel. Adjacent reduces of one
        local chunk (over several peers) fuse into one operation."""
        me, peer = self.src_rank, self.dst_rank
        dst = local_src_chunk if local_dst_chunk is None else local_dst_chunk
        _check_chunk(local_src_chunk, me, "reduce: local_src_chunk")
        _check_chunk(dst, me, "reduce: local_dst_chunk")
        if not remote_src_chunks:
            raise fail("reduce: remote_src_chunks: expected at least one chunk")
        for c in remote_src_chunks:
            _check_chunk(c, peer, "reduce: remote_src_chunks")
        _same_size([local_src_chunk, dst, *remote_src_chunks])
        rop, site = _reduce_op(reduce_op), caller_site()
        for t, g in _blocks(tb, tb_group):
            src = [local_src_chunk._ref()] + [c._remote("memory") for c in remote_src_chunks]
            op = Op("rre", site, src, [dst._ref()], channel_type="memory", reduce_op=rop, tbg=g)
            self.prog.add_op(me, t, op)

    read_reduce = reduce


class PortChannel(_Channel):
    """A channel from ``src_rank`` to ``dst_rank`` whose transfers the host proxy (or the NIC)
    makes."""

    channel_type = "port"

    def signal(self, tb: int, data_sync: SyncType = SyncType.both, relaxed: bool = False) -> None:
        self._sync_op("signal", tb, data_sync)

    def wait(self, tb: int, data_sync: SyncType = SyncType.both, relaxed: bool = False) -> None:
        self._sync_op("wait", tb, data_sync)

    def flush(self, tb: int, data_sync: SyncType = SyncType.both, fuse: bool = True) -> None:
        """Waits until this channel's transfers completed (``fuse=False``: never fused into a
        preceding ``pws``)."""
        self._sync_op("flush", tb, data_sync, fuse)

    def put(self, dst_chunk: Chunk, src_chunk: Chunk, tb: int) -> None:
        """Writes ``src_chunk`` to the peer's ``dst_chunk`` (a following signal on this channel
        fuses into ``pws``, then a flush into ``pwsf``)."""
        self._transfer("put", dst_chunk, src_chunk, tb, None, remote_dst=True, with_ids=True)

    def put_with_signal(self, dst_chunk: Chunk, src_chunk: Chunk, tb: int,
                        data_sync: SyncType = SyncType.none) -> None:
        self._transfer("pws", dst_chunk, src_chunk, tb, None, remote_dst=True, with_ids=True,
                       sync=_sync(data_sync))

    def put_with_signal_and_flush(self, dst_chunk: Chunk, src_chunk: Chunk, tb: int,
                                  data_sync: SyncType = SyncType.none) -> None:
        self._transfer("pwsf", dst_chunk, src_chunk, tb, None, remote_dst=True, with_ids=True,
                       sync=_sync(data_sync))


class SwitchChannel:
    """An NVLS multicast channel over ``rank_list``'s buffers of ``buffer_type``: every listed
    rank gets one (in program order: every rank must create its switch channels alike)."""

    channel_type = "switch"

    def __init__(self, rank_list: list[int], buffer_type: BufferType | str) -> None:
        self.prog = get_program()
        self.site = caller_site()
        self.ranks = [self.prog.check_rank(r) for r in rank_list]
        if len(set(self.ranks)) != len(self.ranks) or len(self.ranks) < 2:
            raise fail(f"SwitchChannel {rank_list}: expected two or more distinct ranks")
        try:
            self.buffer_type = BufferType(buffer_type).value
        except ValueError:
            raise fail(f"buffer_type {buffer_type!r}: expected BufferType.input, output or scratch") from None
        for r in self.ranks:
            self.prog.gpus[r].switches.append(self)

    def _slot(self, rank: int, offset: int, size: int) -> Ref:
        if rank not in self.ranks:
            raise fail(f"rank {rank} is not in this switch channel's ranks {self.ranks}")
        n = self.prog.buffer_chunks(rank, self.buffer_type)
        ints = isinstance(offset, int) and isinstance(size, int)
        if not ints or not (0 <= offset and size >= 1 and offset + size <= n):
            raise fail(f"switch chunk [{offset}:{offset + size}] out of bounds of the bound "
                       f"{BUFFER_NAMES[self.buffer_type]} buffer of {n} chunks")
        return Ref("switch", self.buffer_type, offset, size, switch=self)

    def reduce(self, rank: int, buffer_offset: int, size: int, dst_chunk: Chunk, tb: int,
               reduce_op: Any = ReduceOperationType.sum) -> None:
        """Rank ``rank`` load-reduces every rank's copy of the slot into ``dst_chunk`` (a
        following broadcast of that chunk to the same slot fuses into ``glres``)."""
        if _reduce_op(reduce_op) != "sum":
            raise fail("switch channels reduce with sum only")
        slot = self._slot(rank, buffer_offset, size)
        _check_chunk(dst_chunk, rank, "reduce: dst_chunk")
        _same_size([dst_chunk, Chunk(rank, "s", 0, size)])
        op = Op("glre", caller_site(), [slot], [dst_chunk._ref()], channel_type="switch")
        self.prog.add_op(rank, tb, op)

    def broadcast(self, rank: int, src_chunk: Chunk, buffer_offset: int, size: int, tb: int) -> None:
        """Rank ``rank`` stores ``src_chunk`` into every rank's copy of the slot."""
        slot = self._slot(rank, buffer_offset, size)
        _check_chunk(src_chunk, rank, "broadcast: src_chunk")
        _same_size([src_chunk, Chunk(rank, "s", 0, size)])
        op = Op("gstore", caller_site(), [src_chunk._ref()], [slot], channel_type="switch")
        self.prog.add_op(rank, tb, op)

    def at_rank(self, rank: int) -> _SwitchView:
        return _SwitchView(self, rank)


class _SwitchView:
    def __init__(self, ch: SwitchChannel, rank: int) -> None:
        self.ch, self.rank = ch, rank

    def reduce(self, buffer_offset: int, size: int, dst_chunk: Chunk, tb: int, reduce_op: Any = "sum") -> None:
        self.ch.reduce(self.rank, buffer_offset, size, dst_chunk, tb, reduce_op)

    def broadcast(self, src_chunk: Chunk, buffer_offset: int, size: int, tb: int) -> None:
        self.ch.broadcast(self.rank, src_chunk, buffer_offset, size, tb)


class Semaphore:
    """A device semaphore of ``rank`` (thread blocks of one rank hand work to each other):
    each execution must acquire it as often as it releases it."""

    def __init__(self, rank: int, initial_value: int = 0) -> None:
        self.prog = get_program()
        self.site = caller_site()
        self.rank = self.prog.check_rank(rank)
        self.initial_value = initial_value
        g = self.prog.gpus[rank]
        self.id = len(g.semaphores)
        g.semaphores.append(self)

    def _op(self, name: str, tb: int, data_sync: SyncType) -> None:
        before, after = _sync(data_sync)
        op = Op(name, caller_site(), semaphores=[self.id], before=before, after=after)
        self.prog.add_op(self.rank, tb, op)

    def acquire(self, tb: int, data_sync: SyncType = SyncType.both) -> None:
        """Waits until the semaphore is positive, then decrements it."""
        self._op("sem_acquire", tb, data_sync)

    def release(self, tb: int, data_sync: SyncType = SyncType.both) -> None:
        """Increments the semaphore."""
        self._op("sem_release", tb, data_sync)


class LoopIterationContext:
    """``with LoopIterationContext(unit, num_chunks):`` the operations recorded inside run as a
    ``pipeline``: each thread block steps through its chunks ``unit`` bytes at a time
    (``num_chunks``: the chunks the pipeline covers)."""

    def __init__(self, unit: int, num_chunks: int = 1) -> None:
        self.unit_size, self.num_chunks = unit, num_chunks
        self.site = caller_site()

    def __enter__(self) -> LoopIterationContext:
        prog = get_program()
        if prog.loop is not None:
            raise fail("LoopIterationContext inside another: expected one level")
        prog.loop = self
        return self

    def __exit__(self, *exc: Any) -> None:
        get_program().loop = None


def JSON() -> str:
    """The active program's plan as text (ends it: its checks run now)."""
    prog = get_program()
    prog.check()
    prog.finished = True
    return render(prog.to_json())
