"""Time from SIGTERM to exit of a job with a 1M-class ArcFace head (one process, CPU).

    python bench/bench_stop_time.py [--classes 1000000] [--dim 128]

Starts ``examples/train_joint.py`` on synthetic 64-d inputs, an MLP to ``--dim`` features and one ArcFace head of
``--classes`` classes (momentum, no averaging), waits until it has logged a few steps, sends SIGTERM and times the
exit (the step in flight, one checkpoint written and hashed, the stop sentence). It then times one verification pass
of that checkpoint (``mtl.store.integrity.verify``): the second hash the stop path used to run before exiting, which
it no longer does. Prints both and their ratio.
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def job(folder, classes, dim):
    data = {"seed": 0, "output_dir": os.path.join(folder, "run"), "device": "cpu",
            "tasks": [{"name": "ids", "reader": {"type": "synthetic", "num_samples": 10 * classes,
                                                 "num_classes": classes, "shape": [1, 8, 8]},
                       "head": {"type": "arcface", "scale": 32.0}, "eval": None}],
            "backbone": {"type": "mlp", "input_shape": [1, 8, 8], "hidden": [dim], "embedding_size": dim},
            "schedule": {"batch_size": 64, "steps": 100000}, "checkpoint": {"every": 0, "keep": 1},
            "averaging": {"type": "none"}, "log": {"every": 1, "progress": False, "plot": False},
            "data": {"num_workers": 0}}
    path = os.path.join(folder, "job.json")
    with open(path, "w") as f:
        json.dump(data, f)
    return path


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--classes", type=int, default=1_000_000)
    parser.add_argument("--dim", type=int, default=128)
    args = parser.parse_args()
    from mtl.store import integrity, layout

    with tempfile.TemporaryDirectory(prefix="mtl_stop_bench_") as folder:
        config = job(folder, args.classes, args.dim)
        proc = subprocess.Popen([sys.executable, os.path.join(ROOT, "examples", "train_joint.py"), config],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=dict(os.environ, PYTHONPATH=ROOT))
        metrics = os.path.join(folder, "run", "metrics.jsonl")
        while not (os.path.isfile(metrics) and sum(1 for _ in open(metrics)) >= 3):
            if proc.poll() is not None:
                raise SystemExit(f"the job ended first: {proc.stderr.read()[-2000:]}")
            time.sleep(0.5)
        signalled = time.perf_counter()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=600)
        stop = time.perf_counter() - signalled
        ckpt = layout.latest_checkpoint(os.path.join(folder, "run"))
        size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(ckpt) for f in fs) / 2 ** 30
        started = time.perf_counter()
        assert integrity.verify(ckpt) == ""
        verify = time.perf_counter() - started
    print(f"{args.classes} classes x {args.dim}: exit status {proc.returncode} ({err.strip().splitlines()[-1][:90]})")
    print(f"  signal to exit: {stop:.2f} s (checkpoint {size:.2f} GiB written and hashed once)")
    print(f"  one more verification pass (what the stop path no longer runs): {verify:.2f} s "
          f"({verify / stop:.2f} of the stop time)")


if __name__ == "__main__":
    main()
