"""``mtl data pack``: write an image folder (one sub-folder per identity) or a label list as an InsightFace-style
RecordIO dataset.

Packed layout (what InsightFace's tools write and its loaders expect): record 0 is a header whose two labels are
(first identity record, end); records 1..N are the images (``IfQQ`` header with the class label, then the encoded
image), grouped by class; records N+1..N+C are identity records whose labels give each class's image-record range
[a, b). A ``property`` file next to the pair holds ``num_classes,height,width``.
"""
import io
import os
import sys

import numpy as np

from mtl.core.errors import DataError
from mtl.data.recordio import RecordIOWriter
from mtl.data.recordio import pack as pack_record
from mtl.data.transforms import DecodeError, decode_rgb
from mtl.readers.image_list import parse_label_list
from mtl.readers.label_names import complete, label_file, names_from_paths, read_label_file, write_label_file
from mtl.readers.recordio_reader import read_property
from mtl.store.integrity import fsync_file

# every format both decoders (Pillow, OpenCV) read; images are stored as they are, so packing is lossless
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".pgm", ".ppm", ".pbm", ".pnm", ".tif", ".tiff")


def folder_items(folder: str):
    """(path, label) for every image of ``folder/<identity>/``, the class count and the class names: labels follow
    the sorted identity folder names. A sub-folder without an image is left out with a warning (it would be a class
    without a sample)."""
    identities = sorted(d for d in os.listdir(folder) if os.path.isdir(os.path.join(folder, d)))
    if not identities:
        raise DataError(f"image folder '{folder}' has no identity sub-folder")
    images = {identity: [os.path.join(folder, identity, f) for f in sorted(os.listdir(os.path.join(folder, identity)))
                         if f.lower().endswith(IMAGE_EXTENSIONS)] for identity in identities}
    empty = [identity for identity in identities if not images[identity]]
    if empty and len(empty) < len(identities):
        shown = ", ".join(f"'{os.path.join(folder, identity)}'" for identity in empty[:5])
        print(f"warning: image folder '{folder}': {len(empty)} person folder(s) hold no image and are left out (each "
              f"would be a class without a sample): {shown}{', ...' if len(empty) > 5 else ''} (images are "
              f"{', '.join(IMAGE_EXTENSIONS)} files)", file=sys.stderr, flush=True)
        identities = [identity for identity in identities if images[identity]]
    items = [(path, label) for label, identity in enumerate(identities) for path in images[identity]]
    return items, len(identities), identities


def list_items(list_path: str, root: str = None):
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


def output_prefix(out_prefix: str) -> str:
    """The prefix of the files to write: a folder (or a path ending in a separator) means ``folder/train``; a
    ``.rec`` ending is dropped."""
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
    _check_options(resize, quality)
    items, num_classes, names = _pack_items(source, root)
    prefix = output_prefix(out_prefix)
    folder = os.path.dirname(prefix) or "."
    finals = (prefix + ".rec", prefix + ".idx", os.path.join(folder, "property"), label_file(folder))
    _check_shared_files(prefix, num_classes, names)
    created = make_folders(folder)
    temps = [os.path.join(os.path.dirname(p) or ".", f".{os.path.basename(p)}.partial-{os.getpid()}") for p in finals]
    try:
        with RecordIOWriter(temps[0], temps[1]) as writer:
            size = _write_records(writer, items, num_classes, resize, quality)
        _check_shared_files(prefix, num_classes, names, size)
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
        remove_written(temps, created)
        raise
    return {"rec": finals[0], "idx": finals[1], "property": finals[2], "records": len(items),
            "classes": num_classes, "image_size": f"{size[0]}x{size[1]}",  # width x height
            "labels": finals[3] if names is not None else None}


def _check_options(resize, quality):
    """ConfigError (key ``--resize`` / ``--quality``) for a side below one pixel or a JPEG quality outside 1..100
    (Pillow raised a ValueError from deep inside, or took 500 without a word)."""
    from mtl.core.errors import ConfigError

    if resize is not None and (isinstance(resize, bool) or not isinstance(resize, int) or resize < 1):
        raise ConfigError(f"the side of the re-encoded images must be a whole number of pixels, at least 1; got "
                          f"{resize!r}", key="--resize")
    if isinstance(quality, bool) or not isinstance(quality, int) or not 1 <= quality <= 100:
        raise ConfigError(f"JPEG quality must be a whole number from 1 to 100; got {quality!r}", key="--quality")


def _other_splits(prefix: str):
    """The other RecordIO splits (``NAME.rec``) in the folder of ``prefix``: they read its ``property`` and
    ``labels.json`` too."""
    folder, own = os.path.dirname(prefix) or ".", os.path.basename(prefix) + ".rec"
    if not os.path.isdir(folder):
        return []
    return sorted(f for f in os.listdir(folder) if f.endswith(".rec") and f != own and not f.startswith("."))


def _check_shared_files(prefix: str, num_classes: int, names, size=None):
    """DataError when packing at ``prefix`` would change the ``property`` (classes; image size once ``size`` is
    known) or the label names that another split of the same folder reads: that split would then be read with this
    one's classes (a label past the new count is an error) or names. Nothing is written before this is checked."""
    others = _other_splits(prefix)
    if not others:
        return
    folder = os.path.dirname(prefix) or "."
    stated = read_property(os.path.join(folder, "property"))
    given = read_label_file(label_file(folder))
    old_names = given.get("label") if given else None
    header = _header_classes(folder, others, num_classes) if stated is None else None
    if header is not None:  # that split counts its classes from its header record: a property would override it
        clash = f"its header record says {header} classes, this pack has {num_classes} and its property would win"
    elif stated is not None and stated[0] != num_classes:
        clash = f"its property says {stated[0]} classes, this pack has {num_classes}"
    elif stated is not None and size is not None and (stated[1], stated[2]) != (size[1], size[0]):
        clash = f"its property says {stated[1]}x{stated[2]} images, this pack's are {size[1]}x{size[0]}"
    elif (stated is not None or given is not None) and old_names != names:
        if old_names is None:
            clash = "it has no label names, this pack would add its own"
        elif names is None:
            clash = "this pack cannot name its classes and would remove the names"
        else:
            clash = "its labels.json names the classes otherwise"
    else:
        return
    split = os.path.basename(prefix)
    raise DataError(f"folder '{folder}' holds {', '.join(others)}, whose property and labels.json this pack would "
                    f"replace ({clash}); pack into a folder of its own (e.g. {os.path.join(folder, split, 'train')})"
                    f", or remove the other split first")


def _header_classes(folder: str, splits, num_classes: int):
    """The class count of the first of ``splits`` whose header record 0 states another count than ``num_classes`` (a
    property file written now would override it), else None."""
    from mtl.data.recordio import RecordIOReader
    from mtl.readers.recordio_reader import image_rows

    for split in splits:
        prefix = os.path.join(folder, split[:-4])
        if not os.path.isfile(prefix + ".idx"):
            continue
        _, classes = image_rows(RecordIOReader(prefix + ".rec", prefix + ".idx"))
        if classes is not None and classes != num_classes:
            return classes
    return None


def make_folders(folder: str):
    """Create ``folder`` (and missing parents); return the folders this created, deepest first. A path through a
    file or a folder without write permission is a DataError naming it."""
    created, path = [], os.path.abspath(folder)
    while not os.path.isdir(path):
        if os.path.exists(path):
            raise DataError(f"cannot write into '{folder}': '{path}' is a file, not a folder")
        created.append(path)
        path = os.path.dirname(path)
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as exc:
        raise DataError(f"cannot create the folder '{folder}': {exc.strerror}") from None
    if not os.access(folder, os.W_OK):
        raise DataError(f"cannot write into '{folder}': no write permission")
    return created


def remove_written(files, folders):
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
        items, num_classes, names = folder_items(source)
    elif os.path.isfile(source):
        items, num_classes, names = list_items(source, root)
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
