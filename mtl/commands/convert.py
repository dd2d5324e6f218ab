"""``mtl convert insightface|plsc SRC DST.pdparams --arch ARCH``: a face model trained elsewhere as our backbone's
weights (see :mod:`mtl.convert.weights`), for ``backbone: {type: ARCH, pretrained: DST.pdparams, ...}``."""
import json

from mtl.convert.weights import ARCHS, SOURCES


def _cmd_convert(args):
    from mtl.convert.weights import convert, sidecar_path

    config = convert(args.source, args.src, args.dst, args.arch, overwrite=args.overwrite)
    print(f"converted {args.src} ({args.source}) to {args.dst}; use it as")
    print(f"  backbone: {json.dumps({**config, 'pretrained': args.dst})}")
    print(f"(also written to {sidecar_path(args.dst)}, which mtl eval {args.dst} reads)")


def add_cli(sub):
    """Register ``mtl convert``."""
    p = sub.add_parser("convert", help="convert an insightface (.pth) or PLSC (.pdparams) face model to a backbone's "
                                       "pretrained weights")
    p.add_argument("source", choices=SOURCES, help="insightface: arcface_torch's state_dict (.pth, read without "
                                                   "torch); plsc: PLSC's IResNet / MobileFaceNet .pdparams")
    p.add_argument("src", metavar="SRC", help="the weights file to convert (.pth or .pdparams)")
    p.add_argument("dst", metavar="DST.pdparams", help="where the backbone's weights go (its config beside them)")
    p.add_argument("--arch", required=True, choices=ARCHS, help="the backbone the weights are for")
    p.add_argument("--overwrite", action="store_true", help="replace an existing DST and its .json")
    p.set_defaults(func=_cmd_convert)
