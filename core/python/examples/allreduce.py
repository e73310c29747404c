"""All-reduce of NumPy arrays on the host backend, N ranks as processes of this machine.

    python core/python/examples/allreduce.py --nranks 2

starts N copies of itself (``--rank R``), which meet at 127.0.0.1:PORT through a
``mscclpp.CommGroup``, all-reduce a float32 array in place and check the result. On a GPU
build, use torch tensors instead (torch_allreduce.py).
"""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys

import numpy as np

import mscclpp


def rank_main(rank: int, nranks: int, address: str) -> None:
    group = mscclpp.CommGroup(rank, nranks, address)
    x = np.full(1 << 20, rank + 1, dtype=np.float32)
    group.all_reduce(x)  # in place, sum
    want = nranks * (nranks + 1) / 2
    assert (x == want).all(), f"rank {rank}: got {x[:4]}, expected {want}"
    algo = group.collectives.algorithm_for("allreduce", x.nbytes)
    group.barrier()
    if rank == 0:
        print(f"all_reduce of {x.size} float32 on {nranks} ranks ({mscclpp.backend()} backend, {algo}): correct")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nranks", type=int, default=2)
    p.add_argument("--rank", type=int, help="(internal) run as this rank")
    p.add_argument("--address", help="(internal) where rank 0 listens")
    a = p.parse_args()
    if a.rank is not None:
        rank_main(a.rank, a.nranks, a.address)
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{s.getsockname()[1]}"
    cmd = [sys.executable, __file__, "--nranks", str(a.nranks), "--address", address]
    procs = [subprocess.Popen([*cmd, "--rank", str(r)]) for r in range(a.nranks)]
    sys.exit(max(p.wait() for p in procs))


if __name__ == "__main__":
    main()
