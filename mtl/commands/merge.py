"""``mtl data merge``: the command line of :mod:`mtl.writers.merge` (one de-duplicated dataset from several)."""
import os
import shlex

from mtl.writers.merge import merge


def _run_merge(args) -> int:
    summary = merge(args.out, args.sources, args.pairs, args.pack)
    people, classes = summary["people"], summary["classes"]
    print(f"wrote {summary['images']} images of {classes} classes to {', '.join(summary['files'])}: the "
          f"{people} people of {len(summary['sources'])} sources, {people - classes} of them joined to another by "
          f"{summary['joins']} same-person pairs (labels.json names each class by its people)")
    listing = summary["files"][0]
    if listing.endswith(".txt"):
        print(f"next: a task reads it with reader {{type: image_list, list: {shlex.quote(listing)}}}")
    else:
        print(f"next: a task reads it with reader {{type: recordio, path: {shlex.quote(os.path.dirname(listing))}}}")
    return 0


def add_merge_cli(sub):
    """Register ``data merge OUT SOURCES... [--pairs FILE] [--pack]`` on the ``data`` sub-parsers."""
    p = sub.add_parser("merge", help="one de-duplicated dataset (label list or pack) from several and their "
                                     "same-person pairs")
    p.add_argument("out", help="output prefix (runs/merged/train -> train.txt or train.rec/.idx, labels.json beside)")
    p.add_argument("sources", nargs="+", metavar="NAME=SOURCE",
                   help="two or more datasets: a folder of person folders, a label list or a RecordIO pack, each "
                        "named as the pairs file names it (default: its file or folder name)")
    p.add_argument("--pairs", default=None,
                   help="same-person pairs (mtl overlap --json, or by hand: people by name or dataset label)")
    p.add_argument("--pack", action="store_true",
                   help="write a RecordIO pack (needed when a source is a pack) instead of a label list")
    p.set_defaults(func=_run_merge)
    return p
