"""Per-step overhead and extra memory of weight averaging, as ratios against no averaging, measured in one run.

An iresnet-sized parameter set (~20M float32 in conv-like and fc-like tensors; ~1M with ``--quick``) is trained by
plain SGD. Each variant runs in its own fresh process (so resident-memory deltas are its own):
  none:            SGD step only (the baseline);
  ours-device:     + ``mtl.train.averaging.WindowAverage`` (sums next to the parameters);
  ours-offload:    + ``mtl.train.averaging.WindowAverage(offload="cpu")`` (sums and restore copy in host memory);
  ours-ema:        + ``mtl.train.averaging.EMA``;
  paddle:          + ``paddle.incubate.ModelAverage``.
Reported: median step time (SGD + averager), the averager's part of it, and the step's ratio to SGD steps timed
alone just before in the same process (the machine's load varies between processes); bytes
held by the averager's arrays after the steps and while ``apply()`` is active, as multiples of the parameter bytes;
the process's resident set growth (VmRSS) over the steps and its peak (VmHWM) including one apply/restore, as a
ratio to ``none``; the apply+restore time.
The window is min 3 / max 8 / rate 0.15, so steady state (sum_3 present) is reached within the run.
On the CPU wheel "device" and "host" are the same memory: offloading shows in the held-bytes column, not in RSS.

    python bench/bench_averaging.py [--quick] [--steps N]
"""
import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
VARIANTS = ("none", "ours-device", "ours-offload", "ours-ema", "paddle")


def parameter_shapes(quick):
    """Shapes of an iresnet-like parameter set: 3x3 convs, BatchNorm vectors and one wide fc (~20M floats)."""
    width = 128 if quick else 512
    shapes = [[width, width, 3, 3]] * 6 + [[width]] * 40 + [[width * 7 * 7 // 4, width]]
    return shapes


def resident_kib(field="VmRSS") -> int:
    """A field of /proc/self/status in KiB (VmRSS: resident now, VmHWM: peak resident)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def paddle_held_bytes(stock) -> int:
    """Bytes of every accumulator tensor of a ``paddle.incubate.ModelAverage``."""
    return sum(int(np.prod(t.shape)) * t.element_size() for acc in stock._accumulators.values() for t in acc.values())


def run_variant(variant, quick, steps):
    """Time ``steps`` SGD (+ averaging) steps in this process and return the measurements as a dict."""
    import paddle

    from mtl.train.averaging import EMA, WindowAverage

    paddle.seed(0)
    params = {f"p{i}": paddle.create_parameter(shape, "float32") for i, shape in enumerate(parameter_shapes(quick))}
    sum(p.sum() for p in params.values()).backward()  # every parameter holds a gradient (kept: no clear_grad)
    optimizer = paddle.optimizer.SGD(1e-3, parameters=list(params.values()))
    optimizer.step()
    param_bytes = sum(int(np.prod(p.shape)) * 4 for p in params.values())
    sgd_times = []
    for _ in range(steps):  # the no-averaging step, timed in this same process (load on the machine varies)
        start = time.perf_counter()
        optimizer.step()
        sgd_times.append(time.perf_counter() - start)
    rss_before = resident_kib()
    averager = {"none": lambda: None,
                "ours-device": lambda: WindowAverage(params, 0.15, 3, 8),
                "ours-offload": lambda: WindowAverage(params, 0.15, 3, 8, offload="cpu"),
                "ours-ema": lambda: EMA(params, 0.999),
                "paddle": lambda: paddle.incubate.ModelAverage(0.15, parameters=list(params.values()),
                                                               min_average_window=3, max_average_window=8)}[variant]()
    times, averager_times = [], []
    for _ in range(steps):
        start = time.perf_counter()
        optimizer.step()
        middle = time.perf_counter()
        if averager is not None:
            averager.step()
        end = time.perf_counter()
        times.append(end - start)
        averager_times.append(end - middle)
    rss_after = resident_kib()
    held = held_apply = 0
    apply_ms = 0.0
    if averager is not None:
        held = paddle_held_bytes(averager) if variant == "paddle" else sum(averager.nbytes().values())
        start = time.perf_counter()
        with averager.apply():
            held_apply = paddle_held_bytes(averager) if variant == "paddle" else sum(averager.nbytes().values())
        apply_ms = 1000 * (time.perf_counter() - start)
    skip = 2 if steps > 4 else 0  # the first steps allocate the sums
    return {"variant": variant, "step_ms": 1000 * float(np.median(times[skip:])),
            "averager_ms": 1000 * float(np.median(averager_times[skip:])),
            "sgd_ms": 1000 * float(np.median(sgd_times[skip:])),
            "param_bytes": param_bytes, "held": held, "held_apply": held_apply, "apply_ms": apply_ms,
            "rss_growth_kib": rss_after - rss_before, "peak_kib": resident_kib("VmHWM")}


def measure(variant, quick, steps):
    """Run one variant in a fresh Python process and return its measurements."""
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    args = [sys.executable, os.path.abspath(__file__), "--child", variant, "--steps", str(steps)]
    out = subprocess.run(args + (["--quick"] if quick else []), env=env, cwd=ROOT, check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def report(results):
    """The table of ratios against the ``none`` row."""
    from tabulate import tabulate

    base = results["none"]
    rows = []
    for variant in VARIANTS:
        r = results[variant]
        rows.append([variant, f"{r['step_ms']:.1f}", f"{r['averager_ms']:.2f}", f"{r['step_ms'] / r['sgd_ms']:.2f}",
                     f"{r['held'] / r['param_bytes']:.2f}", f"{r['held_apply'] / r['param_bytes']:.2f}",
                     f"{r['rss_growth_kib'] / 1024:.0f}", f"{r['peak_kib'] / base['peak_kib']:.2f}",
                     f"{r['apply_ms']:.0f}"])
    headers = ["variant", "step ms", "of which averager", "step / none", "held / params", "held in apply / params",
               "RSS growth MiB", "peak RSS / none", "apply+restore ms"]
    millions = base["param_bytes"] / 4 / 1e6
    return f"{millions:.1f}M float32 parameters ({base['param_bytes'] / 2**20:.0f} MiB)\n" + tabulate(rows, headers)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="~1M parameters instead of ~20M")
    parser.add_argument("--steps", type=int, help="timed steps per variant (default 20, 40 with --quick)")
    parser.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.steps = args.steps or (40 if args.quick else 20)
    if args.child:
        print(json.dumps(run_variant(args.child, args.quick, args.steps)))
        return
    results = {variant: measure(variant, args.quick, args.steps) for variant in VARIANTS}
    print(report(results))


if __name__ == "__main__":
    main()
