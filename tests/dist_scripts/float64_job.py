"""Train a job in float64 (``paddle.set_default_dtype("float64")`` before anything is built): the float64 equivalence
test of BatchNorm with sync BN. Usage: ``float64_job.py CONFIG [--set key=value ...]`` (under the launcher or not), or
``main(CONFIG, ...)`` from a process that goes on afterwards (the default dtype is restored)."""
import os
import sys

import paddle

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from mtl.cli import run  # noqa: E402
from mtl.commands.train import add_train_args  # noqa: E402


def train_float64(args):
    """Build and train the job with float64 parameters; float32 batch arrays are widened to float64."""
    from mtl.commands.train import prepare_job
    from mtl.train.job import build_job
    from mtl.train.trainer import Trainer

    class Float64Trainer(Trainer):
        """Widens the batches; no final evaluation (evaluation splits are read as float32)."""

        def finish(self, seconds, step=None):
            return {}

        def as_tensors(self, batch):
            wide = paddle.get_default_dtype()
            tensors = super().as_tensors(batch)
            return {t: {k: v.astype(wide) if v.dtype == paddle.float32 else v for k, v in sub.items()}
                    for t, sub in tensors.items()}

    cfg = prepare_job(args)
    previous = paddle.get_default_dtype()
    paddle.set_default_dtype(os.environ.get("MTL_TEST_DTYPE", "float64"))
    try:
        Float64Trainer(build_job(cfg)).run(until=args.until)
    finally:  # the process may go on with other jobs (tests/dist_scripts/run_batch.py, or the test process itself)
        paddle.set_default_dtype(previous)


def parse(argv=None):
    import argparse

    parser = argparse.ArgumentParser()
    add_train_args(parser)
    return parser.parse_args(argv)


def main(*argv):
    """``float64_job.py ARGV`` in a process that goes on afterwards (errors raise)."""
    train_float64(parse([str(a) for a in argv]))


if __name__ == "__main__":
    run(train_float64, parse())
