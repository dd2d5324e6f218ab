"""Run by ``mtl launch`` (tests/test_documented_keys.py): a rank sets its thread counts as mtl's runner does
(``mtl.core.runtime.set_threads``), imports Paddle, and prints one ``PROBE {json}`` line: the size of Paddle's OpenMP
pool read back from the loaded library (threadpoolctl) and the OMP_NUM_THREADS it was started with."""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
started_with = os.environ.get("OMP_NUM_THREADS")

from mtl.core.runtime import set_threads  # noqa: E402

set_threads()
import paddle  # noqa: E402,F401
import threadpoolctl  # noqa: E402

pools = threadpoolctl.threadpool_info()
print("PROBE " + json.dumps({"omp": sorted({p["num_threads"] for p in pools if p["internal_api"] == "openmp"}),
                             "started_with": started_with}), flush=True)
