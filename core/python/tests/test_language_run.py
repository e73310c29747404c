"""DSL programs run: each example program of ``mscclpp.language.examples.collectives``
(all-reduce Simple and LL, all-gather, reduce-scatter, all-to-all) compiles to a plan that the
executor runs with exact results on the host backend at 2, 4 and 8 ranks (f32 and i32, two
sizes, two calls each, outputs poisoned first), one rank per process.

This file is also the ranks' worker: ``python test_language_run.py plan RANK NRANKS ADDRESS
PLAN INSTANCES``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import mscclpp
from mscclpp.language.examples import collectives as examples
from ranks import run_ranks

HOST = mscclpp.backend() == "host"
COLLECTIVE = {"allreduce": "allreduce", "allreduce_ll": "allreduce", "allgather": "allgather",
              "reducescatter": "reducescatter", "alltoall": "alltoall"}


@pytest.mark.skipif(
    not HOST, reason="NumPy views of the buffers are the host backend's (GPU: core/python/tests/gpu/dsl_plan_gpu.sh)"
)
@pytest.mark.parametrize("nranks", [2, 4, 8])
@pytest.mark.parametrize("program", sorted(COLLECTIVE))
def test_dsl_program_runs_exactly(program: str, nranks: int, tmp_path: Path) -> None:
    path = tmp_path / f"{program}_n{nranks}.json"
    prog = examples.PROGRAMS[program](nranks)
    path.write_text(prog.json())
    outs = run_ranks("plan", nranks, str(path), "1", worker=Path(__file__), timeout=400.0)
    assert all("ok" in o.splitlines() for o in outs), outs


@pytest.mark.skipif(not HOST, reason="NumPy views of the buffers are the host backend's")
@pytest.mark.parametrize("program", ["allreduce", "alltoall", "allreduce_ll"])
def test_dsl_program_with_instances_runs_exactly(program: str, tmp_path: Path) -> None:
    """instances=2: twice the thread blocks and channels, each instance half of every chunk."""
    path = tmp_path / f"{program}_i2.json"
    path.write_text(examples.PROGRAMS[program](4, instances=2).json())
    run_ranks("plan", 4, str(path), "2", worker=Path(__file__), timeout=400.0)


# ------------------------------------------------------------------------------------------------
# The worker (one rank).


def data(rank: int, count: int, dtype: Any) -> np.ndarray:
    return ((np.arange(count, dtype=np.int64) * 7 + rank * 3) % 11).astype(dtype)


def expected(collective: str, r: int, n: int, m: int, dt: Any) -> np.ndarray:
    """Rank r's output for per-rank share m (elements)."""
    if collective == "allreduce":
        return sum(data(p, n * m, np.int64) for p in range(n)).astype(dt)
    if collective == "allgather":
        return np.concatenate([data(p, m, dt) for p in range(n)])
    if collective == "reducescatter":
        return sum(data(p, n * m, np.int64)[r * m:(r + 1) * m] for p in range(n)).astype(dt)
    return np.concatenate([data(p, n * m, dt)[r * m:(r + 1) * m] for p in range(n)])


def case_plan(g: Any, path: str, instances: str) -> None:
    r, n, k = g.rank, g.nranks, int(instances)
    plan = g.load_plan(path)
    coll = plan.collective
    assert plan.world_size == n, plan
    for dt, name in ((np.float32, "float32"), (np.int32, "int32")):
        for m in (4 * k, 260 * k):  # elements per rank's share: chunks of 16-byte multiples
            send_n = m if coll == "allgather" else n * m
            recv_n = m if coll == "reducescatter" else n * m
            send_buf = mscclpp.RawGpuBuffer(send_n * 4)
            send = np.frombuffer(send_buf, dtype=dt)
            if plan.is_in_place:
                recv_buf, recv = send_buf, send
            else:
                recv_buf = mscclpp.RawGpuBuffer(recv_n * 4)
                recv = np.frombuffer(recv_buf, dtype=dt)
            want = expected(coll, r, n, m, dt)
            for it in range(2):
                if recv is not send:
                    recv[:] = -1
                send[:] = data(r, send_n, dt)
                g.execute(plan, send_buf, recv_buf, dtype=name)
                got = recv.copy()
                if not np.array_equal(got, want):
                    bad = np.flatnonzero(got != want)
                    raise AssertionError(
                        f"{plan.name} {name} share {m} call {it}: {len(bad)} of {want.size} elements differ; "
                        f"first at {bad[0]}: got {got[bad[0]]}, expected {want[bad[0]]}"
                    )
    g.barrier()
    print("ok")


def main() -> None:
    case, rank, nranks, addr, *rest = sys.argv[1:]
    g = mscclpp.CommGroup(int(rank), int(nranks), addr, host_timeout=120.0)
    globals()[f"case_{case}"](g, *rest)


if __name__ == "__main__":
    main()
