"""``mtl data pack`` and ``mtl data inspect``: write InsightFace-style RecordIO datasets and look inside face data.

Packed layout (what InsightFace's tools write and its loaders expect): record 0 is a header whose two labels are
(first identity record, end); records 1..N are the images (``IfQQ`` header with the class label, then the encoded
image), grouped by class; records N+1..N+C are identity records whose labels give each class's image-record range
[a, b). A ``property`` file next to the pair holds ``num_classes,height,width``.
"""
import io
import os

import numpy as np

from mtl.data.recordio import RecordIOReader, RecordIOWriter, unpack
from mtl.data.recordio import pack as pack_record
from mtl.data.transforms import DecodeError, decode_rgb
from mtl.errors import DataError
from mtl.readers.image_list import parse_label_list
from mtl.readers.label_names import complete, label_file, names_from_paths, read_label_file, write_label_file
from mtl.readers.recordio_reader import image_rows, read_property, resolve_paths
from mtl.train.integrity import fsync_file

# every format both decoders (Pillow, OpenCV) read; images are stored as they are, so packing is lossless
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".pgm", ".ppm", ".pbm", ".pnm", ".tif", ".tiff")


# ----------------------------------------------------------------------------------------------- pack
def _folder_items(folder: str):
    """(path, label) for every image of ``folder/<identity>/``, the class count and the class names: labels follow
    the sorted identity folder names."""
    identities = sorted(d for d in os.listdir(folder) if os.path.isdir(os.path.join(folder, d)))
    if not identities:
        raise DataError(f"image folder '{folder}' has no identity sub-folder")
    items = []
    for label, identity in enumerate(identities):
        sub = os.path.join(folder, identity)
        for fname in sorted(os.listdir(sub)):
            if fname.lower().endswith(IMAGE_EXTENSIONS):
                items.append((os.path.join(sub, fname), label))
    return items, len(identities), identities


def _list_items(list_path: str, root: str = None):
    """(path, label) for every line of a label list (any malformed line is an error), the class count and the class
    names when known (a ``labels.json`` beside the list, else the list's folders: :mod:`mtl.readers.label_names`)."""
    entries, problems = parse_label_list(list_path)
    if problems:
        raise DataError(problems[min(problems)])
    root = root if root is not None else (os.path.dirname(list_path) or ".")
    items = [(os.path.join(root, rel), int(label)) for _, rel, label in entries]
    count = (max(label for _, label in items) + 1) if items else 0
    given = read_label_file(label_file(os.path.dirname(list_path)))
    names = given.get("label") if given else names_from_paths([rel for _, rel, _ in entries],
                                                              [label for _, _, label in entries])
    return items, count, complete(names, count)


def _encoded(path: str, resize: int = None, quality: int = 95):
    """(bytes to store, (width, height)); re-encoded as JPEG only when ``resize`` is given."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise DataError(f"cannot read image '{path}': {exc.strerror}") from None
    try:
        image = decode_rgb(data)
    except DecodeError as exc:
        raise DataError(f"image '{path}': {exc}") from None
    if resize is None:
        return data, image.size
    from PIL import Image

    image = image.resize((int(resize), int(resize)), Image.BILINEAR)
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG", quality=int(quality))
    return buffer.getvalue(), image.size


def _output_prefix(out_prefix: str) -> str:
    out_prefix = str(out_prefix)
    if out_prefix.endswith(os.sep) or os.path.isdir(out_prefix):
        return os.path.join(out_prefix, "train")
    return out_prefix[:-4] if out_prefix.endswith(".rec") else out_prefix


def pack(source: str, out_prefix: str, root: str = None, resize: int = None, quality: int = 95) -> dict:
    """Pack an image folder (one sub-folder per identity) or a label list into ``<prefix>.rec/.idx`` + ``property``.

    ``out_prefix``: ``data/webface/train`` or an existing folder (then ``folder/train``). Images are stored as they
    are (every image must then have the same size) unless ``resize`` re-encodes them as ``resize`` x ``resize`` JPEGs.
    The three files are written under temporary names and renamed into place only once all of them are complete: a
    failure (a corrupt image, a size mismatch, Ctrl-C) leaves nothing behind, and an earlier pack at the same prefix
    stays as it was. Returns a summary dict (paths, records, classes, image size).
    """
    items, num_classes, names = _pack_items(source, root)
    prefix = _output_prefix(out_prefix)
    folder = os.path.dirname(prefix) or "."
    finals = (prefix + ".rec", prefix + ".idx", os.path.join(folder, "property"), label_file(folder))
    created = _make_folders(folder)
    temps = [os.path.join(os.path.dirname(p) or ".", f".{os.path.basename(p)}.partial-{os.getpid()}") for p in finals]
    try:
        with RecordIOWriter(temps[0], temps[1]) as writer:
            size = _write_records(writer, items, num_classes, resize, quality)
        with open(temps[2], "w") as f:
            f.write(f"{num_classes},{size[1]},{size[0]}\n")
        if names is not None:
            write_label_file(temps[3], {"label": names})
        for temp, final in zip(temps, finals):
            if os.path.isfile(temp):
                fsync_file(temp)
                os.replace(temp, final)
        if names is None and os.path.isfile(finals[3]):  # an earlier pack's names are not this pack's
            os.remove(finals[3])
    except BaseException:
        _remove(temps, created)
        raise
    return {"rec": finals[0], "idx": finals[1], "property": finals[2], "records": len(items),
            "classes": num_classes, "image_size": f"{size[1]}x{size[0]}",
            "labels": finals[3] if names is not None else None}


def _make_folders(folder: str):
    """Create ``folder`` (and missing parents); return the folders this created, deepest first."""
    created, path = [], os.path.abspath(folder)
    while not os.path.isdir(path):
        created.append(path)
        path = os.path.dirname(path)
    os.makedirs(folder, exist_ok=True)
    return created


def _remove(files, folders):
    """Remove the temporary ``files`` of a failed pack, then the ``folders`` it created (when left empty)."""
    for path in files:
        if os.path.exists(path):
            os.remove(path)
    for path in folders:
        try:
            os.rmdir(path)
        except OSError:
            break


def _pack_items(source, root):
    """``([(image path, label)] grouped by class in source order, class count, class names or None)`` of a folder or
    a label list."""
    if os.path.isdir(source):
        items, num_classes, names = _folder_items(source)
    elif os.path.isfile(source):
        items, num_classes, names = _list_items(source, root)
    else:
        raise DataError(f"pack source '{source}' is neither an image folder nor a label list")
    if not items:
        raise DataError(f"pack source '{source}' holds no image (looked for {', '.join(IMAGE_EXTENSIONS)} files in "
                        f"its identity sub-folders)")
    order = sorted(range(len(items)), key=lambda i: items[i][1])  # stable: group by class, keep source order
    return [items[i] for i in order], num_classes, names


def _write_records(writer, items, num_classes, resize, quality):
    """Header record, one record per image, one identity record per class (InsightFace's layout); image size."""
    n = len(items)
    first_identity = n + 1
    size = None
    writer.write(pack_record([first_identity, first_identity + num_classes], b"", id=0), key=0)
    for key, (path, label) in enumerate(items, start=1):
        data, image_size = _encoded(path, resize, quality)
        if size is None:
            size, size_path = image_size, path
        elif image_size != size:
            raise DataError(
                f"image '{path}' is {image_size[0]}x{image_size[1]} but '{size_path}' is {size[0]}x{size[1]}; "
                f"pass resize (--resize N) to store images of one size"
            )
        writer.write(pack_record(float(label), data, id=key), key=key)
    labels = np.array([label for _, label in items], dtype=np.int64)
    ranges = np.zeros((num_classes, 2), dtype=np.int64)
    ranges[:, 0] = np.searchsorted(labels, np.arange(num_classes), side="left") + 1
    ranges[:, 1] = np.searchsorted(labels, np.arange(num_classes), side="right") + 1
    for c in range(num_classes):
        writer.write(pack_record(ranges[c].astype(np.float32), b"", id=first_identity + c), key=first_identity + c)
    return size


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
        sizes.add(f"{image.size[1]}x{image.size[0]}")
        if i in wanted:
            kept[i] = np.asarray(image)
    bar.close()
    return kept, sizes


def inspect(path: str, out_png: str = None, samples: int = 36, seed: int = 0, root: str = None,
            check: str = "all") -> dict:
    """Statistics of a RecordIO dataset, label list or ``.bin`` set, and a PNG contact sheet of sampled images.

    Returns records, classes, images per class (min / median / max), image sizes, the label names (``labels``:
    ``{label: name}``, from ``labels.json`` beside the data or a list's folders), and ``bad_records`` with
    ``bad``, a sentence per unreadable record or image. ``check``: ``all`` decodes every image, ``sample`` only the
    contact sheet's (then ``decoded`` says so); labels come from the headers / the list, without decoding.
    """
    path = str(path)
    if path.endswith(".bin"):
        return _inspect_bin(path, out_png, samples)
    if check not in ("all", "sample"):
        raise DataError(f"check must be 'all' or 'sample', got {check!r}")
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


def _inspect_bin(path, out_png, samples):
    """Statistics (and the contact sheet) of a verification ``.bin`` set."""
    from mtl.data.verification_sets import read_bin

    vset = read_bin(path, image_size=_first_bin_size(path))
    pick = np.unique(np.linspace(0, len(vset) - 1, min(samples, len(vset))).astype(int))
    stats = {"path": path, "format": "verification .bin", "records": len(vset), "pairs": vset.num_pairs,
             "same_pairs": int(vset.issame.sum()), "image_size": f"{vset.pixels.shape[1]}x{vset.pixels.shape[2]}"}
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
    print(f"wrote {summary['records']} images of {summary['classes']} classes ({summary['image_size']}) to "
          f"{summary['rec']} + {os.path.basename(summary['idx'])}, property {summary['property']}"
          + (f", label names {summary['labels']}" if summary["labels"] else
             " (no label names: the list's folders do not tell one label from another)"))
    return 0


def default_sheet_path(path: str) -> str:
    """Where ``inspect`` writes its contact sheet by default: next to the data, never in the current directory.

    A RecordIO folder gets ``FOLDER/samples.png``; a file (``.rec`` prefix, label list, ``.bin``) gets
    ``<file without extension>_samples.png`` beside it.
    """
    path = os.path.normpath(str(path))
    if os.path.isdir(path):
        return os.path.join(path, "samples.png")
    return os.path.splitext(path)[0] + "_samples.png"


SHOWN_LABELS = 30  # labels listed on the console (every one in the returned stats)


def _run_inspect(args) -> int:
    from tabulate import tabulate

    out_png = args.out_png
    if out_png is None:
        out_png = default_sheet_path(args.path)
    stats = inspect(args.path, out_png or None, samples=args.samples, seed=args.seed, root=args.root,
                    check=args.check)
    print(tabulate([(k, v) for k, v in stats.items() if k not in ("path", "bad", "labels")], headers=["", args.path]))
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
    """Register ``data pack`` and ``data inspect`` on an argparse sub-parsers object (each sets ``func(args)``)."""
    data = subparsers.add_parser("data", help="pack face images into RecordIO, inspect datasets")
    sub = data.add_subparsers(dest="data_command", metavar="{pack,inspect}")
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
                   help="contact sheet file (default: next to the data, e.g. FOLDER/samples.png; '' = none)")
    q.add_argument("--samples", type=int, default=36, help="images on the contact sheet")
    q.add_argument("--seed", type=int, default=0, help="which images are sampled")
    q.add_argument("--root", default=None, help="image root of a label list")
    q.add_argument("--check", choices=["all", "sample"], default="all",
                   help="decode every image to find the bad ones, or only the contact sheet's sample (quick)")
    q.set_defaults(func=_run_inspect)
    return data
