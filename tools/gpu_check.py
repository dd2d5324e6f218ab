"""One command for a GPU machine: the GPU paths, run and measured, into one JSON file (docs/gpu.md).

    python tools/gpu_check.py --json gpu_check.json                      # a GPU machine: under 8 minutes on one GPU
    python tools/gpu_check.py --device cpu --tiny --json /tmp/check.json   # the same code on the CPU, tiny sizes

Checks (each ``pass``, ``fail`` or ``skip`` with its figures; ``--only NAME ...`` runs some):

* ``tests``: the in-process test suite (not distributed, slow or subprocess) with the device as Paddle's place
  (``MTL_TEST_DEVICE``, tests/conftest.py); failing test ids are listed.
* ``heads``: the margin head on the device against the CPU on the same weights and batch: full softmax, Partial FC
  and the fused ``margin_cross_entropy`` (GPU only), loss, feature and class-centre gradients, top-1.
* ``precision``: a short training in fp32, bf16 and fp16 at amp_level O1 and O2 against fp32, with the final
  evaluation (O2 evaluation runs under auto_cast) and the export of the O2 run.
* ``resume``: a run stopped half-way and resumed against the uninterrupted one: every step's loss and the final
  weights, bit for bit (cuDNN deterministic, the head's scatter without atomics, dropout's generator restored).
* ``export``: the exported inference model against the in-training backbone.
* ``throughput``: iResNet-50 + Partial FC on synthetic data: samples/s, step time, peak device memory and host reads
  per step (tests/host_syncs.py).

The exit status is 0 when no check failed. On the CPU ``heads`` compares the device passes (Paddle ops, what a GPU
runs) with the host passes, and every precision runs in float32 (Paddle's CPU build has no bf16/fp16 kernels).
"""
import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import traceback

from mtl.core.safe_pickle import load_paddle_file

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

SIZES = {
    "full": {"head": {"classes": 100_000, "dim": 512, "rows": 256}, "input": 32, "steps": 20,
             "throughput": {"backbone": "iresnet50", "input": 112, "batch": 128, "classes": 100_000, "warmup": 10,
                            "steps": 40, "workers": 4},
             "pytest": ["-m", "not distributed and not slow and not subprocess"]},
    "tiny": {"head": {"classes": 50, "dim": 8, "rows": 6}, "input": 8, "steps": 4,
             "throughput": {"backbone": "iresnet18", "input": 16, "batch": 4, "classes": 40, "warmup": 1,
                            "steps": 2, "workers": 0},
             "pytest": ["tests/test_gpu_heads.py"]},
}
PRECISIONS = [("fp32", "O1"), ("bf16", "O1"), ("bf16", "O2"), ("fp16", "O1"), ("fp16", "O2")]
HEAD_TOLERANCE = 2e-3  # relative, float32: the CPU and the GPU sum in other orders (cuBLAS, reductions)
PRECISION_TOLERANCE = 0.1  # relative difference of the last steps' mean loss against fp32


def relative(a, b) -> float:
    """``max |a - b| / max(max |b|, 1e-12)`` of two arrays (or numbers)."""
    import numpy as np

    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(np.max(np.abs(a - b)) / max(float(np.max(np.abs(b))), 1e-12)) if b.size else 0.0


def check_tests(device, sizes, args):
    """The in-process tests with ``device`` as Paddle's place, in a pytest process of their own."""
    env = dict(os.environ, MTL_TEST_DEVICE=device, OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rf", *(args.pytest or sizes["pytest"])]
    started = time.time()
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    failed = [line.split()[1] for line in out.stdout.splitlines() if line.startswith("FAILED ")]
    summary = next((line for line in reversed(out.stdout.splitlines()) if " in " in line and "=" in line
                    or line.startswith(tuple("0123456789"))), "")
    result = {"status": "pass" if out.returncode == 0 else "fail", "summary": summary.strip("= "),
              "failed": failed, "seconds": round(time.time() - started, 1)}
    if out.returncode != 0:
        result["output_tail"] = (out.stdout + out.stderr).splitlines()[-40:]
    return result


def _head_step(device, x, y, weight, sample_ratio=1.0, fused=False, host=True, margin=(1.0, 0.5, 0.0)):
    """Loss, feature gradient, dense class-centre gradient and top-1 of one margin-head step on ``device``."""
    import paddle

    from mtl.core import arrays
    from mtl.core.registry import plugin_class

    ArcFaceHead = plugin_class("head", "arcface")

    paddle.set_device(device)
    arrays.HOST_PATHS = host
    try:
        head = ArcFaceHead(num_classes=weight.shape[0], feature_size=weight.shape[1], margin=list(margin), scale=64.0,
                           sample_ratio=sample_ratio, fused="true" if fused else "false", seed=0)
        head.weight.set_value(paddle.to_tensor(weight))
        features = paddle.to_tensor(x, stop_gradient=False)
        out = head(features, paddle.to_tensor(y), 0)
        out.loss.backward()
        return (float(out.loss), features.grad.numpy(), head.weight_gradient(out), float(out.metrics["accuracy"]))
    finally:
        arrays.HOST_PATHS = True


def check_heads(device, sizes, args):
    """Full softmax, Partial FC and (GPU) the fused path on ``device`` against the CPU host path, same weights."""
    import numpy as np

    size = sizes["head"]
    rng = np.random.default_rng(0)
    x = rng.standard_normal((size["rows"], size["dim"])).astype(np.float32)
    y = rng.integers(0, size["classes"], size["rows"])
    y[1] = y[0]  # a shared target
    weight = (rng.standard_normal((size["classes"], size["dim"])) * 0.01).astype(np.float32)
    results = {}
    for name, ratio, fused in (("full", 1.0, False), ("partial_fc", 0.1, False), ("fused", 1.0, True)):
        if fused and not device.startswith("gpu"):
            results[name] = {"status": "skip", "reason": "margin_cross_entropy has no CPU kernel"}
            continue
        margin = (1.0, 0.0, 0.35) if fused else (1.0, 0.5, 0.0)  # fused: a margin its kernel computes exactly
        reference = _head_step("cpu", x, y, weight, ratio, margin=margin)
        got = _head_step(device, x, y, weight, ratio, fused=fused, host=False, margin=margin)
        diffs = {"loss": relative(got[0], reference[0]), "feature_grad": relative(got[1], reference[1]),
                 "centre_grad": relative(got[2], reference[2]), "accuracy": abs(got[3] - reference[3])}
        ok = max(diffs["loss"], diffs["feature_grad"], diffs["centre_grad"]) <= HEAD_TOLERANCE and \
            diffs["accuracy"] <= 2.0 / size["rows"]
        results[name] = {"status": "pass" if ok else "fail", "relative_difference": diffs}
    return _combine(results)


def _combine(parts):
    """One check's result from its parts: fail if any failed, else pass if any passed, else skip."""
    statuses = {part["status"] for part in parts.values()}
    status = "fail" if "fail" in statuses else "pass" if "pass" in statuses else "skip"
    return {"status": status, **parts}


def job_data(folder, device, sizes, precision="fp32", amp_level="O1", dropout=0.0):
    """A small two-task job: a BatchNorm CNN, ArcFace (full) and ArcFace with Partial FC, evaluated at the end."""
    side = sizes["input"]

    def reader(seed, classes):
        return {"type": "synthetic", "num_samples": 64, "num_classes": classes, "shape": [3, side, side],
                "seed": seed}

    return {"seed": 0, "output_dir": str(folder), "device": device, "precision": precision, "amp_level": amp_level,
            "tasks": [{"name": "ids", "reader": reader(1, 12), "head": {"type": "arcface", "scale": 16.0}},
                      {"name": "pfc", "reader": reader(2, 40),
                       "head": {"type": "arcface", "scale": 16.0, "sample_ratio": 0.3}}],
            "backbone": {"type": "cnn", "in_channels": 3, "input_size": side, "embedding_size": 16,
                         "output": "flatten", "dropout": dropout},
            "schedule": {"batch_size": 16, "steps": sizes["steps"]},
            "optimizer": {"type": "momentum", "lr": 0.05},
            "log": {"every": 1, "progress": False, "plot": False}, "data": {"num_workers": 0}}


def train(data, resume=False, until=None):
    """Build and train the job ``data`` in this process; returns (trainer, per-step records)."""
    from mtl.config.loading import load_job
    from mtl.core.runtime import select_device
    from mtl.train.job import build_job
    from mtl.train.trainer import Trainer

    cfg = load_job(data=data)
    select_device(cfg["device"], cfg["source"])
    trainer = Trainer(build_job(cfg, announce_plan=False), resume=resume, console=lambda *a: None)
    trainer.run(until=until)
    with open(os.path.join(data["output_dir"], "metrics.jsonl")) as f:
        records = [json.loads(line) for line in f if '"step"' in line]
    return trainer, [r for r in records if "loss" in r]


def check_precision(device, sizes, args):
    """Every precision mode against fp32: the last steps' loss, finiteness, the final evaluation, the O2 export."""
    import math

    results, reference = {}, None
    for precision, level in PRECISIONS:
        name = f"{precision}_{level}"
        folder = os.path.join(args.work, f"precision_{name}")
        trainer, records = train(job_data(folder, device, sizes, precision, level))
        losses = [r["loss"] for r in records]
        tail = sum(losses[-5:]) / len(losses[-5:])
        reference = tail if reference is None else reference
        entry = {"dtype": trainer.autocast.dtype or "float32", "final_loss": losses[-1], "tail_mean_loss": tail,
                 "relative_to_fp32": abs(tail - reference) / max(abs(reference), 1e-12)}
        finite = all(math.isfinite(v) for v in losses)
        entry["status"] = "pass" if finite and entry["relative_to_fp32"] <= PRECISION_TOLERANCE else "fail"
        if level == "O2":
            entry["export"] = _export_difference(folder, trainer)
        results[name] = entry
    return _combine(results)


def _export_difference(run_dir, trainer):
    """Relative difference of the exported model's embeddings against the training backbone (eval mode)."""
    import numpy as np
    import paddle

    from mtl.core.low_precision import float32, inference_autocast
    from mtl.serving.export import embed, export

    out = run_dir + "_export"
    export(run_dir, out)
    field = trainer.job.backbone.input_fields()[0]
    x = np.random.default_rng(1).standard_normal((5, *field.shape)).astype(np.float32)
    np.save(os.path.join(out, "x.npy"), x)
    backbone = trainer.job.model.backbone
    backbone.eval()
    with paddle.no_grad(), inference_autocast(backbone):
        reference = float32(backbone({field.name: paddle.to_tensor(x)})).numpy()
    return relative(embed(out, [os.path.join(out, "x.npy")]), reference)


def check_export(device, sizes, args):
    """The exported float32 model against the in-training backbone of a float32 run."""
    folder = os.path.join(args.work, "export_run")
    trainer, _ = train(job_data(folder, device, sizes))
    difference = _export_difference(folder, trainer)
    return {"status": "pass" if difference <= 1e-4 else "fail", "relative_difference": difference}


def check_resume(device, sizes, args):
    """Stopped half-way and resumed (a new Trainer) against uninterrupted: every step's loss and the final weights."""
    import numpy as np

    from mtl.store.layout import latest_checkpoint

    runs = {}
    for name in ("uninterrupted", "resumed"):
        data = job_data(os.path.join(args.work, f"resume_{name}"), device, sizes, dropout=0.2)
        if name == "resumed":
            train(data, until=sizes["steps"] // 2)
        _, records = train(data, resume=name == "resumed")
        ckpt = latest_checkpoint(data["output_dir"])
        weights = load_paddle_file(os.path.join(ckpt, "backbone.pdparams"))
        runs[name] = ({r["step"]: r["loss"] for r in records}, weights)
    (losses_a, weights_a), (losses_b, weights_b) = runs["uninterrupted"], runs["resumed"]
    steps_equal = sorted(losses_a) == sorted(losses_b) and all(losses_a[s] == losses_b[s] for s in losses_a)
    differing = [k for k in weights_a if not np.array_equal(weights_a[k], weights_b[k])]
    return {"status": "pass" if steps_equal and not differing else "fail", "steps": len(losses_a),
            "losses_bit_identical": steps_equal, "weights_differing": differing[:10],
            "largest_loss_difference": max(abs(losses_a[s] - losses_b.get(s, float("nan"))) for s in losses_a)}


def throughput_data(folder, device, size):
    """iResNet + Partial FC (10 % of the classes) on synthetic images."""
    side = size["input"]
    return {"seed": 0, "output_dir": str(folder), "device": device,
            "tasks": [{"name": "faces", "reader": {"type": "synthetic", "num_samples": 100_000,
                                                   "num_classes": size["classes"], "shape": [3, side, side]},
                       "head": {"type": "arcface", "sample_ratio": 0.1}, "eval": {"enabled": False}}],
            "backbone": {"type": size["backbone"], "input_size": side, "embedding_size": 512},
            "schedule": {"batch_size": size["batch"], "steps": size["warmup"] + size["steps"]},
            "optimizer": {"type": "momentum", "lr": 0.1, "weight_decay": 5e-4},
            "log": {"progress": False, "plot": False}, "data": {"num_workers": size["workers"]}}


def check_throughput(device, sizes, args):
    """Steps after a warm-up: samples/s, mean step time, peak device memory and host reads per step."""
    import paddle

    from mtl.config.loading import load_job
    from mtl.core.runtime import select_device
    from mtl.data.steps import make_loader
    from mtl.train.job import build_job
    from mtl.train.trainer import Trainer
    from tests.host_syncs import HostSyncCounter

    size = sizes["throughput"]
    cfg = load_job(data=throughput_data(os.path.join(args.work, "throughput"), device, size))
    select_device(cfg["device"], cfg["source"])
    trainer = Trainer(build_job(cfg, announce_plan=False), console=lambda *a: None)
    loader = make_loader(trainer._dataset(size["warmup"] + size["steps"]), size["workers"])
    counter, started, seconds = HostSyncCounter(), None, []
    for step, batch in enumerate(loader):
        if step == size["warmup"]:
            _synchronize(device)
            started = time.time()
        with counter:
            if step == size["warmup"]:
                counter.reset()
            begin = time.time()
            trainer.train_step(batch, step)
        seconds.append(time.time() - begin)
    _synchronize(device)
    elapsed = time.time() - started
    peak = paddle.device.cuda.max_memory_allocated() if device.startswith("gpu") else None
    return {"status": "pass", "backbone": size["backbone"], "batch": size["batch"], "classes": size["classes"],
            "samples_per_s": round(size["batch"] * size["steps"] / elapsed, 1),
            "step_ms": round(1000 * elapsed / size["steps"], 1), "first_step_ms": round(1000 * seconds[0], 1),
            "peak_device_memory_gib": None if peak is None else round(peak / 2 ** 30, 2),
            "host_reads_per_step": counter.count / size["steps"], "host_read_sites": dict(counter.sites)}


def _synchronize(device):
    import paddle

    if device.startswith("gpu"):
        paddle.device.synchronize()


CHECKS = {"tests": check_tests, "heads": check_heads, "precision": check_precision, "resume": check_resume,
          "export": check_export, "throughput": check_throughput}


def environment(device):
    """What ran: Paddle's version and build, the device, the GPU's name and compute capability."""
    import paddle

    info = {"device": device, "paddle": paddle.__version__, "cuda_build": paddle.device.is_compiled_with_cuda(),
            "cuda": paddle.version.cuda(), "cudnn": paddle.version.cudnn(), "python": platform.python_version()}
    if device.startswith("gpu"):
        info["gpu"] = paddle.device.cuda.get_device_name()
        info["compute_capability"] = list(paddle.device.cuda.get_device_capability())
    return info


def run_checks(names, device, sizes, args):
    """``{name: result}``; a check that raises is a failure with its traceback's last lines."""
    results = {}
    for name in names:
        started = time.time()
        print(f"gpu_check: {name} ...", flush=True)
        try:
            results[name] = CHECKS[name](device, sizes, args)
        except Exception:  # noqa: BLE001 - every failure is a finding to report, not a reason to stop
            results[name] = {"status": "fail", "error": traceback.format_exc().strip().splitlines()[-8:]}
        results[name]["seconds"] = round(time.time() - started, 1)
        print(f"gpu_check: {name}: {results[name]['status']} ({results[name]['seconds']} s)", flush=True)
    return results


def parse_args(argv):
    """The command line (module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", choices=["auto", "gpu", "cpu"], default="auto")
    parser.add_argument("--tiny", action="store_true", help="tiny sizes (the CPU test of this tool)")
    parser.add_argument("--only", nargs="+", choices=list(CHECKS), help="run these checks only")
    parser.add_argument("--json", help="write the results to this file")
    parser.add_argument("--pytest", nargs=argparse.REMAINDER, help="arguments for the tests check's pytest")
    parser.add_argument("--work", help="folder for the runs (default: a temporary one)")
    return parser.parse_args(argv)


def main(argv=None):
    """Run the checks, print one line each, write ``--json``; exit status 0 when none failed."""
    args = parse_args(argv)
    import paddle

    from mtl.core.runtime import resolve_device

    compiled = paddle.device.is_compiled_with_cuda()
    device, _ = resolve_device(args.device, compiled and paddle.device.cuda.device_count() > 0, compiled)
    sizes = SIZES["tiny" if args.tiny else "full"]
    with tempfile.TemporaryDirectory(prefix="gpu_check_") as folder:
        args.work = args.work or folder
        started = time.time()
        results = run_checks(args.only or list(CHECKS), device, sizes, args)
    summary = {"environment": environment(device), "sizes": "tiny" if args.tiny else "full", "checks": results,
               "failed": [name for name, r in results.items() if r["status"] == "fail"],
               "seconds": round(time.time() - started, 1)}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1, default=str)
    print(f"gpu_check: {len(results) - len(summary['failed'])} of {len(results)} checks without failure"
          + (f"; failed: {', '.join(summary['failed'])}" if summary["failed"] else ""), flush=True)
    return 1 if summary["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
