"""Test set-up: the repository root on sys.path, one intra-op thread per test process, plug-ins registered; the
session's shared training runs (tests/shared_runs.py, trained once for all pytest-xdist workers); the ``float64``
fixture; ``MTL_TEST_DEVICE`` (e.g. ``gpu:0``) as Paddle's device; and the skip allow-list: a test (or test module)
that skips for a reason :data:`ALLOWED_SKIPS` does not name fails instead, so that no reference silently stops
running; the order of the test files (:data:`SLOWEST_FILES` first); and each test process's warm Python, which runs
the tests' ``[sys.executable, ...]`` commands in forks of an interpreter that has imported Paddle once
(tests/warm_python.py)."""
import collections
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # what a training in this process sets (mtl.core.runtime)

# scikit-learn sets these (setdefault) when first imported: set now, to its values, so that every test and every
# process the tests start see them alike, whichever test imports it first (importing it here would cost every worker
# 1.3 s: tests/lazy.py)
os.environ.setdefault("KMP_DUPLICATE_LIB_OK", "True")
os.environ.setdefault("KMP_INIT_AT_FORK", "FALSE")

import pytest  # noqa: E402

from mtl.core.console import QUIET_ENV  # noqa: E402
from tests import warm_python  # noqa: E402
from tests.references.peers import LIVE_SKIP_REASON  # noqa: E402
from tests.shared_runs import one_process, two_process  # noqa: E402,F401  (session fixtures)

# (pattern of the skip's reason, why that skip is allowed): every other skip fails the suite
ALLOWED_SKIPS = [
    (re.escape(LIVE_SKIP_REASON), "the live runs of the peers' own code need a torch environment, which the project "
     "never depends on; their committed fixtures (tests/fixtures/) are checked on every run instead"),
    (r"could not import '(paddle2onnx|onnxruntime|visualdl|pyarrow)'.*", "an optional extra (requirements-extras.txt) "
     "that is not installed: ONNX export, VisualDL scalars and reading GloVe's parquet index are optional; make test "
     "installs them"),
    (re.escape("the cache holds no minilm (mtl pretrained fetch minilm)"), "the opt-in test of the real MiniLM "
     "weights, which make test never downloads (tests/test_minilm_reference.py); the loader is tested on a random "
     "model of the same format on every run"),
    (re.escape("CPU-build behaviour"), "on a CUDA build of Paddle the CPU build's device selection cannot be "
     "checked; tools/gpu_check.py checks the GPU side"),
    (re.escape("reads the process tree from /proc"), "a system without /proc (not Linux)"),
    (re.escape("no IPv6 loopback on this machine"), "a machine or container without IPv6: the store's connections "
     "over IPv4 are tested on every run (tests/test_rendezvous.py)"),
]

# The files that take longest (their tests, subprocesses and launches: a --durations run of the suite), longest first.
# pytest-xdist's --dist loadfile keeps a file on one worker and hands the files out in collection order (pyproject's
# addopts turn off its own reordering, which puts the files with the most tests first and the long files of a few
# tests last, where one of them alone made the end of the run): these start first and the short files fill in.
# test_weighting_more.py leads because its first test sets up the session's launch of every 2-process run.
SLOWEST_FILES = [
    "test_weighting_more.py", "test_readme.py", "test_watchdog.py", "test_arch_training.py",
    "test_user_reports_failures.py", "test_lfw_report.py", "test_demo.py", "test_convert.py",
    "test_reliability_readers.py", "test_newcomer.py", "test_arch_reports.py", "test_memory_growth.py",
    "test_disk_faults.py", "test_preemption.py", "test_documented_keys.py", "test_user_reports.py",
    "test_distributed_failure.py", "test_trust_boundaries.py", "test_reliability_multinode.py", "test_text_report.py",
    "test_faces_six.py", "test_text_report_arms.py",
]


def pytest_sessionfinish(session):
    """Stop the warm Python."""
    warm_python.stop()


@pytest.hookimpl(trylast=True)  # after ``-m`` has deselected what it deselects
def pytest_collection_modifyitems(config, items):
    """The test files of :data:`SLOWEST_FILES` first, in that order, then the others, most tests first; each file's
    tests stay together and in their order. When a selected test runs commands (marked ``subprocess``), the test
    process's warm Python (tests/warm_python.py) starts now, to finish its imports while the first tests run (not in
    the process that only hands tests out to pytest-xdist's workers)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER") or not config.getoption("numprocesses", None)
    if worker and any(item.get_closest_marker("subprocess") for item in items):
        warm_python.start()
    rank = {name: i for i, name in enumerate(SLOWEST_FILES)}
    counts = collections.Counter(str(item.path) for item in items)
    items.sort(key=lambda item: (rank.get(item.path.name, len(rank)), -counts[str(item.path)], str(item.path)))


if os.environ.get("MTL_TEST_DEVICE"):  # tools/gpu_check.py: the in-process tests with this device as Paddle's place
    import paddle

    paddle.set_device(os.environ["MTL_TEST_DEVICE"])


def _read_at_import():
    """The test process's environment variables that decide how a process started from it behaves."""
    return {k: v for k, v in os.environ.items() if k.startswith(warm_python.READ_AT_IMPORT + ("MTL_",))}


@pytest.fixture(autouse=True)
def environment_left_as_found():
    """A test that leaves such a variable changed (a run in the test's own process that sets one) changes every later
    test of its worker: their commands no longer fork from the warm Python, and their runs inherit it. The variables are
    put back and the test fails, naming them. mtl's quiet glog levels (``mtl.core.console.QUIET_ENV``), which an entry
    point called in the test's process sets, may stay: every command forked from the warm Python has them."""
    before = _read_at_import()
    yield
    after = _read_at_import()
    changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k)
                     and not (k not in before and after[k] == QUIET_ENV.get(k)))
    for key in changed:
        if key in before:
            os.environ[key] = before[key]
        else:
            del os.environ[key]
    assert not changed, f"the test left these environment variables changed: {', '.join(changed)}"


@pytest.fixture
def float64():
    """Run a test with float64 parameters and tensors (tight comparisons, finite differences)."""
    import paddle

    old = paddle.get_default_dtype()
    paddle.set_default_dtype("float64")
    yield
    paddle.set_default_dtype(old)


def skip_reason(report) -> str:
    """The reason a skipped report gives (pytest's ``(path, line, "Skipped: reason")``)."""
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    return reason[len("Skipped: "):] if reason.startswith("Skipped: ") else reason


def unexpected_skip(report):
    """A skipped report whose reason the allow-list does not name becomes a failure that says so."""
    if report.skipped:
        reason = skip_reason(report)
        if not any(re.fullmatch(pattern, reason) for pattern, _ in ALLOWED_SKIPS):
            report.outcome = "failed"
            report.longrepr = (f"unexpected skip: {reason!r}. A skip must be named in ALLOWED_SKIPS "
                               "(tests/conftest.py) with the reason it is allowed, or the test must run.")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Skips of a test (a mark, a fixture or the test itself) go through :func:`unexpected_skip`."""
    outcome = yield
    unexpected_skip(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    """Skips of a whole module (``pytest.importorskip`` at import) go through :func:`unexpected_skip`."""
    outcome = yield
    unexpected_skip(outcome.get_result())
