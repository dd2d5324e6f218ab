"""``mtl checkpoint info CKPT|RUN_DIR`` and ``mtl checkpoint reshard CKPT|RUN_DIR --world W OUT``
(see :mod:`mtl.store.reshard`)."""
import os

from mtl.core.errors import ConfigError, DataError
from mtl.store.reshard import describe, reshard


def resolve_checkpoint(path, console=print):
    """The checkpoint folder ``path`` names: a checkpoint folder (``state.json``) when its files match their
    checksums (a damaged one is a DataError: reshard would give its damage new checksums), a run folder (its
    ``output_dir``) by its latest complete checkpoint that verifies, announced on ``console``; anything else is a
    ConfigError."""
    from mtl.store import integrity
    from mtl.store.layout import checkpoint_root, latest_checkpoint

    if os.path.isfile(os.path.join(path, "state.json")):
        problem = integrity.verify(path)
        if problem:
            raise DataError(f"checkpoint '{path}' is damaged: {problem}")
        return path
    if os.path.isdir(checkpoint_root(path)) or os.path.isfile(os.path.join(path, "job.json")):
        latest = latest_checkpoint(path)
        if latest is None:
            raise ConfigError(f"run folder '{path}' holds no complete checkpoint under "
                              f"'{checkpoint_root(path)}' (train it, or give a checkpoint folder)")
        console(f"run folder {path}: using its latest checkpoint {latest}")
        return latest
    raise ConfigError(f"'{path}' is neither a checkpoint folder (it has no state.json) nor a run folder (it has no "
                      "checkpoints/ folder or job.json); give a run's output_dir or one of its checkpoints/step_N")


def _info_command(args):
    from tabulate import tabulate

    print(tabulate(describe(resolve_checkpoint(args.checkpoint)), tablefmt="plain"))


def _reshard_command(args):
    if args.world < 1:
        raise ConfigError(f"--world must be >= 1, got {args.world}")
    if not args.out.strip():
        raise ConfigError("the output folder (OUT) is empty; name the new checkpoint folder")
    print(f"written: {reshard(resolve_checkpoint(args.checkpoint), args.world, args.out)}")


def add_cli(sub):
    """``mtl checkpoint info CKPT|RUN_DIR`` and ``mtl checkpoint reshard CKPT|RUN_DIR --world W OUT``."""
    p = sub.add_parser("checkpoint", help="inspect a checkpoint or re-split it for another process count")
    commands = p.add_subparsers(dest="checkpoint_command", required=True)
    info = commands.add_parser("info", help="what a checkpoint holds")
    info.add_argument("checkpoint", metavar="CKPT|RUN_DIR",
                      help="a checkpoint folder (output_dir/checkpoints/step_N) or a run folder (its latest)")
    info.set_defaults(func=_info_command)
    cut = commands.add_parser("reshard", help="write the checkpoint again for W processes (--world 1 merges)")
    cut.add_argument("checkpoint", metavar="CKPT|RUN_DIR", help="a checkpoint folder or a run folder (its latest)")
    cut.add_argument("--world", type=int, required=True, help="the new process count")
    cut.add_argument("out", help="the new checkpoint folder")
    cut.set_defaults(func=_reshard_command)
