"""A DSL plan dropped in the plan directory reaches users: coll_perf (the collectives of
mscclpp, 2 ranks on the host backend) runs the DSL all-reduce, its size range narrowed to
4..64 KiB, for the in-place all-reduces of those sizes and the native algorithms for the
others, with 0 wrong results; the INFO log of the collectives says which ran per size.

Needs coll_perf built (`cargo build -p mp_tests`; MSCCLPP_COLL_PERF names another binary)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from mscclpp.language.examples import collectives as examples

REPO = Path(__file__).resolve().parents[3]
COLL_PERF = Path(os.environ.get("MSCCLPP_COLL_PERF", REPO / "target" / "debug" / "coll_perf"))
LO, HI = 4096, 65536


@pytest.mark.skipif(not COLL_PERF.is_file(), reason=f"{COLL_PERF} is not built (cargo build -p mp_tests)")
def test_coll_perf_takes_a_dsl_plan_of_the_plan_directory_for_its_sizes(tmp_path: Path) -> None:
    prog = examples.allreduce(2, min_message_size=LO, max_message_size=HI)
    (tmp_path / "dsl_allreduce.json").write_text(prog.json())
    env = dict(os.environ)
    env.update(MSCCLPP_CACHE_DIR=str(tmp_path), MSCCLPP_LOG_LEVEL="INFO", MSCCLPP_LOG_SUBSYS="COLL")
    env.pop("MSCCLPP_LOG_FILE", None)
    cmd = [str(COLL_PERF), "--np", "2", "-b", "1K", "-e", "256K", "-f", "4", "-n", "1", "-w", "1", "-c", "1"]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert "# Out of bounds values : 0 OK" in out, out
    runs: dict[tuple[int, int], list[str]] = {}
    for m in re.finditer(r"rank (\d+): allreduce of (\d+) bytes runs (.*)", out):
        runs.setdefault((int(m[1]), int(m[2])), []).append(m[3])
    plan = f"plan `{prog.name}` ({tmp_path / 'dsl_allreduce.json'})"
    for rank in (0, 1):
        for size in (1024, 4096, 16384, 65536, 262144):
            lines = runs.get((rank, size), [])
            if LO <= size <= HI:
                assert plan in lines, f"rank {rank}, {size} bytes: expected the plan; log:\n{out}"
            else:
                # The log names the algorithm when it changes: it does at 1 KiB (first call)
                # and at 256 KiB (after the plan's range).
                why = f"rank {rank}, {size} bytes: expected a native algorithm; log:\n{out}"
                assert lines and plan not in lines, why
