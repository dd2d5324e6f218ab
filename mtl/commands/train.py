"""``mtl train CONFIG`` (and ``examples/train_joint.py``): load, validate and build a job, then train it."""
import os
import shlex
import sys

DEFAULT_CONFIG = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "examples",
                              "configs", "demo.yaml")

def _early_threads(config_path, overrides):
    """Read ``threads``, ``blas_threads``, ``data.num_workers`` and ``tune_malloc`` from the raw config before Paddle
    is imported, and apply them."""
    from mtl.config.keys import JOB
    from mtl.core.runtime import set_threads, tune_malloc

    threads, blas, tune = None, None, True
    workers = JOB["data"].schema["num_workers"].default
    try:
        from mtl.config.overrides import apply_overrides, split_task_overrides
        from mtl.config.yaml_files import read_job_yaml

        raw = {}
        if config_path and os.path.isfile(config_path):
            raw = read_job_yaml(config_path)  # with its ``base:``, as load_job reads it
        job_level, _ = split_task_overrides(overrides)  # tasks.N.* may name a task file: not needed here
        raw = apply_overrides(raw if isinstance(raw, dict) else {}, job_level)
        value = raw.get("threads")
        threads = int(value) if isinstance(value, int) and value > 0 else None
        value = raw.get("blas_threads")
        blas = int(value) if isinstance(value, int) and value > 0 else None
        value = (raw.get("data") or {}).get("num_workers", workers)
        workers = int(value) if isinstance(value, int) and value >= 0 else workers
        tune = raw.get("tune_malloc", True) is not False
    except Exception:  # the real validation happens in load_job, with a proper message
        threads, blas = None, None
    set_threads(threads, blas, workers)
    if tune:
        tune_malloc()


def add_config_args(parser):
    """The job config and its overrides (``-c``/``-o`` are Paddle's spellings of the positional config and
    ``--set``, as in PaddleClas and PaddleDetection)."""
    parser.set_defaults(job_threads=True)  # the command sets the threads from the job (prepare_job), not mtl.cli
    parser.add_argument("config", nargs="?", default=None, help="job config (YAML; default: the digits demo)")
    parser.add_argument("-c", "--config", dest="config_option", metavar="CONFIG",
                        help="job config (YAML), the same as the positional CONFIG")
    parser.add_argument("--set", "-o", dest="overrides", action="extend", nargs="+", default=[],
                        metavar="KEY.PATH=VALUE", help="override config values (repeatable), e.g. "
                        "--set schedule.steps=100 optimizer.lr=0.01 or -o schedule.steps=100 -o optimizer.lr=0.01")


def add_train_args(parser):
    """Arguments of ``mtl train`` / ``examples/train_joint.py``."""
    add_config_args(parser)
    parser.add_argument("--resume", nargs="?", const="latest", default=None, metavar="STEP_OR_PATH",
                        help="continue from the latest checkpoint, or from the one named: a step (500 or step_500) "
                             "or a checkpoint folder; checkpoints after a named one are removed (they belong to the "
                             "run being replaced)")
    parser.add_argument("--overwrite", action="store_true",
                        help="start over in an output_dir that holds checkpoints of an earlier run (they are removed)")
    parser.add_argument("--until", type=int, metavar="STEP",
                        help="stop after this step as a pre-empted job would: a checkpoint of the step is saved, no "
                        "final evaluation runs (the schedule keeps its length), and the last line names the checkpoint "
                        "and the command that continues it with --resume. Exit status 0: stopping where asked is a "
                        "success (scripts, set -e and CI go on), unlike a pre-emption's 75 (run it again)")


def resolve_config(args):
    """The job config of ``args``: ``-c CONFIG`` or the positional one (not two different ones), else the demo."""
    from mtl.core.errors import ConfigError

    given = getattr(args, "config_option", None)
    if given and args.config and os.path.abspath(given) != os.path.abspath(args.config):
        raise ConfigError(f"two job configs were given, '{args.config}' and -c '{given}'; give one")
    return given or args.config or DEFAULT_CONFIG


def _resume_value(word) -> bool:
    """Whether argparse takes ``word`` after ``--resume`` as its value (a step or a checkpoint, not a config)."""
    return not word.startswith("-") and not word.endswith((".yaml", ".yml", ".json"))


def continue_command(argv):
    """The command that continues a run stopped by ``--until``: the same arguments without ``--until STEP`` and
    ``--overwrite``, with ``--resume`` (a ``--resume STEP_OR_PATH`` becomes ``--resume``: the latest)."""
    args, rest, i = list(argv[1:]), [], 0
    while i < len(args):
        arg, after = args[i], args[i + 1] if i + 1 < len(args) else None
        i += 1
        if after is not None and (arg == "--until" or (arg == "--resume" and _resume_value(after))):
            i += 1  # its value goes with it
        if arg in ("--overwrite", "--until", "--resume") or arg.startswith(("--until=", "--resume=")):
            continue
        rest.append(arg)
    head = ["python", argv[0]] if argv[0].endswith(".py") else [os.path.basename(argv[0])]
    return shlex.join(head + rest + ["--resume"])


def resume_command(argv=None) -> str:
    """The command that continues this run from its latest checkpoint: under a launcher the launch command (``mtl
    launch ...`` as typed, or Paddle's launcher's), else this process's (``argv``, default ``sys.argv``), with
    ``--resume`` and without ``--until``/``--overwrite`` (:func:`continue_command`)."""
    from mtl.core.console import launch_command

    launched = launch_command()
    return continue_command(shlex.split(launched) if launched else list(argv or sys.argv))


def train(args):
    """Load, validate and build the job, then train it; return the summary."""
    from mtl.core.errors import ConfigError, PluginError

    if args.until is not None and args.until < 1:
        raise ConfigError(f"--until must be a step >= 1, got {args.until}")
    if args.resume and args.overwrite:  # refused before anything is loaded or built
        raise ConfigError("--resume continues the run in output_dir and --overwrite removes it: pass one of them")
    if args.resume and args.config is None and str(args.resume).endswith((".yaml", ".yml", ".json")):
        args.config, args.resume = args.resume, "latest"  # `--resume CONFIG`: the config, not a checkpoint
    cfg = prepare_job(args)  # the thread counts first: Paddle reads them when it loads, below
    from mtl.serving.inference import write_run_data
    from mtl.train.job import build_job
    from mtl.train.trainer import Trainer

    try:
        job = build_job(cfg)
    except PluginError as exc:  # a bug in a plug-in: one line on the console, its traceback in the run's log
        raise logged_plugin_error(exc, cfg["output_dir"]) from None
    # the Trainer reads the evaluation splits first: a bad image of the held-out people fails before training
    trainer = Trainer(job, resume=bool(args.resume), overwrite=args.overwrite, resume_from=args.resume)
    if trainer.is_main:  # the output folder is this run's now: its label names and input preparation go there
        write_run_data(job, cfg["output_dir"])
    summary = trainer.run(until=args.until)
    if summary.get("stopped_early") and os.environ.get("PADDLE_TRAINER_ID", "0") == "0":
        print(until_notice(cfg, summary["steps"], summary["checkpoint"]), flush=True)
    return summary


def logged_plugin_error(exc, output_dir):
    """A plug-in's bug with its traceback written to ``output_dir/logs/rank<k>.log``, the console line saying where."""
    from mtl.core.errors import PluginError
    from mtl.parallel import distributed

    folder = os.path.join(output_dir, "logs")
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"rank{distributed.rank()}.log")
    with open(path, "a") as f:
        f.write(f"{exc}\n{exc.traceback_text}\n")
    return PluginError(f"{exc.bare_message} (traceback in {path})", exc.traceback_text)


def prepare_job(args):
    """Threads before Paddle starts, then the validated config, the device, the collectives' timeouts and the process
    group; the config."""
    args.config = resolve_config(args)
    _early_threads(args.config, args.overrides)
    from mtl.config.loading import load_job
    from mtl.core.runtime import die_with_launcher, init_distributed, select_device
    from mtl.store.rundir import check_output_dir
    from mtl.train.scalars import check_available
    from mtl.train.watchdog import set_collective_timeouts

    cfg = load_job(args.config, args.overrides)
    check_available(cfg)
    check_output_dir(cfg["output_dir"])  # before the job's data is read
    select_device(cfg["device"], cfg["source"])
    set_collective_timeouts(cfg["watchdog"])  # NCCL's wait above the watchdog's, before the process group starts
    die_with_launcher()  # a rank never outlives its launcher (SIGKILL included): it stops as a pre-empted one
    init_distributed()
    return cfg


def until_notice(cfg, step, ckpt):
    """The line a run stopped by ``--until`` ends with: where it stopped, its checkpoint ``ckpt`` (of that step) and
    the command that continues it."""
    from mtl.core.console import launch_command

    start = f"checkpoint {ckpt}" if ckpt else "step 0 (no step was trained)"
    launcher = " under the same launch command" if "PADDLE_TRAINERS_NUM" in os.environ and not launch_command() \
        else ""
    return (f"stopped by --until after step {step} of {cfg['schedule']['steps']}. To continue from the latest "
            f"{start}, run{launcher}: {resume_command()}")


def add_cli(sub):
    """Register ``mtl train``."""
    p = sub.add_parser("train", help="train a job")
    add_train_args(p)
    p.set_defaults(func=train)
