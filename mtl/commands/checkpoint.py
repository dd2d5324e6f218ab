"""``mtl checkpoint info CKPT`` and ``mtl checkpoint reshard CKPT --world W OUT`` (see :mod:`mtl.train.reshard`)."""
from mtl.errors import ConfigError
from mtl.train.reshard import describe, reshard


def _info_command(args):
    from tabulate import tabulate

    print(tabulate(describe(args.checkpoint), tablefmt="plain"))


def _reshard_command(args):
    if args.world < 1:
        raise ConfigError(f"--world must be >= 1, got {args.world}")
    print(f"written: {reshard(args.checkpoint, args.world, args.out)}")


def add_cli(sub):
    """``mtl checkpoint info CKPT`` and ``mtl checkpoint reshard CKPT --world W OUT``."""
    p = sub.add_parser("checkpoint", help="inspect a checkpoint or re-split it for another process count")
    commands = p.add_subparsers(dest="checkpoint_command", required=True)
    info = commands.add_parser("info", help="what a checkpoint holds")
    info.add_argument("checkpoint", help="a checkpoint folder (output_dir/checkpoints/step_N)")
    info.set_defaults(func=_info_command)
    cut = commands.add_parser("reshard", help="write the checkpoint again for W processes (--world 1 merges)")
    cut.add_argument("checkpoint")
    cut.add_argument("--world", type=int, required=True, help="the new process count")
    cut.add_argument("out", help="the new checkpoint folder")
    cut.set_defaults(func=_reshard_command)
