"""The margin head's chunk passes in numpy on the CPU tensors' memory (``mtl/headkit/host_chunks.py``, the CPU default)
against the same passes in Paddle ops (the device path, forced on CPU): step time, one process, same run.

One step = forward + backward + momentum update of the ``arcface`` head (``bench/_margin_worker.py``), D = 128,
global batch 128, C in {100k, 1M} (``--quick``: 100k), full softmax and Partial FC 0.1, all cores to the one process.
The two variants alternate (the order flips every round) because the machine is shared. Prints the median step
times and host / device.

    .venv/bin/python bench/bench_host_passes.py [--quick] [--rounds N]
"""
import argparse
import os
import sys

import numpy as np
from tabulate import tabulate

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_margin_head import run_worker  # noqa: E402

STEPS = {100_000: (1, 5), 1_000_000: (1, 2)}  # classes -> (warm-up steps, timed steps)


def measure(classes, rounds):
    """``{(C, ratio): {"host": [times], "device": [times]}}`` over interleaved rounds."""
    times = {}
    for round_index in range(rounds):
        variants = ("host", "device") if round_index % 2 == 0 else ("device", "host")
        for num_classes in classes:
            warmup, steps = STEPS[num_classes]
            for ratio in (1.0, 0.1):
                for variant in variants:
                    args = ["--classes", num_classes, "--sample-ratio", ratio, "--warmup", warmup, "--steps", steps]
                    if variant == "device":
                        args.append("--device-passes")
                    record = run_worker(1, args)[0]
                    times.setdefault((num_classes, ratio), {}).setdefault(variant, []).extend(record["times"])
                    print(f"  round {round_index + 1}: C={num_classes:,} ratio={ratio} {variant}: "
                          f"{1000 * np.median(record['times']):.1f} ms/step", flush=True)
    return times


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="C = 100k only")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args(argv)
    classes = [100_000] if args.quick else [100_000, 1_000_000]
    rows = []
    for (num_classes, ratio), found in measure(classes, args.rounds).items():
        host, device = np.median(found["host"]), np.median(found["device"])
        rows.append((f"{num_classes:,}", ratio, f"{1000 * host:.1f}", f"{1000 * device:.1f}", f"{host / device:.2f}"))
    print(tabulate(rows, headers=["classes", "sample ratio", "host ms/step", "device ms/step", "host / device"],
                   tablefmt="github"))


if __name__ == "__main__":
    main()
