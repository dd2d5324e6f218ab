"""``mtl data pack`` and ``mtl data inspect``: write InsightFace-style RecordIO datasets (:mod:`mtl.writers.pack`)
and look inside face data: records, classes, images per class, bad images, a contact sheet.
"""
import os

import numpy as np

from mtl.commands.data_pairs import add_pairs_cli
from mtl.commands.merge import add_merge_cli
from mtl.core.charts import check_chart_path
from mtl.core.errors import ConfigError, DataError
from mtl.data.recordio import RecordIOReader, unpack
from mtl.data.transforms import DecodeError, decode_rgb
from mtl.readers.image_list import parse_label_list
from mtl.readers.label_names import complete, label_file, names_from_paths, read_label_file
from mtl.readers.recordio_reader import image_rows, read_property, resolve_paths
from mtl.writers.pack import pack


# ----------------------------------------------------------------------------------------------- inspect
def _recordio_source(path: str):
    rec_path, idx_path, property_path = resolve_paths(path)
    for needed in (rec_path, idx_path):
        if not os.path.isfile(needed):
            raise DataError(f"{needed}: file does not exist (recordio path '{path}')")
    records = RecordIOReader(rec_path, idx_path)
    rows, header_classes = image_rows(records)
    heads = records.scan_headers(rows)
    good = heads["magic_ok"] & np.isfinite(heads["label"])
    prop = read_property(property_path)
    stated = prop[0] if prop is not None else header_classes

    def load(i):
        return unpack(records.read_row(int(rows[i])))[1]

    def describe(i):
        return f"'{rec_path}' record {int(records.keys[int(rows[i])])}"

    bad = [f"{describe(i)}: unreadable header or label" for i in np.flatnonzero(~good)]
    if stated is not None:  # as the reader refuses them: a label past the stated class count
        where = f"property '{property_path}'" if prop is not None else "header record 0"
        outside = good & ((heads["label"] < 0) | (heads["label"] >= stated))
        bad += [f"{describe(i)}: label {heads['label'][i]:g} is outside [0, {stated}) ({where} says {stated} classes)"
                for i in np.flatnonzero(outside)]
        good &= ~outside
    given = read_label_file(label_file(os.path.dirname(rec_path)))
    names = given.get("label") if given else None
    info = {"format": "recordio", "header_record": header_classes is not None}
    return heads["label"][good].astype(np.int64), np.flatnonzero(good), load, describe, stated, names, bad, info


def _list_source(path: str, root: str = None):
    entries, problems = parse_label_list(path)
    root = root if root is not None else (os.path.dirname(path) or ".")
    keep = [i for i in range(len(entries)) if i not in problems]

    def load(i):
        with open(os.path.join(root, entries[i][1]), "rb") as f:
            return f.read()

    def describe(i):
        return f"label list '{path}' line {entries[i][0]} ('{entries[i][1]}')"

    given = read_label_file(label_file(os.path.dirname(path)))
    names = given.get("label") if given else names_from_paths([e[1] for e in entries], [e[2] for e in entries])
    labels = np.array([entries[i][2] for i in keep], dtype=np.int64)
    bad = [problems[k] for k in sorted(problems)]
    return labels, np.array(keep, dtype=np.int64), load, describe, None, names, bad, {"format": "image_list"}


def _contact_sheet(images, titles, out_png: str, heading: str):
    """Write a grid of images with small titles to ``out_png`` (matplotlib, no global backend change)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    cols = int(np.ceil(np.sqrt(len(images)))) or 1
    rows = int(np.ceil(len(images) / cols)) or 1
    fig = Figure(figsize=(1.3 * cols, 1.45 * rows + 0.4))
    FigureCanvasAgg(fig)
    fig.suptitle(heading, fontsize=9)
    for k in range(rows * cols):
        ax = fig.add_subplot(rows, cols, k + 1)
        ax.axis("off")
        if k < len(images):
            ax.imshow(images[k])
            ax.set_title(titles[k], fontsize=7)
    fig.savefig(out_png, dpi=80)


SHOWN_BAD = 10  # bad images named on the console (all of them in the returned stats)
PROGRESS_FROM = 2000  # images decoded with a progress bar from this many


def _decode_all(load, describe, positions, sample, bad):
    """Decode every image (``sample``: the positions of the contact sheet, whose images are kept); add a sentence
    per image that fails to ``bad``; the kept images by position, and the sizes seen."""
    from tqdm import tqdm

    kept, sizes = {}, set()
    wanted = set(int(i) for i in sample)
    bar = tqdm(total=len(positions), desc="decoding", leave=False, disable=len(positions) < PROGRESS_FROM)
    for i, position in enumerate(positions):
        try:
            image = decode_rgb(load(int(position)))
        except (DecodeError, DataError, OSError) as exc:
            bad.append(f"{describe(int(position))}: {exc}")
            continue
        finally:
            bar.update(1)
        sizes.add(f"{image.size[0]}x{image.size[1]}")  # width x height, as image tools say it
        if i in wanted:
            kept[i] = np.asarray(image)
    bar.close()
    return kept, sizes


def inspect(path: str, out_png: str = None, samples: int = 36, seed: int = 0, root: str = None,
            check: str = "all") -> dict:
    """Statistics of a RecordIO dataset, label list or ``.bin`` set, and a PNG contact sheet of sampled images.

    Returns records, classes, images per class (min / median / max), image sizes (width x height), the label names
    (``labels``: ``{label: name}``, from ``labels.json`` beside the data or a list's folders), and ``bad_records`` with
    ``bad``, a sentence per unreadable record or image. ``check``: ``all`` decodes every image, ``sample`` only the
    contact sheet's (then ``decoded`` says so); labels come from the headers / the list, without decoding.
    """
    path = str(path)
    _check_options(samples, out_png, check)
    if path.endswith(".bin"):
        return _inspect_bin(path, out_png, samples)
    is_list = os.path.isfile(path) and not path.endswith((".rec", ".idx"))
    labels, positions, load, describe, stated, names, bad, info = _list_source(path, root) if is_list else \
        _recordio_source(path)
    counts = np.bincount(labels) if len(labels) else np.zeros(0, np.int64)
    rng = np.random.RandomState(seed)
    pick = np.sort(rng.choice(len(labels), size=min(int(samples), len(labels)), replace=False)) if len(labels) else []
    decode = positions if check == "all" else positions[pick]
    kept, sizes = _decode_all(load, describe, decode, pick if check == "all" else range(len(pick)), bad)
    keys = list(pick) if check == "all" else list(range(len(pick)))  # how _decode_all kept the sheet's images
    chosen = [(i, kept[key]) for i, key in zip(pick, keys) if key in kept]
    num_classes = stated if stated is not None else int(labels.max()) + 1 if len(labels) else 0
    names = complete(names, num_classes)
    present = counts[counts > 0]
    stats = {"path": path, **info, "records": int(len(labels)), "classes": int(len(present)),
             "num_classes": num_classes,
             "images_per_class_min": int(present.min()) if len(present) else 0,
             "images_per_class_median": float(np.median(present)) if len(present) else 0.0,
             "images_per_class_max": int(present.max()) if len(present) else 0,
             "image_size": ", ".join(sorted(sizes)) or "n/a",
             "decoded": "every image" if check == "all" else f"only the {len(decode)} sampled images (--check all "
                                                              "decodes every one)",
             "bad_records": len(bad), "bad": bad,
             "labels": {int(c): (names[c] if names else None) for c in np.flatnonzero(counts)}}
    if out_png and chosen:
        titles = [f"{names[labels[i]]} ({labels[i]})" if names else f"label {labels[i]}" for i, _ in chosen]
        _contact_sheet([image for _, image in chosen], titles, out_png,
                       f"{os.path.basename(os.path.normpath(path))}: {stats['records']} images, "
                       f"{stats['classes']} classes")
        stats["contact_sheet"] = out_png
    return stats


def _check_options(samples, out_png, check):
    """ConfigError (key ``--samples`` / ``--sheet`` / ``--check``) for a negative sample count, a sheet path that
    cannot be written or an unknown check, before any image is read (the first two were numpy's and matplotlib's
    tracebacks after every image was decoded)."""
    if check not in ("all", "sample"):
        raise ConfigError(f"must be 'all' or 'sample', got {check!r}", key="--check")
    if isinstance(samples, bool) or not isinstance(samples, int) or samples < 0:
        raise ConfigError(f"images on the contact sheet must be a whole number, 0 or more; got {samples!r}",
                          key="--samples")
    if out_png:
        check_chart_path(out_png, "--sheet")


def _inspect_bin(path, out_png, samples):
    """Statistics (and the contact sheet) of a verification ``.bin`` set."""
    from mtl.data.verification_sets import read_bin

    vset = read_bin(path, image_size=_first_bin_size(path))
    pick = np.unique(np.linspace(0, len(vset) - 1, min(samples, len(vset))).astype(int))
    stats = {"path": path, "format": "verification .bin", "records": len(vset), "pairs": vset.num_pairs,
             "same_pairs": int(vset.issame.sum()),
             "image_size": f"{vset.pixels.shape[2]}x{vset.pixels.shape[1]}"}
    if out_png:
        titles = [f"pair {i // 2} {'same' if vset.issame[i // 2] else 'diff'}" for i in pick]
        _contact_sheet([vset.pixels[i] for i in pick], titles, out_png, os.path.basename(path))
        stats["contact_sheet"] = out_png
    return stats


def _first_bin_size(path: str) -> int:
    """Side of the first image of a ``.bin`` set (so that inspect shows the stored size, not a resized one)."""
    from mtl.data.verification_sets import as_bytes, load_bin_content

    content = load_bin_content(path)
    if not isinstance(content, (tuple, list)) or len(content) != 2:
        raise DataError(f"verification set '{path}': expected a pickle of (images, issame)")
    images = content[0]
    try:
        return decode_rgb(as_bytes(images[0])).size[0] if len(images) else 112
    except DecodeError as exc:
        raise DataError(f"verification set '{path}' image 0: {exc}") from None


# ----------------------------------------------------------------------------------------------- CLI
def _run_pack(args) -> int:
    summary = pack(args.source, args.out, root=args.root, resize=args.resize, quality=args.quality)
    print(f"wrote {summary['records']} images of {summary['classes']} classes ({summary['image_size']}, width x "
          f"height) to "
          f"{summary['rec']} + {os.path.basename(summary['idx'])}, property {summary['property']}"
          + (f", label names {summary['labels']}" if summary["labels"] else
             " (no label names: the list's folders do not tell one label from another)"))
    return 0


SHEET_FOLDER = os.path.join("runs", "inspect")  # the default contact sheets, under the current folder


def default_sheet_path(path: str) -> str:
    """Where ``inspect`` writes its contact sheet by default: ``runs/inspect/`` under the current folder, never in
    the data's folder (a dataset stays as it was packed or downloaded; it may be read-only or shared), named after
    the data: ``FOLDER_samples.png`` for a RecordIO folder, ``PARENT_FILE_samples.png`` for a file (``.rec`` prefix,
    label list, ``.bin``), whose own name is often ``train``."""
    path = os.path.abspath(os.path.normpath(str(path)))
    if os.path.isdir(path):
        name = os.path.basename(path)
    else:
        name = f"{os.path.basename(os.path.dirname(path))}_{os.path.splitext(os.path.basename(path))[0]}"
    return os.path.join(SHEET_FOLDER, f"{name or 'data'}_samples.png")


SHOWN_LABELS = 30  # labels listed on the console (every one in the returned stats)


def _run_inspect(args) -> int:
    from tabulate import tabulate

    out_png = args.out_png
    if out_png is None:
        _check_options(args.samples, None, args.check)  # a wrong option makes no folder
        out_png = default_sheet_path(args.path)
        os.makedirs(os.path.dirname(out_png), exist_ok=True)
    stats = inspect(args.path, out_png or None, samples=args.samples, seed=args.seed, root=args.root,
                    check=args.check)
    shown = {"image_size": "image_size (width x height)"}
    print(tabulate([(shown.get(k, k), v) for k, v in stats.items() if k not in ("path", "bad", "labels")],
                   headers=["", args.path]))
    for line in stats.get("bad", [])[:SHOWN_BAD]:
        print(f"bad: {line}")
    if len(stats.get("bad", [])) > SHOWN_BAD:
        print(f"... and {len(stats['bad']) - SHOWN_BAD} more bad records")
    print(label_table(stats))
    return 0


def label_table(stats) -> str:
    """Which label is which name (the first ``SHOWN_LABELS``), with its images; or why there are no names."""
    from tabulate import tabulate

    labels = stats.get("labels") or {}
    if not labels:
        return ""
    if not any(labels.values()):
        return ("labels have no names (no labels.json beside the data; `mtl data pack FOLDER` writes one from the "
                "folder names)")
    rows = [(label, name) for label, name in list(labels.items())[:SHOWN_LABELS]]
    more = f"\n... {len(labels) - SHOWN_LABELS} more labels" if len(labels) > SHOWN_LABELS else ""
    return "\n" + tabulate(rows, headers=["label", "name"], tablefmt="github") + more


def add_cli(subparsers):
    """Register ``data pack``, ``data inspect``, ``data merge`` and ``data pairs`` on an argparse sub-parsers
    object (each sets ``func(args)``)."""
    data = subparsers.add_parser("data", help="pack face images into RecordIO, inspect datasets")
    sub = data.add_subparsers(dest="data_command", metavar="{pack,inspect,merge,pairs}")
    sub.required = True
    p = sub.add_parser("pack", help="write train.rec/train.idx/property from an image folder or a label list")
    p.add_argument("source", help="folder with one sub-folder per identity, or a 'path<TAB>label' list file")
    p.add_argument("out", help="output prefix (data/webface/train) or an existing folder")
    p.add_argument("--root", default=None, help="image root of a label list (default: the list's folder)")
    p.add_argument("--resize", type=int, default=None, help="re-encode every image as an NxN JPEG")
    p.add_argument("--quality", type=int, default=95, help="JPEG quality when --resize is given")
    p.set_defaults(func=_run_pack)
    q = sub.add_parser("inspect", help="records, classes, images per class, image size, PNG contact sheet")
    q.add_argument("path", help="RecordIO folder/prefix, label list or .bin verification set")
    q.add_argument("--sheet", "--out-png", dest="out_png", default=None,
                   help="contact sheet file (default: runs/inspect/NAME_samples.png under the current folder, "
                        "never in the data's folder; '' = none)")
    q.add_argument("--samples", type=int, default=36, help="images on the contact sheet")
    q.add_argument("--seed", type=int, default=0, help="which images are sampled")
    q.add_argument("--root", default=None, help="image root of a label list")
    q.add_argument("--check", choices=["all", "sample"], default="all",
                   help="decode every image to find the bad ones, or only the contact sheet's sample (quick)")
    q.set_defaults(func=_run_inspect)
    add_merge_cli(sub)
    add_pairs_cli(sub)
    return data
