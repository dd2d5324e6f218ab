"""The ``mtl`` command: ``train``, ``plugins`` (and sub-commands that other modules add).

User errors (:class:`mtl.errors.MtlError`) print one line and exit with status 2; nothing else is swallowed.
"""
import argparse
import os
import sys

DEFAULT_CONFIG = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples", "configs",
                              "demo.yaml")


def _early_threads(config_path, overrides):
    """Read ``threads`` and ``tune_malloc`` from the raw config before Paddle is imported, and apply them."""
    from mtl.runtime import set_threads, tune_malloc

    threads, tune = None, True
    try:
        import yaml

        from mtl.config.loading import apply_overrides, split_task_overrides

        raw = {}
        if config_path and os.path.isfile(config_path):
            with open(config_path) as f:
                raw = yaml.safe_load(f) or {}
        job_level, _ = split_task_overrides(overrides)  # tasks.N.* may name a task file: not needed here
        raw = apply_overrides(raw if isinstance(raw, dict) else {}, job_level)
        value = raw.get("threads")
        threads = int(value) if isinstance(value, int) and value > 0 else None
        tune = raw.get("tune_malloc", True) is not False
    except Exception:  # the real validation happens in load_job, with a proper message
        threads = None
    set_threads(threads)
    if tune:
        tune_malloc()


def add_train_args(parser):
    """Arguments of ``mtl train`` / ``examples/train_joint.py``."""
    parser.add_argument("config", nargs="?", default=DEFAULT_CONFIG, help="job config (YAML)")
    parser.add_argument("--set", dest="overrides", action="extend", nargs="+", default=[], metavar="KEY.PATH=VALUE",
                        help="override config values, e.g. --set schedule.steps=100 optimizer.lr=0.01")
    parser.add_argument("--resume", action="store_true", help="continue from the latest checkpoint")
    parser.add_argument("--overwrite", action="store_true",
                        help="start over in an output_dir that holds checkpoints of an earlier run (they are removed)")
    parser.add_argument("--until", type=int, metavar="STEP",
                        help="stop after this step, as a pre-empted job would (the schedule keeps its length)")


def train(args):
    """Load, validate and build the job, then train it; return the summary."""
    _early_threads(args.config, args.overrides)
    from mtl.config.loading import load_job
    from mtl.job import build_job
    from mtl.runtime import init_distributed, select_device
    from mtl.train.trainer import Trainer

    cfg = load_job(args.config, args.overrides)
    select_device(cfg["device"], cfg["source"])
    init_distributed()
    job = build_job(cfg)
    return Trainer(job, resume=args.resume, overwrite=args.overwrite).run(until=args.until)


def plugins(args):
    """Print a table of every registered reader, backbone and head."""
    from tabulate import tabulate

    from mtl import registry
    from mtl.config.loading import task_folders

    folders = list(args.plugins) + [f for f in task_folders(None, args.plugins) if f not in args.plugins]
    registry.load_all(folders)  # the same folders a job loads: given ones, ./tasks and the repository's tasks/
    rows = [(e.kind, e.name, e.origin, e.description) for e in registry.entries()]
    print(tabulate(rows, headers=["kind", "name", "from", "description"], tablefmt="github"))


def build_parser():
    """The argument parser of the ``mtl`` command."""
    parser = argparse.ArgumentParser(prog="mtl", description="multi-task learning on one backbone (PaddlePaddle)")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("train", help="train a job")
    add_train_args(p)
    p.set_defaults(func=train)
    p = sub.add_parser("plugins", help="list registered readers, backbones and heads")
    p.add_argument("plugins", nargs="*", help="extra plug-in folders to load (./tasks and tasks/ always are)")
    p.set_defaults(func=plugins)
    for module in ("mtl.data.tools", "mtl.export", "mtl.evaluation.overlap"):
        try:
            mod = __import__(module, fromlist=["add_cli"])
        except ImportError:
            continue
        if hasattr(mod, "add_cli"):
            mod.add_cli(sub)
    return parser


def run(func, args):
    """Call ``func(args)``; a user error becomes one line on stderr and exit status 2."""
    from mtl.errors import MtlError

    try:
        func(args)
    except MtlError as exc:
        rank = os.environ.get("PADDLE_TRAINER_ID")
        prefix = f"error (rank {rank}): " if rank is not None and os.environ.get("PADDLE_TRAINERS_NUM", "1") != "1" \
            else "error: "
        print(prefix + str(exc), file=sys.stderr, flush=True)
        sys.exit(2)
    except KeyboardInterrupt:
        sys.exit(130)


def main(argv=None):
    """Entry point of the ``mtl`` console command."""
    args = build_parser().parse_args(argv)
    run(args.func, args)


def train_main(argv=None):
    """Entry point of ``examples/train_joint.py``: ``[CONFIG] [--set k=v ...] [--resume]``."""
    parser = argparse.ArgumentParser(description="train a multi-task job (default: the digits demo)")
    add_train_args(parser)
    args = parser.parse_args(argv)
    run(train, args)


if __name__ == "__main__":
    main()
