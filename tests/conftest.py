"""Test set-up: the repository root on sys.path, one intra-op thread per test process, plug-ins registered; the
session's shared training runs (tests/shared_runs.py, trained once for all pytest-xdist workers); the ``float64``
fixture; ``MTL_TEST_DEVICE`` (e.g. ``gpu:0``) as Paddle's device."""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402

from tests.shared_runs import one_process, two_process  # noqa: E402,F401  (session fixtures)

if os.environ.get("MTL_TEST_DEVICE"):  # tools/gpu_check.py: the in-process tests with this device as Paddle's place
    import paddle

    paddle.set_device(os.environ["MTL_TEST_DEVICE"])



@pytest.fixture
def float64():
    """Run a test with float64 parameters and tensors (tight comparisons, finite differences)."""
    import paddle

    old = paddle.get_default_dtype()
    paddle.set_default_dtype("float64")
    yield
    paddle.set_default_dtype(old)
