"""The collectives a program implements: how many chunks each rank's input and output buffer
has (``chunk_factor`` chunks per rank's share) and the plan's ``collective`` name."""

from __future__ import annotations

from .program import fail


class Collective:
    """Base: ``num_ranks`` ranks, input and output buffers of ``input_chunks`` and
    ``output_chunks`` chunks, in place or not."""

    name = ""

    def __init__(self, num_ranks: int, input_chunks: int, output_chunks: int, inplace: bool) -> None:
        if not isinstance(num_ranks, int) or num_ranks < 1:
            raise fail(f"num_ranks {num_ranks!r}: expected an int >= 1")
        if input_chunks < 1 or output_chunks < 1:
            raise fail(f"chunk_factor: expected >= 1 (input {input_chunks}, output {output_chunks} chunks)")
        self.num_ranks = num_ranks
        self.input_chunks = input_chunks
        self.output_chunks = output_chunks
        self.inplace = inplace

    def chunks(self, buffer: str) -> int:
        """Chunks of a rank's ``"i"`` or ``"o"`` buffer."""
        return self.input_chunks if buffer == "i" else self.output_chunks


class AllReduce(Collective):
    """Every rank ends with the sum of every rank's input: input and output of
    ``num_ranks * chunk_factor`` chunks."""

    name = "allreduce"

    def __init__(self, num_ranks: int, chunk_factor: int = 1, inplace: bool = True) -> None:
        super().__init__(num_ranks, num_ranks * chunk_factor, num_ranks * chunk_factor, inplace)


class AllGather(Collective):
    """Rank r's input (``chunk_factor`` chunks) lands at chunk ``r * chunk_factor`` of every
    rank's output (``num_ranks * chunk_factor`` chunks). In place, the input is that slice of
    the output: programs then read and write the output buffer only."""

    name = "allgather"

    def __init__(self, num_ranks: int, chunk_factor: int = 1, inplace: bool = True) -> None:
        super().__init__(num_ranks, chunk_factor, num_ranks * chunk_factor, inplace)


class ReduceScatter(Collective):
    """Rank r's output (``chunk_factor`` chunks) is the sum of chunk ``r * chunk_factor`` of
    every rank's input (``num_ranks * chunk_factor`` chunks)."""

    name = "reducescatter"

    def __init__(self, num_ranks: int, chunk_factor: int = 1, inplace: bool = False) -> None:
        super().__init__(num_ranks, num_ranks * chunk_factor, chunk_factor, inplace)


class AllToAll(Collective):
    """Chunk p of rank r's input lands at chunk r of rank p's output (``num_ranks *
    chunk_factor`` chunks each)."""

    name = "alltoall"

    def __init__(self, num_ranks: int, chunk_factor: int = 1, inplace: bool = False) -> None:
        super().__init__(num_ranks, num_ranks * chunk_factor, num_ranks * chunk_factor, inplace)
