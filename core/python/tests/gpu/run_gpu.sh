#!/usr/bin/env bash
# The GPU check of the Python package on a one-GPU machine (ranks share the GPU under MPS):
#   pytest2   the pytest suite (tests/, GPU cases at 2 ranks; the DSL's test_language*.py are
#             left to tests/gpu/dsl_plan_gpu.sh); without pytest on the machine,
#             tests/gpu/run_cases.py runs the same GPU cases
#   cases4    the GPU cases at 4 ranks (run_cases.py)
#   example   examples/torch_allreduce.py under torchrun, 2 and 4 ranks
#   bench     examples/bench_allreduce.py, 2 and 4 ranks: mscclpp's TorchComm, and
#             torch.distributed (NCCL backend) with LD_PRELOAD of our libmscclpp_nccl.so
# and a summary table last. From the repository root, with the CUDA wheel in .whl/:
#   /opt/torch/.venv/bin/python -m pip install --no-deps --target /tmp/site .whl/*.whl
#   bash core/python/tests/gpu/run_gpu.sh            # or PARTS="pytest2 cases4" ... (each part
#                                                    # fits one 10-minute device call)
# Env: PY (default /opt/torch/.venv/bin/python), PY_SITE (/tmp/site, put first on PYTHONPATH),
# MSCCLPP_NCCL_SO (default .gpu/bin/libmscclpp_nccl.so, from `.ci/gpu-check --stage`, else
# target/release/libmscclpp_nccl.so), OUT (logs, default /tmp/mscclpp_py_gpu).
set -uo pipefail
cd "$(dirname "$0")/../../../.." || exit 1
ROOT=$PWD
OUT=${OUT:-/tmp/mscclpp_py_gpu}
PY=${PY:-/opt/torch/.venv/bin/python}
SITE=${PY_SITE:-/tmp/site}
PARTS=${PARTS:-pytest2 cases4 example bench}
if [ -z "${MSCCLPP_NCCL_SO:-}" ]; then
  [ ! -f .gpu/bin/libmscclpp_nccl.so ] && [ -f .gpu/bin.tar.xz ] && tar -C .gpu -xJf .gpu/bin.tar.xz
  [ -f .gpu/bin/libmscclpp_nccl.so ] && export MSCCLPP_NCCL_SO=$ROOT/.gpu/bin/libmscclpp_nccl.so
fi
# LIB (our NCCL library), the NVLS-off environment, say/verdict and $OUT/summary.txt.
. "$ROOT/core/nccl/tests/gpu/common.sh"
if [ ! -d "$SITE/mscclpp" ]; then
  "$PY" -m pip install -q --no-deps --target "$SITE" .whl/*.whl >"$OUT/install.log" 2>&1 ||
    { say "FAIL  install of .whl/*.whl into $SITE (install.log)"; exit 1; }
fi
export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}
export PATH=$(dirname "$PY"):$PATH:${CUDA_HOME}/bin   # torchrun; nvcc for CuPy's nvcc backend
export CUDA_MPS_PIPE_DIRECTORY=${CUDA_MPS_PIPE_DIRECTORY:-/tmp/mps-pipe} CUDA_MPS_LOG_DIRECTORY=${CUDA_MPS_LOG_DIRECTORY:-/tmp/mps-log}
mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
started_mps=0
if ! echo get_server_list | nvidia-cuda-mps-control >/dev/null 2>&1; then
  nvidia-cuda-mps-control -d && started_mps=1
fi
trap 'rm -rf "$W"; [ $started_mps = 1 ] && echo quit | nvidia-cuda-mps-control' EXIT
say "GPU: $(nvidia-smi -L 2>&1 | head -1); mscclpp $("$PY" -c 'import mscclpp; print(mscclpp.__version__, mscclpp.backend(), mscclpp.__file__)' 2>&1)"
counts() { grep -E '^[0-9]+ passed, [0-9]+ failed, [0-9]+ skipped$' "$1" | tail -1; }
pyline() { tail -1 "$1" | grep -oE '[0-9]+ (passed|failed|skipped|error)' | tr '\n' ' '; }
has() { [[ " $PARTS " == *" $1 "* ]]; }
BENCH=$OUT/bench.txt
: >"$BENCH"

if has pytest2; then
  if "$PY" -c 'import pytest' 2>/dev/null; then
    (cd core/python && MSCCLPP_PY_GPU_RANKS=2 timeout 560 "$PY" -m pytest -q -rs -p no:cacheprovider --ignore-glob='tests/test_language*' tests) >"$OUT/pytest_np2.log" 2>&1
    rc=$?
    verdict "pytest core/python/tests (GPU cases at 2 ranks)" $([ $rc = 0 ] && echo 1 || echo 0) "rc=$rc: $(pyline "$OUT/pytest_np2.log")(pytest_np2.log)"
  else
    timeout 560 "$PY" core/python/tests/gpu/run_cases.py 2 >"$OUT/cases_np2.log" 2>&1
    rc=$?
    verdict "GPU cases at 2 ranks (no pytest here: run_cases.py)" $([ $rc = 0 ] && echo 1 || echo 0) "rc=$rc: $(counts "$OUT/cases_np2.log") (cases_np2.log)"
  fi
fi
if has cases4; then
  timeout 560 "$PY" core/python/tests/gpu/run_cases.py 4 >"$OUT/cases_np4.log" 2>&1
  rc=$?
  verdict "GPU cases at 4 ranks (run_cases.py)" $([ $rc = 0 ] && echo 1 || echo 0) "rc=$rc: $(counts "$OUT/cases_np4.log") (cases_np4.log)"
fi
if has example; then
  for n in 2 4; do
    timeout 240 torchrun --nproc-per-node $n --master-addr 127.0.0.1 --master-port $((29700 + n)) \
      core/python/examples/torch_allreduce.py >"$OUT/example_np$n.log" 2>&1
    rc=$?
    ok=$([ $rc = 0 ] && grep -q "all correct" "$OUT/example_np$n.log" && echo 1 || echo 0)
    verdict "torchrun examples/torch_allreduce.py np=$n" "$ok" "rc=$rc (example_np$n.log)"
  done
fi
if has bench; then
  for n in 2 4; do
    timeout 240 torchrun --nproc-per-node $n --master-addr 127.0.0.1 --master-port $((29710 + n)) \
      core/python/examples/bench_allreduce.py --impl mscclpp >"$OUT/bench_mscclpp_np$n.log" 2>&1
    rc=$?
    grep '^BENCH' "$OUT/bench_mscclpp_np$n.log" >>"$BENCH"
    verdict "bench mscclpp TorchComm np=$n" $([ $rc = 0 ] && echo 1 || echo 0) "rc=$rc (bench_mscclpp_np$n.log)"
    LD_PRELOAD=$LIB timeout 240 torchrun --nproc-per-node $n --master-addr 127.0.0.1 --master-port $((29720 + n)) \
      core/python/examples/bench_allreduce.py --impl torch >"$OUT/bench_torch_np$n.log" 2>&1
    rc=$?
    grep '^BENCH' "$OUT/bench_torch_np$n.log" >>"$BENCH"
    verdict "bench torch.distributed + LD_PRELOAD $(basename "$LIB") np=$n" $([ $rc = 0 ] && echo 1 || echo 0) "rc=$rc (bench_torch_np$n.log)"
  done
fi

for f in $(grep '^FAIL' "$SUM" | grep -oE '[A-Za-z0-9_]+\.log' | sort -u); do
  echo "==== $f (tail)"; tail -25 "$OUT/$f"
done
if [ -s "$BENCH" ]; then
  echo "==== all_reduce from Python, us per call (float32; rank 0)"
  printf '%-8s %-6s %-6s %12s %12s\n' ranks mode size mscclpp torch+ourNCCL
  for n in 2 4; do for mode in eager graph; do for b in 1024 16777216; do
    m=$(grep "impl=mscclpp mode=$mode bytes=$b ranks=$n " "$BENCH" | sed 's/.*us_per_call=//')
    t=$(grep "impl=torch mode=$mode bytes=$b ranks=$n " "$BENCH" | sed 's/.*us_per_call=//')
    printf '%-8s %-6s %-6s %12s %12s\n' "$n" "$mode" "$([ $b = 1024 ] && echo 1KiB || echo 16MiB)" "${m:--}" "${t:--}"
  done; done; done
fi
echo "==== summary ($PASSES passed, $FAILS failed; logs in $OUT)"
cat "$SUM"
[ "$FAILS" = 0 ]
