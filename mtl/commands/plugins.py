"""``mtl plugins [FOLDER ...]``: every registered reader, backbone, head and task-weighting strategy."""


def plugins(args):
    """Print a table of every registered reader, backbone, head and task-weighting strategy."""
    from tabulate import tabulate

    from mtl import registry
    from mtl.config.loading import task_folders

    folders = list(args.plugins) + [f for f in task_folders(None, args.plugins) if f not in args.plugins]
    registry.load_all(folders)  # the same folders a job loads: given ones, ./tasks and the repository's tasks/
    rows = [(e.kind, e.name, e.origin, e.description) for e in registry.entries()]
    print(tabulate(rows, headers=["kind", "name", "from", "description"], tablefmt="github"))


def add_cli(sub):
    """Register ``mtl plugins``."""
    p = sub.add_parser("plugins", help="list registered readers, backbones, heads and weighting strategies")
    p.add_argument("plugins", nargs="*", help="extra plug-in folders to load (./tasks and tasks/ always are)")
    p.set_defaults(func=plugins)
