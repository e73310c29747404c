#!/usr/bin/env python3
"""Writes the execution plans shipped with mscclpp-rs (core/plans/*.json) from their DSL
programs (core/python/python/mscclpp/language/examples/plans.py, which documents the
families). `python3 core/plans/plans.py` rewrites the files; `--check` tells whether they are
what the programs produce (CI runs it). `python3 core/plans/plans.py example ARGS...` runs
`python -m mscclpp.language.examples.collectives ARGS...` the same way (tests and GPU scripts
write the example plans with it, e.g. `example allreduce 2 > plan.json`).

Runs from a plain checkout: `mscclpp.language` is standard-library Python, loaded here from the
source tree without the package's native extension.
"""

import importlib
import os
import sys
import types

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(HERE, "..", "python", "python", "mscclpp")

if "mscclpp" not in sys.modules:
    # The package's __init__ loads the native module; the DSL needs none of it.
    pkg = types.ModuleType("mscclpp")
    pkg.__path__ = [os.path.abspath(SRC)]
    sys.modules["mscclpp"] = pkg

plans = importlib.import_module("mscclpp.language.examples.plans")

if __name__ == "__main__":
    if sys.argv[1:2] == ["example"]:
        sys.exit(importlib.import_module("mscclpp.language.examples.collectives").main(sys.argv[2:]))
    check = ["--check"] if "--check" in sys.argv[1:] else []
    sys.exit(plans.main(check + [HERE]))
