"""Keys and options the documentation promises, each against what it says it does: ``data.check_batches``
(docs/configuration.md), ``eval.max_samples``, ``optimizer.betas`` (checked at load time), ``threads`` and
``tune_malloc`` (set before Paddle starts; glibc's own allocation counters), and ``mtl launch --ips``
(docs/distributed.md). ``max_consecutive_nonfinite`` is in tests/test_nonfinite.py, the optimizer's update with
``betas`` in tests/test_optim.py."""
import json
import os
import subprocess
import sys

import numpy as np
import paddle
import pytest

from mtl.config.loading import load_job
from mtl.core.errors import ConfigError, ContractError
from mtl.evaluation.evaluator import Evaluator
from mtl.readers.synthetic import SyntheticReader
from mtl.train.job import build_job
from mtl.train.trainer import Trainer
from tests import warm_python
from tests.dist_util import ROOT, free_port, launcher_env

INT32_LABELS = '''
import numpy as np
from mtl.core.contracts import Field
from mtl.readers.base import Reader
from mtl.core.registry import register_reader


@register_reader("dk_int32_labels")
class Int32Labels(Reader):
    """Declares int64 labels and yields int32 ones."""

    num_classes = 3

    def __init__(self, split="train"):
        pass

    def fields(self):
        return [Field("image", (1, 8, 8), "float32"), Field("label", (), "int64")]

    def __len__(self):
        return 12

    def labels(self):
        return np.arange(12) % 3

    def __getitem__(self, i):
        return {"image": np.full((1, 8, 8), i % 3, np.float32), "label": np.array(i % 3, np.int32)}
'''


def small_job(folder, task, **options):
    """One task on an MLP, 2 steps of 4 samples, nothing averaged or plotted."""
    return {"seed": 0, "device": "cpu", "output_dir": str(folder / "run"), "tasks": [task],
            "backbone": {"type": "mlp", "input_shape": [1, 8, 8], "hidden": [16], "embedding_size": 8},
            "schedule": {"batch_size": 4, "steps": 2}, "log": {"progress": False, "plot": False},
            "averaging": {"type": "none"}, **options}


@pytest.fixture(scope="module")
def int32_plugins(tmp_path_factory):
    """One plug-in folder for the module: a reader registers its name once per session."""
    folder = tmp_path_factory.mktemp("plugins")
    (folder / "int32_labels.py").write_text(INT32_LABELS)
    return str(folder)


@pytest.mark.parametrize("check", [True, False])
def test_check_batches_checks_the_first_batch_against_the_declared_fields(tmp_path, check, int32_plugins):
    """A reader that declares int64 labels and yields int32: with ``data.check_batches`` (the default) the first
    batch stops the job with a sentence naming the task, the reader and both descriptions; without, it trains."""
    job = small_job(tmp_path, {"name": "t", "reader": {"type": "dk_int32_labels"}, "head": "softmax", "eval": None},
                    plugins=[int32_plugins], data={"num_workers": 0, "check_batches": check})
    trainer = Trainer(build_job(load_job(data=job)), console=lambda *a: None)
    if not check:
        assert trainer.run()["steps"] == 2
        return
    with pytest.raises(ContractError, match=r"^task 't': reader 'dk_int32_labels' declared label\[\] int64 but a "
                                            r"batch holds label\[\] int32$"):
        trainer.run()


def test_eval_max_samples_scores_the_first_samples_only(tmp_path, monkeypatch):
    """``eval.max_samples`` N: the evaluation reads samples 0..N-1 of the split and its accuracy is the accuracy of
    the softmax head's logits (features W^T + b, computed here in numpy) on those N samples."""
    read = []
    original = SyntheticReader.__getitem__

    def recording(self, index):
        read.append(int(index))
        return original(self, index)

    task = {"name": "t", "reader": {"type": "synthetic", "num_samples": 40, "num_classes": 4},
            "head": "softmax", "eval": {"max_samples": 7}}
    job = build_job(load_job(data=small_job(tmp_path, task)))
    monkeypatch.setattr(SyntheticReader, "__getitem__", recording)
    got = Evaluator(job).evaluate()["t"]["accuracy"]
    assert sorted(set(read)) == list(range(7))
    reader = job.eval_reader(job.task("t"))
    samples = [original(reader, i) for i in range(len(reader))]
    with paddle.no_grad():
        job.model.eval()
        feats = job.model.backbone({"image": paddle.to_tensor(np.stack([s["image"] for s in samples]))}).numpy()
    head = job.task("t").head
    logits = feats.astype(np.float64) @ head.weight.numpy().T + head.bias.numpy()
    labels = np.array([int(s["label"]) for s in samples])
    hits = logits.argmax(axis=1) == labels
    assert got == pytest.approx(hits[:7].mean(), abs=1e-12)
    assert hits[:7].mean() != hits.mean()  # the premise: the whole split would score otherwise


def test_optimizer_betas_are_checked_at_load_time():
    task = {"name": "t", "reader": {"type": "synthetic"}, "head": "softmax"}
    for bad in ([0.9], [0.9, 1.0], [-0.1, 0.9]):
        with pytest.raises(ConfigError, match=r"optimizer.betas: expected two numbers in \[0, 1\)"):
            load_job(data={"tasks": [task], "backbone": "mlp", "optimizer": {"type": "adamw", "betas": bad}})


PROBE = r'''
import ctypes, ctypes.util, json, os, sys

import mtl.cli  # first, as every entry point: it loads numpy before any thread is set
from mtl.core import runtime

before_paddle = []
set_threads = runtime.set_threads
runtime.set_threads = lambda *a: (before_paddle.append("paddle" not in sys.modules), set_threads(*a))[1]


class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                "fsmblks", "uordblks", "fordblks", "keepcost")]


libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
libc.mallinfo2.restype = MallInfo2
mtl.cli.main(["train", *sys.argv[1:]])  # the command line's own path
mapped = libc.mallinfo2().hblks
block = bytearray(64 << 20)  # 64 MiB: above glibc's largest mmap threshold, unless mmap is turned off
import threadpoolctl  # what numpy's (and Paddle's bundled) OpenBLAS really run with

pools = threadpoolctl.threadpool_info()
blas = sorted({pool["num_threads"] for pool in pools if pool["internal_api"] == "openblas"})
omp = sorted({pool["num_threads"] for pool in pools if pool["internal_api"] == "openmp"})  # Paddle's pool
print(json.dumps({"threads": [os.environ.get(v) for v in ("OMP_NUM_THREADS", "MKL_NUM_THREADS",
                                                           "OPENBLAS_NUM_THREADS")],
                  "blas": blas, "omp": omp, "before_paddle": before_paddle,
                  "mmapped": libc.mallinfo2().hblks - mapped}))
'''


CORES = str(os.cpu_count() or 1)
LEFT = str(max(1, int(CORES) - 1))  # the cores a loader worker leaves


@pytest.mark.subprocess
@pytest.mark.parametrize("threads, blas, workers, env, expected, tune, base", [
    (3, None, 0, {"OMP_NUM_THREADS": "1"}, ["3", "3", "1"], True, False),  # threads wins over the user's variable
    (None, None, 0, {"OMP_NUM_THREADS": "1"}, ["1", None, "1"], False, False),  # the user's own variable stands
    (None, None, 0, {}, [CORES, CORES, "1"], True, False),  # cores / local processes; numpy's BLAS at 1
    (None, None, 1, {}, [LEFT, LEFT, "1"], True, False),  # a core for the loader worker
    (None, None, 0, {}, [CORES, CORES, "1"], True, True),  # num_workers from the job's ``base:``
    (None, 2, 0, {}, [CORES, CORES, "2"], True, False),  # blas_threads
    (None, None, 0, {"OPENBLAS_NUM_THREADS": "2"}, [CORES, CORES, "2"], True, False),  # the user's BLAS variable
])
def test_threads_and_tune_malloc_apply_before_paddle_starts(tmp_path, threads, blas, workers, env, expected, tune,
                                                            base):
    """``threads`` sets Paddle's intra-op thread count (OMP, MKL; default: the cores the job's loader workers leave,
    split over the local processes) and ``blas_threads`` numpy's OpenBLAS (default 1)
    before Paddle is imported (numpy, which the command line loads first, through threadpoolctl); without them a
    user's own OMP_NUM_THREADS / OPENBLAS_NUM_THREADS stands, else cores / local processes and 1. The BLAS count is
    read back from the loaded libraries (threadpoolctl), and so is Paddle's OpenMP pool: ``mtl train`` imported Paddle
    before it set the threads, and Paddle, finding no OMP_NUM_THREADS, set it to 1 for every run.
    ``tune_malloc`` turns glibc's mmap of large blocks off (a 64 MiB block then comes from the heap: mallinfo2's
    count of mmapped blocks does not grow)."""
    task = {"name": "t", "reader": {"type": "synthetic"}, "head": "softmax"}
    keys = {**({"threads": threads} if threads else {}), **({"blas_threads": blas} if blas else {})}
    job = small_job(tmp_path, task, tune_malloc=tune, data={"num_workers": workers}, **keys)
    path = tmp_path / "job.json"  # JSON is YAML
    if base:  # the keys in a base file, the job a variant of it that only names it
        (tmp_path / "base.json").write_text(json.dumps(job))
        job = {"base": "base.json"}
    path.write_text(json.dumps(job))
    run_env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS",
                                                               "OPENBLAS_NUM_THREADS")}
    run_env.update(PYTHONPATH=ROOT, **env)
    # a new interpreter (never tests/warm_python.py's forks, which have imported Paddle)
    done = subprocess.run([sys.executable, "-c", PROBE, str(path)], capture_output=True, text=True, env=run_env,
                          cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["threads"] == expected
    assert seen["blas"] == [int(expected[2])]
    assert seen["omp"] == [int(expected[0])]
    assert seen["before_paddle"] == [True]
    assert seen["mmapped"] == (0 if tune else 1)


def test_the_default_threads_leave_each_loader_worker_a_core(monkeypatch):
    """Paddle's threads by default: (cores - local processes x loader workers) // local processes, at least 1; what
    the runner writes is what a child process does not inherit (``user_environment``)."""
    from mtl.core import runtime

    for name in runtime.THREAD_VARIABLES:  # (set, then removed: monkeypatch puts back what was there, or nothing)
        monkeypatch.setenv(name, "1")
        monkeypatch.delenv(name)
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    monkeypatch.setenv("PADDLE_LOCAL_SIZE", "2")
    assert runtime.set_threads(loader_workers=1) == 3
    assert os.environ["OMP_NUM_THREADS"] == "3" and os.environ["OPENBLAS_NUM_THREADS"] == "1"
    assert not set(runtime.THREAD_VARIABLES) & set(runtime.user_environment())
    for name in runtime.THREAD_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    assert runtime.set_threads(loader_workers=4) == 1  # never 0
    monkeypatch.setenv("PADDLE_LOCAL_SIZE", "1")
    assert runtime.set_threads(loader_workers=0) == 1  # the variable now set stands (as a user's would)


COMMAND_PROBE = r'''
import json, sys

import mtl.cli

mtl.cli.main(sys.argv[1:])
import paddle  # noqa: E402,F401  (what eval, predict, embed... import inside their functions)
import threadpoolctl  # noqa: E402

pools = threadpoolctl.threadpool_info()
print(json.dumps({api: sorted({p["num_threads"] for p in pools if p["internal_api"] == api})
                  for api in ("openmp", "openblas")}))
'''


@pytest.mark.subprocess
def test_every_mtl_command_sets_the_threads_before_paddle_loads():
    """``mtl eval``, ``predict``, ``embed``... import Paddle inside their functions: the command line sets the thread
    counts first (cores / local processes for Paddle's pool, 1 for numpy's BLAS), where Paddle alone would take 1."""
    run_env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS",
                                                               "OPENBLAS_NUM_THREADS")}
    run_env.update(PYTHONPATH=ROOT)
    done = subprocess.run([sys.executable, "-c", COMMAND_PROBE, "plugins"], capture_output=True, text=True,
                          env=run_env, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"openmp": [int(CORES)], "openblas": [1]}


@pytest.mark.distributed
@pytest.mark.skipif(int(CORES) < 2, reason="one core: Paddle's 1 and the core count are the same")
def test_a_launched_rank_sets_its_own_threads(tmp_path):
    """``mtl launch`` imports Paddle's launcher, and Paddle's import sets OMP_NUM_THREADS=1, which every rank inherited
    and kept as the user's: launched ranks ran on one thread whatever the cores. The launcher now drops the variable
    when the user had not set it, and a rank sets cores / local processes (1 process here: the core count). A cold
    interpreter, never tests/warm_python.py's fork, which has imported Paddle."""
    script = os.path.join(ROOT, "tests", "dist_scripts", "thread_probe.py")
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS",
                                                           "OPENBLAS_NUM_THREADS")}
    env.update(PYTHONPATH=ROOT)
    done = subprocess.run([sys.executable, "-m", "mtl.cli", "launch", "--nproc_per_node", "1", "--log_dir",
                           str(tmp_path / "logs"), script], capture_output=True, text=True, cwd=ROOT, timeout=300,
                          env=env)
    log = (tmp_path / "logs" / "workerlog.0").read_text() if (tmp_path / "logs" / "workerlog.0").is_file() else ""
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:] + log[-3000:]
    probe = next(json.loads(line[len("PROBE "):]) for line in log.splitlines() if line.startswith("PROBE "))
    assert probe == {"omp": [int(CORES)], "started_with": None}, probe


@pytest.mark.distributed
def test_mtl_launch_with_ips_starts_one_group_of_the_listed_nodes(tmp_path):
    """``mtl launch --ips HOST --nproc_per_node 2`` (docs/distributed.md: the same command on every node listed):
    one node here, so 2 ranks of one group, both on this host (local processes 2, which the thread default divides the
    cores by), and a collective across them. Rank 0 starts the group a second late, and rank 1, there first, waits for
    its store instead of Paddle's 3 s retry (mtl.core.runtime.wait_for_master; the glog lines of the connection are on,
    to see it). Each rank's connection to the store sends at once (TCP_NODELAY, mtl.core.runtime.store_without_delay;
    without it every store request waited 40 ms for a delayed acknowledgement)."""
    script = os.path.join(ROOT, "tests", "dist_scripts", "launch_probe.py")
    done = warm_python.run([sys.executable, "-m", "mtl.cli", "launch", "--ips", "127.0.0.1", "--start_port",
                           str(free_port()), "--nproc_per_node", "2", "--log_dir", str(tmp_path / "logs"), script],
                          capture_output=True, text=True, cwd=ROOT, timeout=300,
                          env=dict(launcher_env(), PROBE_RANK0_DELAY="1", GLOG_minloglevel="0"))
    logs = "".join((tmp_path / "logs" / f"workerlog.{k}").read_text() for k in range(2)
                   if (tmp_path / "logs" / f"workerlog.{k}").is_file())
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:] + logs[-3000:]
    probes = sorted((json.loads(line[len("PROBE "):]) for line in logs.splitlines() if line.startswith("PROBE ")),
                    key=lambda p: p["rank"])
    assert [(p["rank"], p["world"], p["local"], p["sum"]) for p in probes] == [(0, 2, 2, 3.0), (1, 2, 2, 3.0)]
    assert all(len(p["endpoints"].split(",")) == 2 and p["endpoints"].startswith("127.0.0.1:") for p in probes)
    assert "Successfully connected" in logs and "Retry to connect" not in logs, logs[-3000:]
    assert [p["store_nodelay"] for p in probes] == [[1], [1]], probes
