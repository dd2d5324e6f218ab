"""RecordIO framing, index and header, checked against byte layouts written by hand from the dmlc/MXNet spec."""
import os
import struct

import numpy as np
import pytest

from mtl.core.errors import DataError
from mtl.data import recordio

MAGIC = 0xCED7230A
M = struct.pack("<I", MAGIC)


def lrec(cflag, length):
    """dmlc's lrecord word: continue flag in the top 3 bits, length in the low 29."""
    return struct.pack("<I", (cflag << 29) | length)


def reference_frame(payload: bytes) -> bytes:
    """Independent dmlc framing: split at every 4-aligned magic, pad only the last part (cf. dmlc-core recordio.cc)."""
    cuts = [i for i in range(0, len(payload) - 3, 4) if payload[i:i + 4] == M]
    out, start = b"", 0
    for n, cut in enumerate(cuts):
        out += M + lrec(1 if n == 0 else 2, cut - start) + payload[start:cut]
        start = cut + 4
    tail = payload[start:]
    out += M + lrec(3 if cuts else 0, len(tail)) + tail + b"\0" * (-len(tail) % 4)
    return out


def test_framing_matches_hand_written_bytes():
    payload = b"\x01\x02\x03\x04" + M + b"\x05"
    expected = M + lrec(1, 4) + b"\x01\x02\x03\x04" + M + lrec(3, 1) + b"\x05\0\0\0"
    assert recordio.encode_record(payload) == expected
    assert recordio.decode_record(expected) == (payload, len(expected))
    # a magic at an unaligned position stays inside one whole part
    unaligned = b"\x09" + M + b"\x0a\x0b\x0c"
    assert recordio.encode_record(unaligned) == M + lrec(0, 8) + unaligned


@pytest.mark.parametrize(
    "payload",
    [b"", b"a", b"abcde", M, M + M, b"xy" + M + b"zw" + M, b"abcd" + M + M + b"efgh" + M, M + b"tail",
     b"12" + M + b"3"],
)
def test_framing_round_trip_and_reference(payload):
    framed = recordio.encode_record(payload)
    assert framed == reference_frame(payload)
    assert len(framed) % 4 == 0
    decoded, end = recordio.decode_record(framed + b"junk")
    assert decoded == payload and end == len(framed)


def test_decode_rejects_bad_magic_sequence_and_truncation():
    good = recordio.encode_record(b"abcd" + M + b"efgh")
    with pytest.raises(DataError, match="bad magic 0x00000000"):
        recordio.decode_record(b"\0" * 4 + good[4:], where="x.rec record 3")
    with pytest.raises(DataError, match="truncated"):
        recordio.decode_record(good[:-4])
    with pytest.raises(DataError, match="out of sequence"):
        recordio.decode_record(M + lrec(3, 0))  # an 'end' part with no start


def test_header_pack_unpack_against_struct():
    packed = recordio.pack(7, b"IMG", id=5, id2=9)
    assert packed == struct.pack("IfQQ", 0, 7.0, 5, 9) + b"IMG"
    header, rest = recordio.unpack(packed)
    assert (header.flag, header.label, header.id, header.id2, rest) == (0, 7.0, 5, 9, b"IMG")
    labels = [3.0, 0.25, -1.5]
    packed = recordio.pack(labels, b"JPEG", id=2)
    assert packed == struct.pack("IfQQ", 3, 0.0, 2, 0) + struct.pack("<3f", *labels) + b"JPEG"
    header, rest = recordio.unpack(packed)
    assert header.flag == 3 and rest == b"JPEG"
    np.testing.assert_array_equal(header.label, np.array(labels, np.float32))
    assert recordio.class_label(header) == 3.0
    with pytest.raises(DataError, match="announces 3 float labels"):
        recordio.unpack(struct.pack("IfQQ", 3, 0.0, 0, 0) + b"\0" * 8, where="r")


def write_reference(tmp_path, payloads):
    """A .rec/.idx pair written with struct only (keys 0..n-1), as MXNet's MXIndexedRecordIO lays it out."""
    rec, idx = tmp_path / "ref.rec", tmp_path / "ref.idx"
    offsets, blob = [], b""
    for p in payloads:
        offsets.append(len(blob))
        blob += reference_frame(p)
    rec.write_bytes(blob)
    idx.write_text("".join(f"{k}\t{o}\n" for k, o in enumerate(offsets)))
    return str(rec), str(idx), offsets


def test_writer_output_equals_reference_and_reader_reads_any_order(tmp_path):
    rng = np.random.RandomState(0)
    payloads = [rng.bytes(rng.randint(0, 60)) for _ in range(20)]
    payloads[3] = b"ab" + M + b"cd" + M + b"ef"  # magic at positions 2 (unaligned) and 8 (aligned)
    payloads[7] = M * 3
    rec_ref, idx_ref, offsets = write_reference(tmp_path, payloads)
    rec, idx = str(tmp_path / "w.rec"), str(tmp_path / "w.idx")
    with recordio.RecordIOWriter(rec, idx) as writer:
        for p in payloads:
            writer.write(p)
    assert open(rec, "rb").read() == open(rec_ref, "rb").read()
    assert open(idx).read() == open(idx_ref).read()
    reader = recordio.RecordIOReader(rec_ref, idx_ref)
    for key in rng.permutation(len(payloads)):
        assert reader.read(int(key)) == payloads[key]
    assert list(recordio.iterate(rec_ref)) == payloads
    with pytest.raises(DataError, match="has no record 99"):
        reader.read(99)


def test_index_in_any_key_order(tmp_path):
    payloads = [bytes([k]) * (3 * k + 1) for k in range(6)]
    rec, idx, offsets = write_reference(tmp_path, payloads)
    lines = open(idx).read().splitlines()
    open(idx, "w").write("\n".join(lines[::-1]) + "\n")
    reader = recordio.RecordIOReader(rec, idx)
    assert [reader.read(k) for k in range(6)] == payloads
    np.testing.assert_array_equal(reader.rows_of([0, 5, 7]), [5, 0, -1])


def test_scan_headers_agrees_with_full_unpack(tmp_path):
    rng = np.random.RandomState(1)
    payloads = []
    for k in range(30):
        if k % 3 == 0:
            payloads.append(recordio.pack(float(k), rng.bytes(k)))
        else:
            payloads.append(recordio.pack([k + 0.5, -k, 2.0][: 1 + k % 3], rng.bytes(k), id=k))
    # id == MAGIC puts the magic at payload byte 8 (aligned): the header itself is split into two parts
    payloads.append(recordio.pack([5.0, 6.0], b"x", id=MAGIC))
    payloads.append(recordio.pack(4.0, b"", id2=MAGIC))
    rec, idx, _ = write_reference(tmp_path, payloads)
    reader = recordio.RecordIOReader(rec, idx)
    heads = reader.scan_headers(chunk=7)
    for row, p in enumerate(payloads):
        header, _ = recordio.unpack(p)
        assert heads["magic_ok"][row]
        assert heads["flag"][row] == header.flag
        assert heads["label"][row] == recordio.class_label(header)
        if header.flag > 1:
            assert heads["labels2"][row] == header.label[1]


def test_scan_flags_bad_magic(tmp_path):
    payloads = [recordio.pack(float(k), b"abc") for k in range(5)]
    rec, idx, offsets = write_reference(tmp_path, payloads)
    blob = bytearray(open(rec, "rb").read())
    blob[offsets[2]:offsets[2] + 4] = b"\xde\xad\xbe\xef"
    open(rec, "wb").write(bytes(blob))
    heads = recordio.RecordIOReader(rec, idx).scan_headers()
    assert heads["magic_ok"].tolist() == [True, True, False, True, True]


def test_index_errors_name_file_and_line(tmp_path):
    rec, idx, offsets = write_reference(tmp_path, [b"abcd"] * 4)
    text = open(idx).read()
    open(idx, "w").write(text[: text.rindex("\t") + 1])  # last line cut after the tab
    with pytest.raises(DataError, match=r"ref.idx' line 4: expected 'key<TAB>offset'"):
        recordio.RecordIOReader(rec, idx)
    open(idx, "w").write(text + "4\t100000\n")
    with pytest.raises(DataError, match=r"line 5: record 4 at offset 100000 lies outside"):
        recordio.RecordIOReader(rec, idx)
    os.remove(idx)
    with pytest.raises(DataError, match="ref.idx' does not exist"):
        recordio.RecordIOReader(rec, idx)


def test_reader_reopens_handle_after_fork(tmp_path):
    payloads = [bytes([k]) * (k + 1) for k in range(8)]
    rec, idx, _ = write_reference(tmp_path, payloads)
    reader = recordio.RecordIOReader(rec, idx)
    assert reader.read(1) == payloads[1]
    parent_fd = reader._fd
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: must open its own handle and read correctly
        ok = reader.read(5) == payloads[5] and reader._fd is not None and reader._pid == os.getpid()
        os.write(write_end, b"1" if ok else b"0")
        os._exit(0)
    os.waitpid(pid, 0)
    assert os.read(read_end, 1) == b"1"
    assert reader._fd == parent_fd and reader.read(7) == payloads[7]
