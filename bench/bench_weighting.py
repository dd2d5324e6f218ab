"""Task-weighting strategies on the digits demo: step time and memory against ``static``, and Δm (mtl baseline).

Two parts, both on ``examples/configs/demo.yaml`` (three tasks on one CNN):

* cost: every strategy's median training-step time on the same batches, relative to ``static`` measured in the same
  run (one child process per strategy, so that its peak resident memory is its own); the memory the strategy adds
  is ``T x |theta|`` float32 for gradient-based strategies (the per-task shared gradients, measured from the
  backbone's size) plus the strategy's own state (DB-MTL's T x |theta| float64 moving average) and the peak
  resident set of the child;
* benefit (``--delta-m``): each strategy trains the demo for ``--steps`` steps; ``mtl baseline`` gives the
  single-task runs (shared by all strategies) and Δm.

``--write`` puts the table into the README between the ``weighting-table`` markers (and docs/weighting_benchmark.md).

    python bench/bench_weighting.py [--timing-steps 20] [--delta-m --steps 300] [--write]
"""
import argparse
import json
import os
import resource
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

DEMO = os.path.join(ROOT, "examples", "configs", "demo.yaml")
STRATEGIES = {
    "static": "{type: static}", "uncertainty": "{type: uncertainty}", "dwa": "{type: dwa}", "rlw": "{type: rlw}",
    "famo": "{type: famo}", "gradnorm": "{type: gradnorm}", "pcgrad": "{type: pcgrad}", "cagrad": "{type: cagrad}",
    "mgda": "{type: mgda}", "mgda_ub": "{type: mgda, representation: true}",
    "nash_mtl": "{type: nash_mtl}", "imtl_g": "{type: imtl_g}", "imtl_l": "{type: imtl_l}",
    "aligned_mtl": "{type: aligned_mtl}", "upgrad": "{type: upgrad}", "db_mtl": "{type: db_mtl}",
    "gradvac": "{type: gradvac}", "graddrop": "{type: graddrop}", "stch": "{type: stch}",
    "fairgrad": "{type: fairgrad}",
}
QUIET = ["log.progress=false", "log.plot=false", "data.num_workers=0", "eval.every=0", "checkpoint.every=0"]
BEGIN, END = "<!-- weighting-table -->", "<!-- /weighting-table -->"


def child_timing(name, steps, out):
    """In a child process: time ``steps`` training steps of the demo with strategy ``name``; print JSON."""
    import numpy as np

    from mtl.config.loading import load_job
    from mtl.core.runtime import select_device
    from mtl.data.steps import StepDataset
    from mtl.train.job import build_job
    from mtl.train.step import as_tensors
    from mtl.train.trainer import Trainer

    select_device("cpu")
    cfg = load_job(DEMO, [f"weighting={STRATEGIES[name]}", f"output_dir={out}", "averaging.type=none"] + QUIET)
    job = build_job(cfg)
    trainer = Trainer(job, console=lambda *a: None, overwrite=True)
    dataset = StepDataset(job.schedule, {t.name: t.reader for t in job.tasks}, cfg["seed"], 0, steps + 3)
    times = []
    for step in range(steps + 3):
        batch = as_tensors(dataset[step])  # outside the timing, as the DataLoader does it
        start = time.perf_counter()
        trainer.train_step(batch, step)
        times.append(time.perf_counter() - start)
    shared = sum(int(p.numel()) for p in job.model.backbone.parameters() if not p.stop_gradient)
    weighting = trainer.balancer.weighting
    added = len(job.tasks) * shared * 4 if weighting.needs_gradients and not weighting.uses_representation else 0
    added += sum(v.nbytes for v in weighting.state_dict().values() if isinstance(v, np.ndarray))  # DB-MTL: 8 T P
    times = sorted(times[3:])
    print(json.dumps({"median": times[len(times) // 2], "added_bytes": added,
                      "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))


def timing(steps, out_root):
    """``{name: {median, added_bytes, peak_mib}}`` for every strategy, one child process each."""
    results = {}
    for name in STRATEGIES:
        out = os.path.join(out_root, "timing", name)
        proc = subprocess.run([sys.executable, __file__, "--child", name, "--timing-steps", str(steps), "--out", out],
                              capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
        if proc.returncode != 0:
            raise SystemExit(f"{name}: {proc.stderr[-2000:]}")
        results[name] = json.loads(proc.stdout.strip().splitlines()[-1])
        print(f"  {name:12s} {results[name]['median'] * 1000:7.1f} ms/step", flush=True)
    return results


def delta_ms(steps, out_root):
    """``{name: Δm%}``: ``mtl baseline`` of the demo under every strategy (the single-task runs are shared)."""
    from mtl.config.loading import load_job
    from mtl.studies.comparison import run_baselines, single_task_config, sub_batches

    values, singles_dir = {}, os.path.join(out_root, "singles")
    for name in STRATEGIES:
        cfg = load_job(DEMO, [f"weighting={STRATEGIES[name]}", f"output_dir={os.path.join(out_root, name)}",
                              f"schedule.steps={steps}"] + QUIET)
        for task, size in sub_batches(cfg).items():  # one shared set of single-task runs
            single = single_task_config(cfg, task, size)
            os.makedirs(os.path.join(cfg["output_dir"], "baselines"), exist_ok=True)
            link = single["output_dir"]
            target = os.path.join(singles_dir, task)
            os.makedirs(target, exist_ok=True)
            if not os.path.islink(link):
                os.symlink(target, link)
        values[name] = run_baselines(cfg, console=lambda *a: None)["delta_m"]
        print(f"  {name:12s} Δm {values[name]:+.2f} %", flush=True)
    return values


def table(times, deltas, steps):
    """The markdown table (strategy, Δm, step-time ratio, added memory, peak resident memory)."""
    from tabulate import tabulate

    base = times["static"]["median"]
    rows = [[name, f"{deltas[name]:+.2f}" if deltas else "", f"{times[name]['median'] / base:.2f}",
             f"{times[name]['added_bytes'] / 2 ** 20:.1f}", f"{times[name]['peak_mib']:.0f}"] for name in STRATEGIES]
    headers = ["weighting", f"Δm % ({steps} steps)" if deltas else "Δm %", "step time / static",
               "added MiB (T x shared grad, state)", "peak RSS MiB"]
    return tabulate(rows, headers=headers, tablefmt="github", disable_numparse=True)


def write(text):
    """Put ``text`` into the README between the markers and into docs/weighting_benchmark.md."""
    readme = os.path.join(ROOT, "README.md")
    with open(readme) as f:
        content = f.read()
    if BEGIN in content and END in content:
        head, rest = content.split(BEGIN, 1)
        content = head + BEGIN + "\n" + text + "\n" + END + rest.split(END, 1)[1]
        with open(readme, "w") as f:
            f.write(content)
    with open(os.path.join(ROOT, "docs", "weighting_benchmark.md"), "w") as f:
        f.write("# Task weighting on the digits demo (bench/bench_weighting.py)\n\n" + text + "\n")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--timing-steps", type=int, default=20)
    parser.add_argument("--delta-m", action="store_true", help="also train every strategy and compute Δm")
    parser.add_argument("--steps", type=int, default=300, help="training steps of the Δm runs")
    parser.add_argument("--out", default=os.path.join(ROOT, "runs", "bench_weighting"))
    parser.add_argument("--write", action="store_true", help="write the table into README.md and docs/")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child_timing(args.child, args.timing_steps, args.out)
    print(f"step time of each strategy on the digits demo ({args.timing_steps} steps, 1 process):")
    times = timing(args.timing_steps, args.out)
    deltas = None
    if args.delta_m:
        print(f"Δm of each strategy ({args.steps} training steps, single-task baselines shared):")
        deltas = delta_ms(args.steps, args.out)
    text = table(times, deltas, args.steps)
    print("\n" + text)
    if args.write:
        write(text)


if __name__ == "__main__":
    main()
