"""The collectives, bootstrap, UniqueId and executor on the host backend, several ranks as
processes over 127.0.0.1 (worker.py), every result checked exactly against NumPy."""

from __future__ import annotations

from pathlib import Path

import pytest

import mscclpp
from ranks import run_ranks

pytestmark = pytest.mark.skipif(mscclpp.backend() != "host", reason="NumPy buffers are the host backend's (GPU builds: test_gpu.py)")

PLANS = Path(__file__).resolve().parents[2] / "plans"


@pytest.mark.parametrize("nranks", [2, 4])
@pytest.mark.parametrize("collective", ["allreduce", "allgather", "reducescatter", "broadcast"])
def test_collective_matrix(collective: str, nranks: int) -> None:
    """Every data type (f32, f16, i32, f64, i8, i64), op (sum, max, min), in and out of place,
    four sizes."""
    run_ranks(collective, nranks)


@pytest.mark.parametrize("nranks", [2, 4])
def test_every_algorithm_forced(nranks: int) -> None:
    run_ranks("algorithms", nranks)


def test_bootstrap_messages() -> None:
    run_ranks("bootstrap", 3)


def test_unique_id_group(tmp_path: Path) -> None:
    run_ranks("uniqueid", 2, str(tmp_path / "uid"))


@pytest.mark.parametrize("nranks", [2, 4])
def test_registered_buffers(nranks: int) -> None:
    """register_buffer makes calls on registered buffers zero-copy (exact); deregister undoes it."""
    run_ranks("registered", nranks)


@pytest.mark.parametrize("plan", ["allreduce_ll_n2.json", "allreduce_simple_n2.json"])
def test_executor_plan(plan: str) -> None:
    run_ranks("executor", 2, str(PLANS / plan))


@pytest.mark.parametrize("nranks", [2, 4])
@pytest.mark.parametrize("pattern", ["ring", "pairwise", "unequal"])
def test_send_recv(pattern: str, nranks: int) -> None:
    """send/recv in batches (``with g.group()``, P2pBatch, single calls), every result exact."""
    run_ranks(f"p2p_{pattern}", nranks)


def test_send_recv_size_mismatch() -> None:
    run_ranks("p2p_mismatch", 2, timeout=120.0)


@pytest.mark.parametrize("nranks", [2, 4])
def test_channels(nranks: int) -> None:
    """Connections, registered memory, semaphores, memory and port channels between every
    pair: data moved through each checked exactly, device handles checked against the C layout."""
    run_ranks("channels", nranks)
