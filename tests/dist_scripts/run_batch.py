"""Run several independent jobs one after the other in the same processes (tests/shared_runs.py): every 2-process run
of a test session in one launch of ``python -m paddle.distributed.launch --nproc_per_node 2 run_batch.py SPEC``.

SPEC is a JSON list of entries, each ``{"name": ..., "train": ARGV}`` (what ``examples/train_joint.py ARGV`` does:
the same argument parser and ``mtl.commands.train.train``) or ``{"name": ..., "call": [SCRIPT, FUNCTION, *ARGS]}``
(``FUNCTION(*ARGS)`` of the Python file SCRIPT). An error ends the launch with its traceback in the rank's log.
"""
import argparse
import importlib.util
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from mtl.core.console import configure_console  # noqa: E402

configure_console(False)  # as examples/train_joint.py does, before Paddle is imported


def load_script(path):
    """The Python file ``path`` as a module (its ``__main__`` block does not run)."""
    name = "batch_" + os.path.splitext(os.path.basename(path))[0]
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def run(entry):
    if "train" in entry:
        from mtl.commands.train import add_train_args, train

        parser = argparse.ArgumentParser()
        add_train_args(parser)
        train(parser.parse_args(entry["train"]))
    else:
        script, function, *args = entry["call"]
        getattr(load_script(script), function)(*args)


def main(spec_path):
    with open(spec_path) as f:
        entries = json.load(f)
    rank = os.environ.get("PADDLE_TRAINER_ID", "0")
    for entry in entries:
        started = time.time()
        print(f"[run_batch] rank {rank}: {entry['name']} ...", flush=True)
        run(entry)
        print(f"[run_batch] rank {rank}: {entry['name']} done in {time.time() - started:.2f} s", flush=True)


if __name__ == "__main__":
    from mtl.core.runtime import run_as_process

    run_as_process(main, sys.argv[1])  # as examples/train_joint.py ends
