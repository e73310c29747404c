"""DLPack both ways on the host backend: RawGpuBuffer exported to NumPy (``__dlpack__``,
``__dlpack_device__``, ``to_dlpack``; the export keeps the allocation alive), and the
collectives and send/recv taking objects that only speak DLPack (a producer that is not
NumPy and has no buffer protocol), with their errors."""

from __future__ import annotations

import gc
from typing import Any, Iterator

import numpy as np
import pytest

import mscclpp
from ranks import free_port, run_ranks
from worker import DlpackOnly as Producer

HOST = mscclpp.backend() == "host"
pytestmark = pytest.mark.skipif(not HOST, reason="NumPy buffers are the host backend's (GPU builds: test_gpu.py)")


class Capsule:
    """A legacy producer: __dlpack__ takes no arguments and returns ``to_dlpack()``'s capsule."""

    def __init__(self, buf: mscclpp.RawGpuBuffer) -> None:
        self.buf = buf

    def __dlpack__(self) -> Any:
        return self.buf.to_dlpack()


def test_raw_gpu_buffer_exports_dlpack() -> None:
    buf = mscclpp.RawGpuBuffer(4096)
    assert buf.__dlpack_device__() == (1, 0)
    a = np.from_dlpack(buf)
    assert a.dtype == np.uint8 and a.shape == (4096,) and a.ctypes.data == buf.ptr
    a[:8] = np.arange(8, dtype=np.uint8)
    assert buf.read(0, 8) == bytes(range(8))
    # The export keeps the allocation alive after the buffer object is gone.
    ptr = buf.ptr
    del buf
    gc.collect()
    f = a.view(np.float32)
    f[:] = 3.5
    assert a.ctypes.data == ptr and float(f.sum()) == 3.5 * 1024
    # A versioned capsule when asked for one, the legacy one otherwise.
    b2 = mscclpp.RawGpuBuffer(64)
    assert "dltensor_versioned" in repr(b2.__dlpack__(max_version=(1, 0)))
    assert "dltensor" in repr(b2.__dlpack__()) and "versioned" not in repr(b2.__dlpack__())
    with pytest.raises(BufferError, match="zero-copy"):
        b2.__dlpack__(copy=True)
    with pytest.raises(BufferError, match="cross-device"):
        b2.__dlpack__(dl_device=(2, 0))


def test_to_dlpack_capsule_keeps_buffer_alive() -> None:
    buf = mscclpp.RawGpuBuffer(256)
    buf.write(b"\x07" * 256)
    holder = Capsule(buf)
    del buf
    gc.collect()
    a = np.from_dlpack(holder)
    holder.buf = None  # type: ignore[assignment]
    gc.collect()
    assert a.size == 256 and int(a.sum()) == 7 * 256
    # An unconsumed capsule frees its reference when collected (no leak, no crash).
    cap = mscclpp.RawGpuBuffer(16).to_dlpack()
    del cap
    gc.collect()


def test_gpu_buffer_is_a_numpy_array_of_library_memory(g1: mscclpp.CommGroup) -> None:
    a = mscclpp.GpuBuffer((4, 8), dtype="int32")
    assert isinstance(a, np.ndarray) and a.shape == (4, 8) and a.dtype == np.int32 and not a.any()
    a[:] = 5
    # Library memory: it registers (foreign NumPy memory does not), and the collectives take it.
    mem = g1.communicator.register_memory(a)
    assert mem.size == 128 and mem.data == a.ctypes.data
    out = mscclpp.GpuBuffer(32, np.int32)
    g1.all_reduce(a.reshape(-1), out)
    assert int(out.sum()) == 5 * 32


@pytest.fixture(scope="module")
def g1() -> Iterator[mscclpp.CommGroup]:
    g = mscclpp.CommGroup(0, 1, f"127.0.0.1:{free_port()}")
    yield g
    g.barrier()


def test_dlpack_producers_in_collectives(g1: mscclpp.CommGroup) -> None:
    x = np.arange(16, dtype=np.float32)
    y = np.zeros(16, np.float32)
    g1.all_reduce(Producer(x), Producer(y))
    assert np.array_equal(x, y)
    g1.all_gather(Producer(x), Producer(y))
    assert np.array_equal(x, y)
    # A DLPack capsule itself (consumed by the call).
    z = np.zeros(16, np.float32)
    g1.all_reduce(x.__dlpack__(), z)
    assert np.array_equal(x, z)
    # A RawGpuBuffer's own export, and a legacy capsule producer.
    buf = mscclpp.RawGpuBuffer(64)
    np.from_dlpack(buf).view(np.float32)[:] = 2.0
    z = np.zeros(16, np.float32)
    g1.broadcast(Capsule(buf), z, dtype="float32")
    assert np.array_equal(z, np.full(16, 2.0, np.float32))


def test_dlpack_producer_errors(g1: mscclpp.CommGroup) -> None:
    f32 = np.zeros(16, np.float32)
    with pytest.raises(mscclpp.MscclppError, match="not contiguous"):
        g1.all_reduce(Producer(np.zeros(32, np.float32)[::2]))
    ro = np.zeros(16, np.float32)
    ro.flags.writeable = False
    with pytest.raises(mscclpp.MscclppError, match="read-only"):
        g1.all_reduce(f32, Producer(ro))
    with pytest.raises(mscclpp.MscclppError, match="no element type"):
        g1.all_reduce(Producer(np.zeros(16, np.int16)))
    with pytest.raises(mscclpp.MscclppError, match="send is float32 but recv is float64"):
        g1.all_reduce(Producer(f32), Producer(np.zeros(16, np.float64)))


def test_send_recv_through_dlpack() -> None:
    run_ranks("p2p_dlpack", 2)
