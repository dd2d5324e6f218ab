"""The files ``mtl data merge`` writes (:mod:`mtl.writers.merge`): a label list or a RecordIO pack of the merged
classes, and ``labels.json`` beside it; each under a temporary name, renamed into place once every file is complete
(a failure, Ctrl-C included, leaves nothing behind)."""
import os

import numpy as np

from mtl.core.errors import DataError
from mtl.data.transforms import DecodeError, decode_rgb
from mtl.readers.label_names import write_label_file
from mtl.store.integrity import fsync_file
from mtl.writers.pack import make_folders, remove_written


def _temporary(path: str) -> str:
    return os.path.join(os.path.dirname(path) or ".", f".{os.path.basename(path)}.partial-{os.getpid()}")


def _written(files, write) -> int:
    """Run ``write(temporary paths)`` (it returns the image count), then move every file into place."""
    created = make_folders(os.path.dirname(files[0]) or ".")
    temps = [_temporary(p) for p in files]
    try:
        count = write(temps)
        for temp, final in zip(temps, files):
            fsync_file(temp)
            os.replace(temp, final)
    except BaseException:
        remove_written(temps, created)
        raise
    return count


def write_list(files, sources, classes, names) -> int:
    """``OUT.txt`` (every image of every source in source order, its path relative to the list's folder, its merged
    class) and ``labels.json``; the number of images."""
    folder = os.path.abspath(os.path.dirname(files[0]) or ".")

    def write(temps):
        count = 0
        with open(temps[0], "w", encoding="utf-8") as f:
            f.write("# mtl data merge of " + ", ".join(f"{s.name}={s.path}" for s in sources) + "\n")
            for source, mapping in zip(sources, classes):
                for path, label in zip(source.paths, source.labels):
                    f.write(f"{os.path.relpath(path, folder)}\t{mapping[label]}\n")
                    count += 1
        write_label_file(temps[1], {"label": names})
        return count

    return _written(files, write)


def _size_of(source, i: int, data: bytes):
    """``(width, height)`` of image ``i`` of ``source`` (its bytes ``data``), decoded."""
    try:
        return decode_rgb(data).size
    except DecodeError as exc:
        raise DataError(f"{source.where(i)}: {exc}") from None


class SizeCheck:
    """One image size for the whole pack (its ``property``): images read from files are decoded and checked, as
    ``mtl data pack`` checks them; a pack source's are taken at its ``property``'s word (its first image decoded when
    it has none), so that merging a large pack does not decode it."""

    def __init__(self):
        self.size, self.first, self.packs_seen = None, None, set()

    def check(self, source, i: int, data: bytes):
        """Compare image ``i`` of ``source`` with the first image (DataError naming both when they differ)."""
        if source.paths is None:  # a pack: its property's size, or its first image's
            if source.name in self.packs_seen:
                return
            self.packs_seen.add(source.name)
            if source.size is not None:
                size, where = (source.size[1], source.size[0]), f"'{source.path}' (its property)"
            else:
                size, where = _size_of(source, i, data), source.where(i)
        else:
            size, where = _size_of(source, i, data), source.where(i)
        if self.size is None:
            self.size, self.first = size, where
        elif size != self.size:
            raise DataError(f"{where} is {size[0]}x{size[1]} but {self.first} is {self.size[0]}x{self.size[1]}: a "
                            "pack holds images of one size (mtl data pack --resize N re-encodes a source first)")


def write_pack(files, sources, classes, names) -> int:
    """``OUT.rec``/``OUT.idx`` (header record, the images grouped by merged class in source order, one identity
    record per class: InsightFace's layout), ``property`` and ``labels.json``; the number of images."""
    from mtl.data.recordio import RecordIOWriter
    from mtl.data.recordio import pack as pack_record

    which = np.concatenate([np.full(len(s.labels), k, np.int64) for k, s in enumerate(sources)])
    index = np.concatenate([np.arange(len(s.labels), dtype=np.int64) for s in sources])
    merged = np.concatenate([c[s.labels] for s, c in zip(sources, classes)])
    order = np.argsort(merged, kind="stable")
    count, total = len(names), len(order)

    def write(temps):
        sizes = SizeCheck()
        with RecordIOWriter(temps[0], temps[1]) as writer:
            writer.write(pack_record([total + 1, total + 1 + count], b"", id=0), key=0)
            for key, k in enumerate(order, start=1):
                source, i = sources[which[k]], int(index[k])
                data = source.image(i)
                sizes.check(source, i, data)
                writer.write(pack_record(float(merged[k]), data, id=key), key=key)
            ranges = np.searchsorted(merged[order], np.arange(count), side="left") + 1
            ends = np.searchsorted(merged[order], np.arange(count), side="right") + 1
            for c in range(count):
                writer.write(pack_record(np.array([ranges[c], ends[c]], np.float32), b"", id=total + 1 + c),
                             key=total + 1 + c)
        with open(temps[2], "w") as f:
            f.write(f"{count},{sizes.size[1]},{sizes.size[0]}\n")
        write_label_file(temps[3], {"label": names})
        return total

    return _written(files, write)
