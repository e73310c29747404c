#!/usr/bin/env bash
# Builds the Python package (host backend) into a virtual environment under target/ and runs
# its pytest suite; ends with `N passed, N failed, N skipped` (read by .ci/test's step).
#   bash core/python/test.sh [PYTEST ARGS...]
# The dev profile reuses what `cargo build --workspace` built; MSCCLPP_PY_PROFILE=release
# builds as pip does by default.
set -uo pipefail
cd "$(dirname "$0")/../.."
venv=$(realpath -m "${MSCCLPP_PY_VENV:-target/pyenv}")
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv" || { echo "python3 -m venv failed (Debian: apt-get install python3-venv)"; exit 1; }
fi
"$venv/bin/pip" install -q --disable-pip-version-check maturin numpy pytest mypy || exit 1
PATH="$venv/bin:$PATH" MATURIN_PEP517_ARGS="--profile ${MSCCLPP_PY_PROFILE:-dev}" \
  "$venv/bin/pip" install -q --disable-pip-version-check --no-build-isolation --force-reinstall --no-deps ./core/python ||
  exit 1
out=$(mktemp)
(cd core/python && "$venv/bin/python" -m pytest -q -rs tests "$@") 2>&1 | tee "$out"
rc=${PIPESTATUS[0]}
# pytest's last line ("3 failed, 36 passed, 2 skipped in 7.6s") as the plain count line.
tail -1 "$out" | python3 -c '
import re, sys
line = sys.stdin.read()
n = {k: int(v) for v, k in re.findall(r"(\d+) (passed|failed|skipped|error)", line)}
g = lambda k: n.get(k, 0)
print(g("passed"), "passed,", g("failed") + g("error"), "failed,", g("skipped"), "skipped")'
rm -f "$out"
exit "$rc"
