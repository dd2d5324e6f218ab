"""The 2-process run of tests/dist_scripts/sharded_heads.py (every sharded-head case on 2 ranks, in the session's one
launch: tests/shared_runs.py) and that script's cases, read by tests/test_sharded_heads.py and
tests/test_interclass_filtering.py; importing this module registers the run ``sharded_heads``."""
import importlib.util
import os

from tests.dist_util import ROOT
from tests.shared_runs import two_process_run

SCRIPT = os.path.join(ROOT, "tests", "dist_scripts", "sharded_heads.py")


def _load_script():
    spec = importlib.util.spec_from_file_location("sharded_heads_script", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


script = _load_script()  # CASES, global_batch, split_rows, FEATURE_SIZE of the 2-rank script


@two_process_run("sharded_heads")
def _two_ranks(folder):
    return {"call": [SCRIPT, "main", str(folder)]}, str(folder)
