"""The GPU cases of tests/gpu_worker.py at N ranks without pytest (the GPU machine's Python
may lack it): ``python run_cases.py NRANKS [CASE...]``. One line per case (PASS / FAIL /
SKIP with the reason), the failing ranks' output tails, and last
``N passed, N failed, N skipped``; exit 1 when a case failed."""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS))

from ranks import run_ranks  # noqa: E402

PLANS = TESTS.parents[1] / "plans"


def main() -> int:
    n = int(sys.argv[1])
    import mscclpp

    if mscclpp.backend() != "cuda" or mscclpp.device_count() == 0:
        print(f"SKIP  all  mscclpp backend {mscclpp.backend()!r}, {mscclpp.device_count()} GPUs: needs a CUDA build and a GPU")
        print("0 passed, 0 failed, 1 skipped")
        return 0
    have_cupy = importlib.util.find_spec("cupy") is not None
    have_nvcc = shutil.which("nvcc") is not None or bool(os.environ.get("CUPY_NVCC_PATH"))
    cases: list[tuple[str, list[str], str | None]] = [
        ("collectives", [], None),
        ("algorithms", [], None),
        ("library_memory", [], None),
        ("p2p", [], None),
        ("dlpack", [], None),
        ("graph", [], None),
        ("cupy", [], None if have_cupy else "cupy is not installed"),
        ("channel_put", [], None if have_cupy and have_nvcc else "needs cupy and nvcc on PATH"),
        ("executor", [str(PLANS / "allreduce_ll_n2.json")], None if n == 2 else "the plan is written for 2 ranks"),
    ]
    only = set(sys.argv[2:])
    passed = failed = skipped = 0
    for case, args, skip in cases:
        if only and case not in only:
            continue
        if skip:
            print(f"SKIP  {case:16s} np={n}  {skip}", flush=True)
            skipped += 1
            continue
        t0 = time.monotonic()
        try:
            run_ranks(case, n, *args, worker=TESTS / "gpu_worker.py", timeout=300.0)
        except AssertionError as e:
            failed += 1
            print(f"FAIL  {case:16s} np={n}  {time.monotonic() - t0:5.1f}s", flush=True)
            print("\n".join(str(e).splitlines()[-40:]), flush=True)
            continue
        passed += 1
        print(f"PASS  {case:16s} np={n}  {time.monotonic() - t0:5.1f}s", flush=True)
    print(f"{passed} passed, {failed} failed, {skipped} skipped")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
