"""``mtl overlap RUN_DIR``: the command line of :mod:`mtl.studies.overlap` (which identities of one task's classifier
are likely the same people as another's)."""
from mtl.core.errors import ConfigError, require_output_file
from mtl.serving.run_plugins import add_trust_plugins
from mtl.studies.overlap import CENTRES_THRESHOLD, IMAGES_PER_CLASS, PERCENTILE, report


def _cmd_overlap(args):
    if args.threshold is not None and not -1.0 <= args.threshold <= 1.0:
        raise ConfigError(f"--threshold must be a cosine in [-1, 1], got {args.threshold}")
    if not 0.0 <= args.percentile <= 100.0:
        raise ConfigError(f"--percentile must be in [0, 100], got {args.percentile}")
    if args.images_per_class < 2:
        raise ConfigError(f"--images-per-class must be at least 2 (two halves), got {args.images_per_class}")
    if args.json:
        require_output_file(args.json, "--json")
    report(args.run_dir, args.threshold, args.centres, args.sets, args.json, args.percentile, args.images_per_class,
           args.trust_plugins)


def add_cli(sub):
    """Register ``mtl overlap RUN_DIR [--threshold T] [--centres] [--json FILE] [--sets] ...``."""
    p = sub.add_parser("overlap", help="list likely-same identities across the class heads of a finished run")
    p.add_argument("run_dir", help="a finished run (its output_dir) with two or more class heads")
    p.add_argument("--threshold", type=float, default=None,
                   help="a fixed cosine instead of the calibrated one (default with --centres: "
                        f"{CENTRES_THRESHOLD})")
    p.add_argument("--percentile", type=float, default=PERCENTILE,
                   help=f"calibration: percentile of the same-person half-template cosines (default {PERCENTILE:g})")
    p.add_argument("--images-per-class", type=int, default=IMAGES_PER_CLASS,
                   help=f"training images embedded per identity for its template (default {IMAGES_PER_CLASS})")
    p.add_argument("--centres", action="store_true",
                   help="compare the heads' class centres (weights) instead of image templates (no calibration)")
    p.add_argument("--json", metavar="FILE", help="write the matches as a JSON list, people by name and dataset "
                                                  "label (the pairs file of cross_negatives mask: pairs, mtl data "
                                                  "merge)")
    p.add_argument("--sets", action="store_true",
                   help="also flag verification images as close to a training identity as its own images (leakage)")
    add_trust_plugins(p)
    p.set_defaults(func=_cmd_overlap)
