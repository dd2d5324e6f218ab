"""MXNet/dmlc RecordIO in pure Python: record framing, the ``.idx`` index and the ``IfQQ`` image-record header.

Framing (dmlc-core ``recordio``): every part is ``[u32 magic][u32 lrecord][payload][zero pad to 4 bytes]`` with
``lrecord = cflag << 29 | length``. A payload in which the magic appears at a 4-byte-aligned position is written as
several parts split at each such magic (the magic itself is dropped): cflag 1 = first part, 2 = middle, 3 = last,
0 = a whole record. The reader joins the parts and puts the magic back between them.

Index: a text file of ``key<TAB>offset`` lines (offset of the record's first part in the ``.rec`` file).

Image record payload (``mxnet.recordio.pack``): ``struct 'IfQQ' (flag, label, id, id2)``; ``flag > 0`` means that
``flag`` float32 labels follow the header and the label is that vector; the encoded image comes after.
"""
import os
import struct
from dataclasses import dataclass
from typing import Iterator, Tuple, Union

import numpy as np

from mtl.core.errors import DataError

MAGIC = 0xCED7230A
MAGIC_BYTES = struct.pack("<I", MAGIC)
LENGTH_BITS = 29
LENGTH_MASK = (1 << LENGTH_BITS) - 1
HEADER_FORMAT = "<IfQQ"
HEADER_SIZE = struct.calcsize(HEADER_FORMAT)  # 24 bytes
_PART = struct.Struct("<II")


def _pad4(n: int) -> int:
    """Round ``n`` up to a multiple of 4 (dmlc pads every part to 4-byte alignment)."""
    return (n + 3) & ~3


# ----------------------------------------------------------------------------------------------- framing
def encode_record(payload: bytes) -> bytes:
    """Frame ``payload`` as one RecordIO record, split into parts at every 4-byte-aligned magic in it."""
    payload = bytes(payload)
    if len(payload) > LENGTH_MASK:
        raise ValueError(f"a RecordIO record holds at most {LENGTH_MASK} bytes, got {len(payload)}")
    cuts = []
    pos = payload.find(MAGIC_BYTES)
    while pos >= 0:
        if pos % 4 == 0:
            cuts.append(pos)
            pos = payload.find(MAGIC_BYTES, pos + 4)
        else:
            pos = payload.find(MAGIC_BYTES, pos + 1)
    out = []
    start = 0
    for i, cut in enumerate(cuts):
        cflag = 1 if i == 0 else 2
        out.append(_PART.pack(MAGIC, (cflag << LENGTH_BITS) | (cut - start)))
        out.append(payload[start:cut])  # aligned cut: no padding needed
        start = cut + 4
    cflag = 3 if cuts else 0
    tail = payload[start:]
    out.append(_PART.pack(MAGIC, (cflag << LENGTH_BITS) | len(tail)))
    out.append(tail)
    out.append(b"\0" * (_pad4(len(tail)) - len(tail)))
    return b"".join(out)


def _name(where) -> str:
    """``where`` may be a string or a function returning one (built only when an error is raised)."""
    return where() if callable(where) else where


def decode_record(buf, pos: int = 0, where="record") -> Tuple[bytes, int]:
    """Parse the record starting at ``buf[pos]``; return (payload, position after it). ``where`` names it in errors."""
    if pos + 8 <= len(buf):  # fast path: one whole part
        magic, lrecord = _PART.unpack_from(buf, pos)
        length = lrecord & LENGTH_MASK
        if magic == MAGIC and lrecord >> LENGTH_BITS == 0 and pos + 8 + length <= len(buf):
            return buf[pos + 8:pos + 8 + length], pos + 8 + _pad4(length)
    parts = []
    expect_first = True
    while True:
        if pos + 8 > len(buf):
            raise DataError(
                f"{_name(where)}: truncated record (needs a part header at byte {pos}, buffer ends at {len(buf)})"
            )
        magic, lrecord = _PART.unpack_from(buf, pos)
        if magic != MAGIC:
            raise DataError(f"{_name(where)}: bad magic 0x{magic:08x} at byte {pos}, expected 0x{MAGIC:08x}")
        cflag, length = lrecord >> LENGTH_BITS, lrecord & LENGTH_MASK
        if (cflag in (0, 1)) != expect_first:
            raise DataError(f"{_name(where)}: part flag {cflag} out of sequence at byte {pos}")
        end = pos + 8 + length
        if end > len(buf):
            raise DataError(
                f"{_name(where)}: truncated record (part of {length} bytes at byte {pos}, data ends at {len(buf)})"
            )
        parts.append(bytes(buf[pos + 8:end]))
        pos += 8 + _pad4(length)
        if cflag in (0, 3):
            return MAGIC_BYTES.join(parts), pos
        expect_first = False


# ----------------------------------------------------------------------------------------------- header
@dataclass
class RecordHeader:
    """The ``IfQQ`` header of an image record; ``label`` is a float, or a float32 vector when ``flag > 0``."""

    flag: int
    label: Union[float, np.ndarray]
    id: int = 0
    id2: int = 0


def pack(label, payload: bytes = b"", id: int = 0, id2: int = 0) -> bytes:  # noqa: A002 - MXNet's field name
    """Header + payload. A scalar ``label`` is stored in the header (flag 0); a sequence becomes flag float32s."""
    if np.ndim(label) == 0:
        return struct.pack(HEADER_FORMAT, 0, float(label), int(id), int(id2)) + bytes(payload)
    vector = np.asarray(label, dtype="<f4").ravel()
    return struct.pack(HEADER_FORMAT, len(vector), 0.0, int(id), int(id2)) + vector.tobytes() + bytes(payload)


def unpack(record: bytes, where="record") -> Tuple[RecordHeader, bytes]:
    """Split a record payload into (RecordHeader, image bytes)."""
    if len(record) < HEADER_SIZE:
        raise DataError(
            f"{_name(where)}: {len(record)} bytes, shorter than the {HEADER_SIZE}-byte image-record header"
        )
    flag, label, id_, id2 = struct.unpack_from(HEADER_FORMAT, record, 0)
    rest = record[HEADER_SIZE:]
    if flag > 0:
        if len(rest) < 4 * flag:
            raise DataError(
                f"{_name(where)}: header announces {flag} float labels but the record ends after {len(rest)} bytes"
            )
        label = np.frombuffer(rest, dtype="<f4", count=flag).astype(np.float32)
        rest = rest[4 * flag:]
    return RecordHeader(flag, label, id_, id2), rest


def class_label(header: RecordHeader) -> float:
    """The class label of an image record: the scalar label, or the first of a label vector (InsightFace)."""
    return float(header.label) if header.flag == 0 else float(header.label[0])


# ----------------------------------------------------------------------------------------------- index
def _parse_index_fast(data: bytes):
    """[n, 2] int64 table of a well-formed index (one tab and two integers per non-blank line), else None."""
    lines = [line for line in data.split(b"\n") if line.strip()]
    tokens = data.split()
    if data.count(b"\t") != len(lines) or len(tokens) != 2 * len(lines):
        return None
    try:
        return np.array(tokens, dtype=np.bytes_).astype(np.int64).reshape(-1, 2)
    except ValueError:
        return None


def _has_duplicates(values: np.ndarray) -> bool:
    ordered = np.sort(values)
    return bool((ordered[1:] == ordered[:-1]).any())


def read_index(idx_path: str, rec_size: int = None):
    """Read ``key<TAB>offset`` lines; return (keys, offsets) int64 arrays. Bad lines raise DataError naming the line."""
    if not os.path.isfile(idx_path):
        raise DataError(f"index file '{idx_path}' does not exist")
    with open(idx_path, "rb") as f:
        data = f.read()
    table = _parse_index_fast(data)
    if table is not None:
        keys, offsets = table[:, 0], table[:, 1]
        outside = (offsets < 0) | (offsets > rec_size - 8) if rec_size is not None else np.zeros(len(keys), bool)
        if not outside.any() and not _has_duplicates(keys):
            return keys, offsets
    keys, offsets = [], []  # slow path: find the offending line for the message
    for lineno, line in enumerate(data.split(b"\n"), start=1):
        if not line.strip():
            continue
        fields = line.split()
        try:
            if len(fields) != 2:
                raise ValueError
            key, offset = int(fields[0]), int(fields[1])
        except ValueError:
            raise DataError(
                f"index file '{idx_path}' line {lineno}: expected 'key<TAB>offset', got {line[:60]!r} "
                f"(truncated or not an index?)"
            ) from None
        if rec_size is not None and not 0 <= offset <= rec_size - 8:
            raise DataError(
                f"index file '{idx_path}' line {lineno}: record {key} at offset {offset} lies outside the "
                f"{rec_size}-byte record file (truncated .rec or an index of another file?)"
            )
        keys.append(key)
        offsets.append(offset)
    keys = np.asarray(keys, dtype=np.int64)
    if _has_duplicates(keys):
        raise DataError(f"index file '{idx_path}' lists a key twice")
    return keys, np.asarray(offsets, dtype=np.int64)


def record_ends(offsets: np.ndarray, rec_size: int) -> np.ndarray:
    """For each record offset, where the next record starts (or the file ends): an upper bound of its bytes."""
    starts = np.sort(np.append(offsets, rec_size))
    return starts[np.searchsorted(starts, offsets, side="right")]


# ----------------------------------------------------------------------------------------------- writer / reader
class RecordIOWriter:
    """Append records to a ``.rec`` file and, when ``idx_path`` is given, their ``key<TAB>offset`` lines."""

    def __init__(self, rec_path: str, idx_path: str = None):
        self.rec_path = rec_path
        self._rec = open(rec_path, "wb")
        self._idx = open(idx_path, "w") if idx_path else None
        self._next_key = 0

    def write(self, payload: bytes, key: int = None) -> int:
        """Write one record (the key defaults to a running count); return its offset."""
        key = self._next_key if key is None else int(key)
        self._next_key = key + 1
        offset = self._rec.tell()
        self._rec.write(encode_record(payload))
        if self._idx is not None:
            self._idx.write(f"{key}\t{offset}\n")
        return offset

    def close(self):
        """Flush and close both files."""
        self._rec.close()
        if self._idx is not None:
            self._idx.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class RecordIOReader:
    """Random access to an indexed ``.rec`` file with one file handle per process (reopened after a fork).

    Reads use ``os.pread`` of the bytes between a record's offset and the next record's, so one system call fetches
    a record and there is no shared file position between threads or forked DataLoader workers.
    """

    def __init__(self, rec_path: str, idx_path: str):
        if not os.path.isfile(rec_path):
            raise DataError(f"record file '{rec_path}' does not exist")
        self.rec_path = rec_path
        self.idx_path = idx_path
        self.size = os.path.getsize(rec_path)
        self.keys, self.offsets = read_index(idx_path, self.size)
        if not len(self.keys) and self.size:
            raise DataError(f"index file '{idx_path}' lists no record, but '{rec_path}' holds {self.size} bytes "
                            f"(an emptied or truncated .idx?); pack the images again to rebuild it")
        self.ends = record_ends(self.offsets, self.size)
        if np.all(self.keys[1:] > self.keys[:-1]):  # the usual case: no extra arrays
            self._sorter, self._sorted_keys = None, self.keys
        else:
            self._sorter = np.argsort(self.keys, kind="stable")
            self._sorted_keys = self.keys[self._sorter]
        self._fd = None
        self._pid = None

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_fd"], state["_pid"] = None, None
        return state

    def _handle(self) -> int:
        pid = os.getpid()
        if self._fd is None or self._pid != pid:
            self._fd = os.open(self.rec_path, os.O_RDONLY | getattr(os, "O_BINARY", 0))
            self._pid = pid
        return self._fd

    def close(self):
        """Close this process's handle (a later read reopens it)."""
        if self._fd is not None and self._pid == os.getpid():
            os.close(self._fd)
        self._fd, self._pid = None, None

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    def rows_of(self, keys) -> np.ndarray:
        """Index rows of ``keys`` (-1 where the index does not list a key)."""
        keys = np.asarray(keys, dtype=np.int64)
        if len(self._sorted_keys) == 0:
            return np.full(keys.shape, -1, dtype=np.int64)
        at = np.minimum(np.searchsorted(self._sorted_keys, keys), len(self._sorted_keys) - 1)
        rows = at if self._sorter is None else self._sorter[at]
        return np.where(self._sorted_keys[at] == keys, rows, -1).astype(np.int64)

    def has_key(self, key: int) -> bool:
        """True when the index lists ``key``."""
        return bool(self.rows_of([key])[0] >= 0)

    def position(self, key: int) -> int:
        """Row of ``key`` in the index arrays (DataError if the index does not list it)."""
        row = int(self.rows_of([key])[0])
        if row < 0:
            raise DataError(f"index file '{self.idx_path}' has no record {key}")
        return row

    def _pread(self, offset: int, length: int) -> bytes:
        fd = self._handle()
        if hasattr(os, "pread"):
            return os.pread(fd, length, offset)
        os.lseek(fd, offset, os.SEEK_SET)  # pragma: no cover - Windows
        return os.read(fd, length)

    def read_row(self, row: int) -> bytes:
        """Payload of the record in index row ``row``."""
        offset, end = int(self.offsets[row]), int(self.ends[row])
        data = self._pread(offset, end - offset)
        where = lambda: f"'{self.rec_path}' record {int(self.keys[row])} (offset {offset})"  # noqa: E731
        return decode_record(data, 0, where)[0]

    def read(self, key: int) -> bytes:
        """Payload of the record with ``key``."""
        return self.read_row(self.position(key))

    def scan_headers(self, rows: np.ndarray = None, chunk: int = 65536):
        """Vectorised header scan of index rows without reading images; returns a dict of arrays.

        Keys: ``magic_ok`` (bool), ``flag`` (int64), ``label`` (float64: scalar label or first vector label),
        ``labels2`` (float64: second vector label or NaN, used for InsightFace's header record) and ``payload_len``
        (int64: length of the first part). Records whose header is split over parts are read in full.
        """
        rows = np.arange(len(self.keys)) if rows is None else np.asarray(rows, dtype=np.int64)
        n = len(rows)
        out = {
            "magic_ok": np.zeros(n, bool), "flag": np.zeros(n, np.int64), "label": np.full(n, np.nan),
            "labels2": np.full(n, np.nan), "payload_len": np.zeros(n, np.int64),
        }
        if n == 0 or self.size == 0:
            return out
        data = np.memmap(self.rec_path, dtype=np.uint8, mode="r")
        try:
            for lo in range(0, n, chunk):
                self._scan_chunk(data, rows[lo:lo + chunk], lo, out)
        finally:
            del data
        return out

    def _scan_chunk(self, data, sel, lo, out):
        """Headers of the records ``sel`` (index rows) into ``out[lo:lo + len(sel)]``."""
        width = 8 + HEADER_SIZE + 8  # part header, IfQQ, two float labels
        start, stop = self.offsets[sel], self.ends[sel]
        idx = start[:, None] + np.arange(width)[None, :]
        raw = data[np.minimum(idx, self.size - 1)]
        raw[~(idx < stop[:, None])] = 0
        words = np.ascontiguousarray(raw).view("<u4")  # [k, 10] uint32
        magic, lrec = words[:, 0], words[:, 1]
        cflag, plen = lrec >> LENGTH_BITS, (lrec & LENGTH_MASK).astype(np.int64)
        flag = words[:, 2].astype(np.int64)
        head_label = words[:, 3].view("<f4").astype(np.float64)
        vec0 = words[:, 8].view("<f4").astype(np.float64)
        vec1 = words[:, 9].view("<f4").astype(np.float64)
        part = slice(lo, lo + len(sel))
        out["magic_ok"][part] = (magic == MAGIC) & (cflag <= 1)
        out["flag"][part] = flag
        out["label"][part] = np.where(flag > 0, vec0, head_label)
        out["labels2"][part] = np.where(flag > 1, vec1, np.nan)
        out["payload_len"][part] = plen
        need = HEADER_SIZE + 4 * np.minimum(flag, 2)
        slow = out["magic_ok"][part] & ((plen < need) | (stop - start < 8 + need))
        for j in np.flatnonzero(slow):
            self._scan_slow(int(sel[j]), lo + j, out)

    def _scan_slow(self, row, j, out):
        """Header of one record read in full (its header straddles a part boundary or is truncated)."""
        where = f"'{self.rec_path}' record {int(self.keys[row])}"
        try:
            header, _ = unpack(self.read_row(row), where)
        except DataError:
            out["magic_ok"][j] = False
            return
        out["flag"][j] = header.flag
        out["label"][j] = class_label(header)
        out["labels2"][j] = float(header.label[1]) if header.flag > 1 else np.nan
        out["payload_len"][j] = 1 << 30  # long enough: header complete


def iterate(rec_path: str) -> Iterator[bytes]:
    """Every record payload of a ``.rec`` file in file order (no index needed)."""
    with open(rec_path, "rb") as f:
        data = f.read()
    pos = 0
    while pos < len(data):
        payload, pos = decode_record(data, pos, f"'{rec_path}' record at byte {pos}")
        yield payload
