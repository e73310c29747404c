"""The package's surface in this process: names, version, headers, UniqueId, RawGpuBuffer,
and every argument error of the collectives (a one-rank group: the checks come before any
traffic, alike on every rank)."""

from __future__ import annotations

import os
import pickle
from typing import Any, Iterator

import numpy as np
import pytest

import mscclpp
from ranks import free_port

HOST = mscclpp.backend() == "host"


def test_names_and_version() -> None:
    assert mscclpp.version == mscclpp.__version__
    assert mscclpp.__version__.count(".") == 2
    assert mscclpp.backend() in ("host", "cuda", "rocm")
    assert issubclass(mscclpp.MscclppError, RuntimeError)
    for name in mscclpp.__all__:
        obj = getattr(mscclpp, name)
        if callable(obj) or isinstance(obj, type):
            assert obj.__doc__, f"mscclpp.{name} has no docstring"


def test_get_include_has_the_device_headers() -> None:
    inc = mscclpp.get_include()
    for h in ("device.hpp", "memory_channel_device.hpp", "port_channel_device.hpp"):
        assert os.path.isfile(os.path.join(inc, "mscclpp", h)), h


def test_typing_stub_shipped() -> None:
    here = os.path.dirname(mscclpp.__file__)
    assert os.path.isfile(os.path.join(here, "py.typed"))
    assert os.path.isfile(os.path.join(here, "_mscclpp.pyi"))


def test_unique_id_round_trip() -> None:
    uid = mscclpp.UniqueId.create()
    b = bytes(uid)
    assert len(b) == 128 and uid.to_bytes() == b
    assert mscclpp.UniqueId.from_bytes(b) == uid
    assert hash(mscclpp.UniqueId.from_bytes(b)) == hash(uid)
    assert pickle.loads(pickle.dumps(uid)) == uid
    assert ":" in uid.root_address
    with pytest.raises(mscclpp.MscclppError) as e:
        mscclpp.UniqueId.from_bytes(b[:100])
    assert e.value.code == "InvalidUsage"
    broken = bytearray(b)
    broken[0] ^= 0xFF
    with pytest.raises(mscclpp.MscclppError):
        mscclpp.UniqueId.from_bytes(bytes(broken))


def test_bootstrap_arguments() -> None:
    with pytest.raises(mscclpp.MscclppError, match="rank < nranks"):
        mscclpp.TcpBootstrap(2, 2)
    b = mscclpp.TcpBootstrap.create(0, 1)
    with pytest.raises(mscclpp.MscclppError, match="not initialized"):
        b.barrier()
    with pytest.raises(mscclpp.MscclppError, match="not initialized"):
        mscclpp.Communicator(b)
    with pytest.raises(TypeError, match="UniqueId"):
        b.initialize(3.5)
    with pytest.raises(mscclpp.MscclppError, match="timeout"):
        b.initialize("127.0.0.1:1", timeout=0)


@pytest.mark.skipif(not HOST, reason="host-backend buffer protocol")
def test_raw_gpu_buffer_host() -> None:
    buf = mscclpp.RawGpuBuffer(4096)
    assert buf.nbytes == len(buf) == buf.bytes() == 4096 and buf.ptr == buf.data() != 0
    assert buf.device == -1
    a = np.frombuffer(buf, dtype=np.float32)
    assert a.size == 1024 and a.flags.writeable and not a.any()
    a[:] = np.arange(1024)
    assert np.array_equal(np.frombuffer(buf.read(0, 4096), np.float32), a)
    buf.write(np.full(4, 7, np.float32).tobytes(), 8)
    assert list(a[2:6]) == [7, 7, 7, 7]
    with pytest.raises(mscclpp.MscclppError):
        buf.write(b"x" * 10, 4090)
    with pytest.raises(mscclpp.MscclppError, match="size above 0"):
        mscclpp.RawGpuBuffer(0)


@pytest.fixture(scope="module")
def g1() -> Iterator[mscclpp.CommGroup]:
    if not HOST:
        pytest.skip("NumPy buffers are the host backend's (GPU builds: test_gpu.py)")
    g = mscclpp.CommGroup(0, 1, f"127.0.0.1:{free_port()}")
    yield g
    g.barrier()


def test_one_rank_group(g1: mscclpp.CommGroup) -> None:
    assert (g1.rank, g1.my_rank, g1.nranks, g1.nranks_per_node) == (0, 0, 1, 1)
    x = np.arange(10, dtype=np.float32)
    y = np.zeros(10, np.float32)
    g1.all_reduce(x, y)
    assert np.array_equal(x, y)
    g1.all_gather(x, y)
    assert np.array_equal(x, y)
    assert "CommGroup(rank=0" in repr(g1)
    # send/recv to this rank itself: a copy, matched in call order inside one group.
    z = np.zeros(10, np.float32)
    with g1.group() as batch:
        g1.send(x, 0)
        g1.recv(z, 0)
        assert len(batch) == 2
    assert np.array_equal(x, z)
    assert g1.p2p.reaches(0) and not g1.p2p.reaches(1) and g1.p2p.device == -1
    g1.p2p.check()


def errors() -> list[tuple[str, Any, str]]:
    f32 = np.zeros(16, np.float32)
    return [
        ("dtype mismatch", lambda g: g.all_reduce(f32, np.zeros(16, np.float16)), "all_reduce: send is float32 but recv is float16"),
        ("non-contiguous send", lambda g: g.all_reduce(np.zeros(32, np.float32)[::2]), "not contiguous"),
        ("non-contiguous recv", lambda g: g.all_reduce(f32, np.zeros((4, 8), np.float32)[:, :4]), "not contiguous"),
        ("too small output", lambda g: g.all_reduce(f32, np.zeros(8, np.float32)), "expected at least"),
        ("too small all_gather output", lambda g: g.all_gather(f32, np.zeros(8, np.float32)), "expected at least"),
        ("read-only output", lambda g: g.all_reduce(f32, readonly(np.zeros(16, np.float32))), "read-only"),
        ("read-only in place", lambda g: g.all_reduce(readonly(np.zeros(16, np.float32))), "read-only"),
        ("bytes in place", lambda g: g.broadcast(b"0123", dtype="uint8"), "read-only"),
        ("unsupported element type", lambda g: g.all_reduce(np.zeros(16, np.int16)), "no element type: pass dtype="),
        ("bad dtype name", lambda g: g.all_reduce(f32, dtype="float17"), "expected one of"),
        ("size not a multiple of dtype", lambda g: g.all_reduce(np.zeros(3, np.uint8), dtype="float32"), "not a whole number"),
        ("bad op", lambda g: g.all_reduce(f32, op="median"), "median"),
        ("bad algorithm", lambda g: g.all_reduce(f32, algorithm="no_such_algo"), "all_reduce: invalid usage: allreduce algorithm `no_such_algo`: expected one of"),
        ("bad collective name", lambda g: g.collectives.algorithm_names("gather"), "expected one of"),
        ("broadcast root", lambda g: g.broadcast(f32, root=5), "root 5"),
        ("send to a rank out of range", lambda g: g.send(f32, 1), "peer 1: expected a rank in 0..1"),
        ("recv into read-only memory", lambda g: g.recv(readonly(np.zeros(16, np.float32)), 0), "read-only"),
        ("bad point-to-point kind", lambda g: g.p2p.run([("put", 0, f32)]), "expected \"send\" or \"recv\""),
        ("unmatched send to self", lambda g: g.send(f32, 0), "sends to this rank itself but 0 receives"),
        ("self send/recv sizes differ", lambda g: p2p_pair(g, f32, np.zeros(8, np.float32)), "sends 64 bytes but the matching"),
        ("plan for another world size", lambda g: g.execute(plan1(), f32, f32), "written for 2 ranks, but the communicator has 1"),
    ]


def p2p_pair(g: mscclpp.CommGroup, send: Any, recv: Any) -> None:
    with g.group():
        g.send(send, 0)
        g.recv(recv, 0)


def readonly(a: np.ndarray) -> np.ndarray:
    a.flags.writeable = False
    return a


def plan1() -> mscclpp.ExecutionPlan:
    here = os.path.dirname(os.path.abspath(__file__))
    return mscclpp.ExecutionPlan(os.path.join(here, "..", "..", "plans", "allreduce_ll_n2.json"), 0)


@pytest.mark.parametrize("name,call,message", errors(), ids=[e[0] for e in errors()])
def test_argument_errors(g1: mscclpp.CommGroup, name: str, call: Any, message: str) -> None:
    with pytest.raises(mscclpp.MscclppError) as e:
        call(g1)
    assert message in str(e.value), f"{name}: {e.value}"
    assert e.value.code in ("InvalidUsage", "ExecutorError"), e.value.code


def test_low_level_argument_errors(g1: mscclpp.CommGroup) -> None:
    comm = g1.communicator
    buf = mscclpp.RawGpuBuffer(64)
    with pytest.raises(mscclpp.MscclppError, match="transport \"nvlink\": expected one of"):
        comm.register_memory(buf, "nvlink")
    with pytest.raises(mscclpp.MscclppError, match="expected a transport name or a list"):
        comm.register_memory(buf, 5)
    with pytest.raises(mscclpp.MscclppError, match="transport"):
        comm.connect(0, transport="pcie")
    with pytest.raises(mscclpp.MscclppError):
        comm.register_memory(np.zeros(16, np.float32))  # not memory this library allocated
    with pytest.raises(mscclpp.MscclppError):
        mscclpp.RegisteredMemory.deserialize(b"not a registration")
    mem = comm.register_memory(buf, ["cudaipc", "ethernet"])
    assert sorted(mem.transports) == ["CudaIpc", "Ethernet"] and mem.size == 64
    back = mscclpp.RegisteredMemory.deserialize(mem.serialize())
    assert back.size == 64 and back.original_data_ptr == buf.ptr


def test_not_a_buffer(g1: mscclpp.CommGroup) -> None:
    with pytest.raises(TypeError, match="expected a NumPy array"):
        g1.all_reduce("not a buffer")
    with pytest.raises(TypeError):
        g1.all_reduce([1.0, 2.0])
    with pytest.raises(TypeError, match="tuple"):
        g1.p2p.run([("send", 0)])


def test_plan_file_errors() -> None:
    with pytest.raises(mscclpp.MscclppError):
        mscclpp.ExecutionPlan("/nonexistent/plan.json", 0)
    p = plan1()
    assert (p.world_size, p.rank, p.collective) == (2, 0, "allreduce")
    assert p.protocol in ("LL", "Simple") and p.max_message_size >= p.min_message_size


def test_stub_matches_the_module() -> None:
    """mypy's stubtest: _mscclpp.pyi names every class, function and argument as built;
    mypy --strict on the package."""
    pytest.importorskip("mypy", reason="mypy is not installed")
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-m", "mypy.stubtest", "mscclpp._mscclpp"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    # The package's own Python type-checks strictly against the stub (torch may be absent).
    p = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--ignore-missing-imports", "-p", "mscclpp"],
        capture_output=True, text=True, timeout=300,
    )
    assert p.returncode == 0, p.stdout + p.stderr


@pytest.mark.skipif(HOST or mscclpp.device_count() > 0, reason="needs a GPU build on a machine without a usable GPU")
def test_gpu_build_without_gpu_raises() -> None:
    """A CUDA build where the driver or the GPU is missing: MscclppError, no panic."""
    with pytest.raises(mscclpp.MscclppError, match="no GPU|driver is not usable"):
        mscclpp.RawGpuBuffer(16)
    with pytest.raises(mscclpp.MscclppError, match="no GPU|driver is not usable"):
        mscclpp.CommGroup(0, 1, f"127.0.0.1:{free_port()}")


@pytest.mark.parametrize(
    "dtype,name",
    [("bfloat16", "bfloat16"), ("f8e4m3", "float8_e4m3"), ("uint64", "uint64"), ("int8", "int8"), ("half", "float16")],
)
def test_messages_name_numpy_dtypes(g1: mscclpp.CommGroup, dtype: str, name: str) -> None:
    """A BufferRef of another element type than the NumPy output: both named as NumPy does."""
    x = np.zeros(64, np.float32)
    ref = mscclpp.BufferRef(x.ctypes.data, x.nbytes, dtype, owner=x, kind="test")
    with pytest.raises(mscclpp.MscclppError, match=f"send is {name} but recv is float32"):
        g1.all_reduce(ref, np.zeros(64, np.float32))


@pytest.mark.skipif(not HOST, reason="NumPy buffers are the host backend's (GPU builds: test_gpu.py)")
def test_explicit_objects_one_rank() -> None:
    """TcpBootstrap -> Communicator -> Collectives and Executor by hand (what CommGroup does)."""
    uid = mscclpp.TcpBootstrap.create_unique_id()
    b = mscclpp.TcpBootstrap(0, 1)
    b.initialize(uid, timeout=10)
    assert (b.rank, b.nranks, b.nranks_per_node) == (0, 1, 1)
    with pytest.raises(mscclpp.MscclppError, match="initialize called twice"):
        b.initialize(uid)
    comm = mscclpp.Communicator(b)
    assert comm.bootstrap is b and (comm.rank, comm.nranks) == (0, 1)
    coll = mscclpp.Collectives(comm, ll_half_bytes=1 << 20, plain_bytes=1 << 20, plans=False)
    assert (coll.rank, coll.nranks, coll.device) == (0, 1, -1)
    assert "copy" in coll.algorithm_names("allgather")
    x = np.arange(8, dtype=np.int64)
    y = np.zeros(8, np.int64)
    coll.broadcast(x, y, root=0)
    assert np.array_equal(x, y)
    coll.reduce_scatter(x, y, op="max")
    assert np.array_equal(x, y)
    assert mscclpp.Executor(comm, timeout=5, host_threads_per_block=2) is not None
    with pytest.raises(mscclpp.MscclppError, match="host_threads_per_block"):
        mscclpp.Executor(comm, host_threads_per_block=0)
    assert mscclpp.Executor(comm, port_channels="proxy") is not None
    with pytest.raises(mscclpp.MscclppError, match='port_channels "dma": expected "auto" or "proxy"'):
        mscclpp.Executor(comm, port_channels="dma")
    b.barrier()
