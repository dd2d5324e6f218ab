"""The ``mtl`` command: ``train``, ``plugins`` (and sub-commands that other modules add).

User errors (:class:`mtl.errors.MtlError`) print one line and exit with status 2; nothing else is swallowed.
Paddle's own console noise is silenced before Paddle is imported (:func:`mtl.runtime.configure_console`);
``--verbose`` on any sub-command shows it.
"""
import argparse
import os
import shlex
import sys
import time

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


def add_config_args(parser):
    """The job config and its overrides (``-c``/``-o`` are Paddle's spellings of the positional config and
    ``--set``, as in PaddleClas and PaddleDetection)."""
    parser.add_argument("config", nargs="?", default=None, help="job config (YAML; default: the digits demo)")
    parser.add_argument("-c", "--config", dest="config_option", metavar="CONFIG",
                        help="job config (YAML), the same as the positional CONFIG")
    parser.add_argument("--set", "-o", dest="overrides", action="extend", nargs="+", default=[],
                        metavar="KEY.PATH=VALUE", help="override config values (repeatable), e.g. "
                        "--set schedule.steps=100 optimizer.lr=0.01 or -o schedule.steps=100 -o optimizer.lr=0.01")


def add_train_args(parser):
    """Arguments of ``mtl train`` / ``examples/train_joint.py``."""
    add_config_args(parser)
    parser.add_argument("--resume", action="store_true", help="continue from the latest checkpoint")
    parser.add_argument("--overwrite", action="store_true",
                        help="start over in an output_dir that holds checkpoints of an earlier run (they are removed)")
    parser.add_argument("--until", type=int, metavar="STEP",
                        help="stop after this step, as a pre-empted job would (the schedule keeps its length)")


def resolve_config(args):
    """The job config of ``args``: ``-c CONFIG`` or the positional one (not two different ones), else the demo."""
    from mtl.errors import ConfigError

    given = getattr(args, "config_option", None)
    if given and args.config and os.path.abspath(given) != os.path.abspath(args.config):
        raise ConfigError(f"two job configs were given, '{args.config}' and -c '{given}'; give one")
    return given or args.config or DEFAULT_CONFIG


def continue_command(argv):
    """The command that continues a run stopped by ``--until``: the same arguments without ``--until STEP`` and
    ``--overwrite``, with ``--resume``."""
    rest, skip = [], False
    for arg in argv[1:]:
        if skip or arg == "--overwrite" or arg.startswith("--until="):
            skip = False
            continue
        if arg == "--until":
            skip = True
            continue
        rest.append(arg)
    if "--resume" not in rest:
        rest.append("--resume")
    head = ["python", argv[0]] if argv[0].endswith(".py") else [os.path.basename(argv[0])]
    return shlex.join(head + rest)


def train(args):
    """Load, validate and build the job, then train it; return the summary."""
    from mtl.job import build_job
    from mtl.train.trainer import Trainer

    cfg = prepare_job(args)
    summary = Trainer(build_job(cfg), resume=args.resume, overwrite=args.overwrite).run(until=args.until)
    if summary["steps"] < cfg["schedule"]["steps"]:
        notice = until_notice(cfg, summary["steps"])  # every rank: finding the checkpoint is collective
        if os.environ.get("PADDLE_TRAINER_ID", "0") == "0":
            print(notice, flush=True)
    return summary


def prepare_job(args):
    """Threads before Paddle starts, then the validated config, the device and the process group; the config."""
    args.config = resolve_config(args)
    _early_threads(args.config, args.overrides)
    from mtl.config.loading import load_job
    from mtl.runtime import init_distributed, select_device
    from mtl.train.scalars import check_available

    cfg = load_job(args.config, args.overrides)
    check_available(cfg)
    select_device(cfg["device"], cfg["source"])
    init_distributed()
    return cfg


def until_notice(cfg, step):
    """The line a run stopped by ``--until`` ends with: where it stopped and the command that continues it."""
    from mtl.train.checkpoint import latest_checkpoint

    ckpt = latest_checkpoint(cfg["output_dir"])
    start = f"checkpoint {ckpt}" if ckpt else "step 0 (no checkpoint was saved yet; see checkpoint.every)"
    launcher = " under the same launch command" if "PADDLE_TRAINERS_NUM" in os.environ else ""
    return (f"stopped by --until after step {step} of {cfg['schedule']['steps']}. To continue from the latest "
            f"{start}, run{launcher}: {continue_command(sys.argv)}")


def plugins(args):
    """Print a table of every registered reader, backbone, head and task-weighting strategy."""
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
    p = sub.add_parser("plugins", help="list registered readers, backbones, heads and weighting strategies")
    p.add_argument("plugins", nargs="*", help="extra plug-in folders to load (./tasks and tasks/ always are)")
    p.set_defaults(func=plugins)
    for module in ("mtl.data.tools", "mtl.export", "mtl.evaluation.eval_cli", "mtl.evaluation.compare",
                   "mtl.train.reshard", "mtl.evaluation.overlap"):
        try:
            mod = __import__(module, fromlist=["add_cli"])
        except ImportError:
            continue
        if hasattr(mod, "add_cli"):
            mod.add_cli(sub)
    for command in sub.choices.values():
        add_verbose_arg(command)
    return parser


def add_verbose_arg(parser):
    """``--verbose``: show Paddle's own warnings and log lines too (hidden by default)."""
    parser.add_argument("--verbose", action="store_true",
                        help="also show Paddle's own warnings and log lines (hidden by default)")


def run(func, args):
    """Call ``func(args)``; a user error becomes one line on stderr and exit status 2."""
    from mtl.errors import MtlError
    from mtl.train.preemption import PREEMPTED_EXIT_STATUS, Preempted

    try:
        func(args)
    except Preempted as exc:
        print(f"{exc} (exit status {PREEMPTED_EXIT_STATUS}: run it again)", file=sys.stderr, flush=True)
        sys.exit(PREEMPTED_EXIT_STATUS)
    except MtlError as exc:
        rank = os.environ.get("PADDLE_TRAINER_ID")
        prefix = f"error (rank {rank}): " if rank is not None and os.environ.get("PADDLE_TRAINERS_NUM", "1") != "1" \
            else "error: "
        print(prefix + str(exc), file=sys.stderr, flush=True)
        sys.exit(2)
    except KeyboardInterrupt:
        sys.exit(130)
    except RuntimeError as exc:
        if not _lost_peer(exc):
            raise
        # another process failed first: say so, and leave the launcher time to report that process's own error
        rank = os.environ.get("PADDLE_TRAINER_ID", "?")
        print(f"error (rank {rank}): lost contact with another process in a collective ({str(exc).splitlines()[0]}); "
              "that process probably failed first: its error is in its log", file=sys.stderr, flush=True)
        time.sleep(LOST_PEER_DELAY)
        sys.exit(1)


LOST_PEER_DELAY = 5.0  # seconds


def _lost_peer(exc) -> bool:
    """True for the error a collective raises on a rank whose peer process is gone (gloo's transport)."""
    text = str(exc)
    return os.environ.get("PADDLE_TRAINERS_NUM", "1") != "1" and "gloo" in text and any(
        word in text for word in ("TIMEOUT", "Connection closed", "Connection reset", "Broken pipe"))


def main(argv=None):
    """Entry point of the ``mtl`` console command."""
    args = build_parser().parse_args(argv)
    configure_console(args.verbose)
    run(args.func, args)


def train_main(argv=None):
    """Entry point of ``examples/train_joint.py``: ``[CONFIG | -c CONFIG] [--set k=v ... | -o k=v ...] [--resume]``."""
    parser = argparse.ArgumentParser(description="train a multi-task job (default: the digits demo)")
    add_train_args(parser)
    add_verbose_arg(parser)
    args = parser.parse_args(argv)
    configure_console(args.verbose)
    run(train, args)


def configure_console(verbose):
    """Quiet Paddle's console noise unless ``verbose`` (before anything imports Paddle)."""
    from mtl.runtime import configure_console as configure

    configure(verbose)


if __name__ == "__main__":
    main()
