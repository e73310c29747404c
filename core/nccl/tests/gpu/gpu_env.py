"""What the multi-rank PyTorch checks of this folder share, imported before torch: NVLink
multicast off (it can take the shared host's GPUs out of service), this rank and the world size
(RANK/WORLD_SIZE, else Open MPI's), and the rendezvous address (default port `port`).
"""
import os


def setup(port):
    """Sets the variables and returns (rank, world)."""
    os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"
    os.environ["MSCCLPP_FORCE_DISABLE_NVLS"] = "1"
    os.environ["NCCL_NVLS_ENABLE"] = "0"
    os.environ["NVSHMEM_DISABLE_NVLS"] = "1"
    rank = int(os.environ.get("RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0")))
    world = int(os.environ.get("WORLD_SIZE", os.environ.get("OMPI_COMM_WORLD_SIZE", "1")))
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(port))
    return rank, world
