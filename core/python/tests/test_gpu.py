"""torch tensors (and CuPy arrays, RawGpuBuffers) through the collectives and the executor:
on GPUs with a CUDA build, where the lead runs them; torch CPU tensors on the host backend.
Skipped, with the reason, where torch (or a GPU) is missing.

GPU ranks: ``MSCCLPP_PY_GPU_RANKS`` (default 2) processes on GPU ``rank % device_count``;
several ranks on one GPU need MPS (nvidia-cuda-mps-control -d), as .ci/gpu-check runs them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import mscclpp
from ranks import HERE, free_port, run_ranks

torch = pytest.importorskip("torch", reason="torch is not installed")

CUDA_BUILD = mscclpp.backend() == "cuda"
HAVE_GPU = CUDA_BUILD and mscclpp.device_count() > 0 and torch.cuda.is_available()
NRANKS = int(os.environ.get("MSCCLPP_PY_GPU_RANKS", "2"))
PLANS = HERE.parents[1] / "plans"

gpu_only = pytest.mark.skipif(not HAVE_GPU, reason="needs a CUDA build of mscclpp and a GPU" if CUDA_BUILD else "mscclpp was built for the host backend (no CUDA)")
usable = pytest.mark.skipif(CUDA_BUILD and not HAVE_GPU, reason="CUDA build without a usable GPU")


def run(case: str, *args: str, nranks: int = NRANKS) -> None:
    run_ranks(case, nranks, *args, worker=HERE / "gpu_worker.py", timeout=480.0)


# Cases of gpu_worker.py: every collective (f32/f16/bf16, sum/max, in and out of place, 4
# sizes); every all-reduce algorithm forced; mscclpp.torch.empty (peer-mappable) tensors.
@usable
@pytest.mark.parametrize("case", ["collectives", "algorithms", "library_memory", "p2p", "dlpack"])
def test_torch_tensors(case: str) -> None:
    run(case)


@gpu_only
def test_cuda_graph_capture_and_replay() -> None:
    run("graph")


@gpu_only
def test_channel_put_from_runtime_compiled_kernel() -> None:
    pytest.importorskip("cupy", reason="cupy is not installed")
    if shutil.which("nvcc") is None and not os.environ.get("CUPY_NVCC_PATH"):
        pytest.skip("nvcc is not on PATH (CuPy's nvcc backend compiles the kernel)")
    run("channel_put")


@gpu_only
def test_cupy_arrays() -> None:
    pytest.importorskip("cupy", reason="cupy is not installed")
    run("cupy")


@usable
@pytest.mark.skipif(NRANKS != 2, reason="the plan is written for 2 ranks")
def test_executor_on_raw_gpu_buffers() -> None:
    run("executor", str(PLANS / "allreduce_ll_n2.json"))


@gpu_only
def test_buffer_errors_on_gpu() -> None:
    """Host memory on a CUDA build, and a GPU tensor of the wrong type or layout."""
    import numpy as np

    torch.cuda.set_device(0)
    g = mscclpp.CommGroup(0, 1, f"127.0.0.1:{free_port()}", device=0)
    with pytest.raises(mscclpp.MscclppError, match="is host memory: expected memory of GPU 0"):
        g.all_reduce(np.zeros(16, np.float32))
    x = torch.zeros(64, device="cuda")
    with pytest.raises(mscclpp.MscclppError, match="not contiguous"):
        g.all_reduce(x[::2])
    with pytest.raises(mscclpp.MscclppError, match="expected the same element type"):
        g.all_reduce(x, torch.zeros(64, device="cuda", dtype=torch.float16))
    with pytest.raises(mscclpp.MscclppError, match="no element type"):
        g.all_reduce(torch.zeros(64, device="cuda", dtype=torch.int16))
    buf = mscclpp.RawGpuBuffer(1024, 0)
    t = torch.as_tensor(buf, device="cuda")
    assert t.numel() == 1024 and t.data_ptr() == buf.ptr
    g.barrier()


@usable
@pytest.mark.skipif(shutil.which("torchrun") is None and not (Path(sys.executable).parent / "torchrun").exists(), reason="torchrun is missing")
def test_torch_example_under_torchrun() -> None:
    """core/python/examples/torch_allreduce.py under torchrun (TorchComm from the world)."""
    torchrun = shutil.which("torchrun") or str(Path(sys.executable).parent / "torchrun")
    example = HERE.parent / "examples" / "torch_allreduce.py"
    env = dict(os.environ, MASTER_ADDR="127.0.0.1")
    p = subprocess.run(
        [torchrun, "--nproc-per-node", str(NRANKS), "--master-addr", "127.0.0.1", "--master-port", str(free_port()), str(example)],
        capture_output=True, text=True, timeout=480, env=env,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    assert "all correct" in p.stdout, p.stdout
