"""Runs one case of ``worker.py`` on N ranks, each its own Python process, and reports how
every rank ended (the multi-process harness of the pytest suite)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
WORKER = HERE / "worker.py"


def free_port() -> int:
    """A TCP port of 127.0.0.1 that nothing listened on a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_ranks(
    case: str,
    nranks: int,
    *args: str,
    timeout: float = 240.0,
    env: dict[str, str] | None = None,
    worker: Path = WORKER,
) -> list[str]:
    """Runs ``WORKER CASE RANK NRANKS ADDRESS ARGS...`` (default worker.py) as ``nranks``
    processes; fails with every rank's output unless all exit 0. Returns the outputs in rank
    order."""
    addr = f"127.0.0.1:{free_port()}"
    full_env = dict(os.environ)
    # Every rank of one job gets the same bootstrap job key ("ip:port" mode).
    full_env["MSCCLPP_BOOTSTRAP_KEY"] = f"pytest-{case}-{addr}"
    full_env.setdefault("MSCCLPP_DEBUG", "WARN")
    if env:
        full_env.update(env)
    procs = [
        subprocess.Popen(
            [sys.executable, str(worker), case, str(r), str(nranks), addr, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=full_env,
        )
        for r in range(nranks)
    ]
    outs, failed = [], []
    for r, p in enumerate(procs):
        try:
            out, _ = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            out, _ = p.communicate()
            out += f"\n[rank {r} killed after {timeout} s]"
        outs.append(out)
        if p.returncode != 0:
            failed.append(r)
    if failed:
        report = "\n".join(f"--- rank {r} (exit {procs[r].returncode}) ---\n{o}" for r, o in enumerate(outs))
        raise AssertionError(f"{case} on {nranks} ranks: ranks {failed} failed\n{report}")
    return outs
