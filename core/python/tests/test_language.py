"""``mscclpp.language``: programs lower to plans our executor loads and validates for every
rank; the shipped plans (core/plans) are what their DSL programs produce; fusion and instances
shape the plan as documented; malformed programs fail with a DslError naming their line."""

from __future__ import annotations

import json
import runpy
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

import mscclpp
from mscclpp.language import DslError
from mscclpp.language.examples import collectives as examples
from mscclpp.language.examples import plans as shipped

REPO = Path(__file__).resolve().parents[3]
PLANS = REPO / "core" / "plans"


def test_shipped_plans_are_what_the_dsl_programs_produce() -> None:
    assert shipped.stale(str(PLANS)) == [], "regenerate: python3 core/plans/plans.py"
    assert sorted(p.name for p in PLANS.glob("*.json")) == sorted(shipped.all_plans())


def test_the_dsl_runs_without_the_native_module() -> None:
    """core/plans/plans.py loads mscclpp.language from the sources without the package's
    native module (as CI's plain python3 does): the check and an example plan."""
    script = str(PLANS / "plans.py")
    r = subprocess.run([sys.executable, script, "--check"], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    r = subprocess.run([sys.executable, script, "example", "alltoall", "4", "--instances", "2"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "mscclpp._mscclpp" not in r.stderr
    assert examples.alltoall(4, instances=2).json() == r.stdout


@pytest.mark.parametrize("nranks", [2, 4, 8])
@pytest.mark.parametrize("program", sorted(examples.PROGRAMS))
def test_example_plans_load_and_validate(program: str, nranks: int, tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    path.write_text(examples.PROGRAMS[program](nranks).json())
    for rank in range(nranks):
        plan = mscclpp.ExecutionPlan(str(path), rank)
        assert (plan.world_size, plan.rank, plan.name) == (nranks, rank, f"dsl_{program}_n{nranks}")


def ops(plan: dict[str, Any], rank: int, tb: int) -> list[str]:
    return [o["name"] for o in plan["gpus"][rank]["threadblocks"][tb]["ops"]]


def test_fusion_builds_the_combined_operations() -> None:
    from mscclpp.language import AllReduce, CollectiveProgram, MemoryChannel, PortChannel, Rank, SyncType

    def build(fusion: bool) -> dict[str, Any]:
        with CollectiveProgram("f", AllReduce(2, 1, True), 2, instr_fusion=fusion, auto_sync=False) as prog:
            for r in (0, 1):
                p = 1 - r
                mine, theirs = Rank(r).get_input_buffer(), Rank(p).get_input_buffer()
                mc, pc = MemoryChannel(p, r), PortChannel(p, r)
                mc.reduce(mine[r], [theirs[r]], tb=0)
                mc.put(theirs[r], mine[r], tb=0)
                pc.put(theirs[p], mine[p], tb=1)
                pc.signal(1, SyncType.none)
                pc.flush(1, SyncType.none)
                pc.wait(1, SyncType.none)
                mc.signal(0, SyncType.none)
                mc.wait(0, SyncType.after)
        return prog.to_json()

    fused, plain = build(True), build(False)
    assert ops(fused, 0, 0) == ["rres", "signal", "wait", "nop"]
    assert ops(fused, 0, 1) == ["pwsf", "wait"]
    assert ops(plain, 0, 0) == ["rre", "put", "signal", "wait", "nop"]
    assert ops(plain, 0, 1) == ["put", "signal", "flush", "wait"]
    rres = fused["gpus"][0]["threadblocks"][0]["ops"][0]
    assert rres["dst_buff"] == [{"type": "i", "index": 0, "size": 1}, {"buffer_id": 0, "index": 0, "size": 1}]


def test_instances_replicate_blocks_channels_and_chunks() -> None:
    one, two = examples.allgather(2).to_json(), examples.allgather(2, instances=2).to_json()
    g1, g2 = one["gpus"][1], two["gpus"][1]
    assert (g2["input_chunks"], g2["output_chunks"]) == (2 * g1["input_chunks"], 2 * g1["output_chunks"])
    assert len(g2["threadblocks"]) == 2 * len(g1["threadblocks"])
    assert g2["channels"][0]["connected_to"] == [0, 0]
    # Instance 1 of block 0 uses the second channel and the second half of every chunk.
    tb = g2["threadblocks"][1]
    assert tb["channels"] == [{"channel_type": "memory", "channel_ids": [1]}]
    put = next(o for o in tb["ops"] if o["name"] == "put")
    assert put["src_buff"] == [{"type": "i", "index": 1, "size": 1}]
    assert put["dst_buff"][0]["index"] == 3  # chunk 1 of 2 -> chunks 2..4, instance 1 at 3


def test_json_inside_the_program_block() -> None:
    from mscclpp.language import JSON, AllGather, CollectiveProgram, MemoryChannel, Rank, SyncType

    with CollectiveProgram("j", AllGather(2, 1, True), 2):
        for r in (0, 1):
            ch = MemoryChannel(1 - r, r)
            ch.put(Rank(1 - r).get_output_buffer()[r], Rank(r).get_output_buffer()[r], tb=0)
            ch.signal(0, SyncType.before)
            ch.wait(0, SyncType.after)
        text = JSON()
    assert '"collective": "allgather"' in text and '{"name":"put"' in text


UPSTREAM_STYLE = """
from mscclpp.language.channel import *
from mscclpp.language.rank import *
from mscclpp.language.general import *
from mscclpp.language.program import *
from mscclpp.language.collectives import *
from mscclpp.language.loop import *

n = 4
with CollectiveProgram("upstream_style", AllGather(n, 1, True), n, 1, "Simple", True, True,
                       num_threads_per_block=512, min_message_size=0, max_message_size=2**64 - 1):
    chans = {(p, r): MemoryChannel(p, r) for r in range(n) for p in range(n) if p != r}
    for r in range(n):
        out = Rank(r).get_output_buffer()
        for p in range(n):
            if p != r:
                tb = p if p < r else p - 1
                chans[p, r].signal(tb, relaxed=True)
                chans[p, r].wait(tb, data_sync=SyncType.after, relaxed=True)
                with LoopIterationContext(1 << 16, 1):
                    chans[p, r].put(Rank(p).get_output_buffer()[r : r + 1], out[r : r + 1], tb)
                chans[p, r].signal(tb, data_sync=SyncType.before)
                chans[p, r].wait(tb)
    PLAN = JSON()
"""


def test_upstream_module_layout_and_arguments(tmp_path: Path) -> None:
    """A program written against upstream's modules and positional arguments compiles (with
    auto_sync's nops between operations) and validates for every rank."""
    ns = runpy.run_path(str(_write(tmp_path / "up.py", UPSTREAM_STYLE)))
    plan = json.loads(ns["PLAN"])
    want = ["rlxsignal", "nop", "rlxwait", "nop", "pipeline", "nop", "signal", "nop", "wait", "nop"]
    assert ops(plan, 0, 0) == want
    path = _write(tmp_path / "up.json", ns["PLAN"])
    for rank in range(4):
        assert mscclpp.ExecutionPlan(str(path), rank).name == "upstream_style"


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


BAD = {
    "unknown rank": (
        """
        with CollectiveProgram("bad", AllReduce(2, 1, True), 2):
            Rank(0)
            Rank(2)  # <- error
        """,
        "rank 2: expected a rank in 0..1",
    ),
    "chunk out of bounds": (
        """
        with CollectiveProgram("bad", AllReduce(2, 1, True), 2):
            buf = Rank(0).get_input_buffer()
            ok = buf[0:2]
            c = buf[1:3]  # <- error
        """,
        "chunk [1:3] out of bounds of rank 0's input buffer of 2 chunks",
    ),
    "channel to itself": (
        """
        with CollectiveProgram("bad", AllReduce(2, 1, True), 2):
            ch = MemoryChannel(1, 1)  # <- error
        """,
        "a channel to itself",
    ),
    "chunk of the wrong rank": (
        """
        with CollectiveProgram("bad", AllReduce(4, 1, True), 4):
            ch = MemoryChannel(1, 0)
            ch.put(Rank(2).get_input_buffer()[0], Rank(0).get_input_buffer()[0], tb=0)  # <- error
        """,
        "put: dst_chunk: expected a chunk of rank 1",
    ),
    "unmatched signal": (
        """
        with CollectiveProgram("bad", AllReduce(2, 1, True), 2):
            a, b = MemoryChannel(1, 0), MemoryChannel(0, 1)
            a.signal(0)
            b.wait(0)
            a.signal(0)  # <- error
        """,
        "unmatched signal/wait: rank 0 signals rank 1 2 time(s)",
    ),
    "wait without a channel back": (
        """
        with CollectiveProgram("bad", AllReduce(2, 1, True), 2):
            MemoryChannel(0, 1).wait(tb=3)  # <- error
        """,
        "rank 0 signals rank 1 0 time(s) (it uses 0 memory channel(s) to rank 1, no #0)",
    ),
    "no thread block": (
        """
        with CollectiveProgram("bad", AllReduce(2, 1, True), 2):
            Rank(0).copy(Rank(0).get_output_buffer()[0], Rank(0).get_input_buffer()[0])  # <- error
        """,
        "expected exactly one of tb=",
    ),
    "packets outside scratch": (
        """
        with CollectiveProgram("bad", AllReduce(2, 1, True), 2, protocol="LL"):
            MemoryChannel(1, 0).put_packets(Rank(1).get_input_buffer()[0], Rank(0).get_input_buffer()[0], tb=0)  # <- error
        """,
        "packets live in scratch",
    ),
    "unbalanced semaphore": (
        """
        with CollectiveProgram("bad", AllReduce(2, 1, True), 2):
            s = Semaphore(0, 0)
            s.release(1)  # <- error
        """,
        "semaphore 0 of rank 0 is acquired 0 time(s) and released 1",
    ),
    "outside a program": (
        """
        Rank(0)  # <- error
        """,
        "no CollectiveProgram is active",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_malformed_program_names_its_line(case: str, tmp_path: Path) -> None:
    body, message = BAD[case]
    src = "from mscclpp.language import *\n" + textwrap.dedent(body)
    line = next(i for i, l in enumerate(src.splitlines(), 1) if "# <- error" in l)
    path = tmp_path / "prog.py"
    path.write_text(src)
    with pytest.raises(DslError) as e:
        runpy.run_path(str(path))
    assert str(e.value).startswith(f"{path}:{line}: "), str(e.value)
    assert message in str(e.value), str(e.value)


def test_malformed_program_traceback_from_the_command_line(tmp_path: Path) -> None:
    """Run as a script, the error's first words are the program's file and line."""
    path = tmp_path / "prog.py"
    path.write_text("from mscclpp.language import *\nwith CollectiveProgram('x', AllGather(2), 2):\n    Rank(7)\n")
    r = subprocess.run([sys.executable, str(path)], capture_output=True, text=True)
    assert r.returncode != 0
    assert f"DslError: {path}:3: rank 7: expected a rank in 0..1" in r.stderr, r.stderr


def test_install_plans(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "mscclpp", "install-plans", "--dir", str(tmp_path)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    got = sorted(p.name for p in (tmp_path / "default").glob("*.json"))
    assert got == sorted(shipped.bundled()), got
    for name in got:
        assert (tmp_path / "default" / name).read_text() == (PLANS / name).read_text()
    h = subprocess.run([sys.executable, "-m", "mscclpp", "--help"], capture_output=True, text=True)
    assert h.returncode == 0 and "install-plans" in h.stdout, h
