"""Face data formats end to end: RecordIO / label-list readers, transforms, .bin and pairs sets, pack and inspect.

References: pixels are compared with Pillow decoding the same bytes plus the normalisation formula in float64
(or with the source arrays when the payload is lossless PNG); labels with what the test wrote; counts with numpy.
"""
import argparse
import io
import os
import pickle
import struct

import numpy as np
import pytest
from PIL import Image

from mtl.commands import data as datatools
from mtl.core.errors import ConfigError, DataError
from mtl.data import recordio, transforms
from mtl.data.transforms import flip_coin
from mtl.data.verification_sets import load_verification_set, read_bin, read_pairs, write_bin
from mtl.readers.image_list import ImageListReader
from mtl.readers.recordio_reader import RecordIOFaceReader

M = struct.pack("<I", recordio.MAGIC)
DECODERS = pytest.mark.parametrize("decoder", ["pillow", "opencv"])  # OpenCV is a dependency (requirements.txt)


# ----------------------------------------------------------------------------------------------- helpers
def face_array(seed, size=112):
    """A smooth random RGB image (JPEG-friendly), uint8 [size, size, 3]."""
    rng = np.random.RandomState(seed)
    small = Image.fromarray(rng.randint(0, 256, (6, 6, 3)).astype(np.uint8))
    return np.asarray(small.resize((size, size), Image.BILINEAR))


def encode(array, fmt="JPEG"):
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, format=fmt, **({"quality": 90} if fmt == "JPEG" else {}))
    return buffer.getvalue()


def jpeg_with_magic(array):
    """A JPEG whose comment segment holds the RecordIO magic at payload offsets 32, 36, 40 (4-aligned)."""
    data = encode(array)
    comment = b"\0\0" + M * 3 + b"\0\0"  # comment bytes start at image byte 6, so the magic starts at byte 8
    return data[:2] + b"\xff\xfe" + struct.pack(">H", len(comment) + 2) + comment + data[2:]


def reference(data, size=112, flip=False):
    """(x / 255 - 0.5) / 0.5 of Pillow's decode (resized bilinear if needed), CHW, in float64."""
    image = Image.open(io.BytesIO(data)).convert("RGB")
    if image.size != (size, size):
        image = image.resize((size, size), Image.BILINEAR)
    chw = ((np.asarray(image, dtype=np.float64) / 255.0 - 0.5) / 0.5).transpose(2, 0, 1)
    return chw[:, :, ::-1] if flip else chw


def write_insightface(folder, images, labels, num_classes=None, header=True, property_classes=None):
    """An InsightFace-layout dataset: header record 0, images 1..N, identity records (labels must be grouped)."""
    os.makedirs(folder, exist_ok=True)
    n = len(images)
    num_classes = num_classes if num_classes is not None else max(labels) + 1
    with recordio.RecordIOWriter(os.path.join(folder, "train.rec"), os.path.join(folder, "train.idx")) as w:
        if header:
            w.write(recordio.pack([n + 1, n + 1 + num_classes]), key=0)
        first = 1 if header else 0
        for k, (data, label) in enumerate(zip(images, labels)):
            w.write(recordio.pack(label, data, id=k + first), key=k + first)
        if header:
            for c in range(num_classes):
                keys = [k + 1 for k, lab in enumerate(labels) if lab == c]
                w.write(recordio.pack([min(keys), max(keys) + 1] if keys else [0, 0]), key=n + 1 + c)
    if property_classes is not None:
        with open(os.path.join(folder, "property"), "w") as f:
            f.write(f"{property_classes},112,112\n")
    return folder


@pytest.fixture()
def dataset(tmp_path):
    """4 classes with 3, 4, 5, 8 JPEG images; image 2 contains the magic (a multi-part record)."""
    labels = [c for c, n in enumerate((3, 4, 5, 8)) for _ in range(n)]
    images = [encode(face_array(i)) for i in range(len(labels))]
    images[2] = jpeg_with_magic(face_array(2))
    folder = write_insightface(str(tmp_path / "ds"), images, labels, property_classes=4)
    return folder, images, labels


def record_offsets(folder):
    keys, offsets = recordio.read_index(os.path.join(folder, "train.idx"))
    return dict(zip(keys.tolist(), offsets.tolist()))


# ----------------------------------------------------------------------------------------------- recordio reader
@DECODERS
def test_recordio_reader_round_trip(dataset, decoder):
    folder, images, labels = dataset
    framed = recordio.encode_record(recordio.pack(labels[2], images[2]))
    assert framed[4:8] == struct.pack("<I", (1 << 29) | 32)  # really a multi-part record
    reader = RecordIOFaceReader(folder, flip=False, decoder=decoder)
    assert reader.has_header_record and reader.num_classes == 4 and len(reader) == len(images)
    np.testing.assert_array_equal(reader.labels(), labels)
    for i in range(len(images)):
        item = reader[i]
        assert item["label"].dtype == np.int64 and item["label"].shape == () and int(item["label"]) == labels[i]
        assert item["image"].dtype == np.float32 and item["image"].shape == (3, 112, 112)
        np.testing.assert_allclose(item["image"], reference(images[i]), atol=1e-6, rtol=0)
    assert [f.describe() for f in reader.fields()] == ["image[3, 112, 112] float32", "label[] int64"]


@DECODERS
def test_flip_is_a_function_of_seed_epoch_index(dataset, decoder):
    folder, images, _ = dataset
    reader = RecordIOFaceReader(folder, seed=3, decoder=decoder)  # train: flip on by default
    copy = pickle.loads(pickle.dumps(reader))  # what a spawned worker gets
    flipped = 0
    for epoch in (0, 1):
        reader.set_epoch(epoch)
        for i in range(len(images)):
            coin = flip_coin(3, epoch, i)
            flipped += coin
            np.testing.assert_allclose(reader[i]["image"], reference(images[i], flip=coin), atol=1e-6, rtol=0)
            np.testing.assert_array_equal(copy[(i, epoch)]["image"], reader[i]["image"])
    assert 0 < flipped < 2 * len(images)
    draws = [flip_coin(0, e, i) for e in range(4) for i in range(1000)]
    assert 0.45 < np.mean(draws) < 0.55


@DECODERS
def test_no_header_multi_float_labels_png_and_resize(tmp_path, decoder):
    arrays = [face_array(10 + i, size=100) for i in range(6)]
    labels = [0, 2, 1, 2, 0, 1]
    folder = str(tmp_path / "nohead")
    os.makedirs(folder)
    with recordio.RecordIOWriter(f"{folder}/train.rec", f"{folder}/train.idx") as w:
        for a, lab in zip(arrays, labels):
            w.write(recordio.pack([lab, 0.5, -3.0], encode(a, "PNG")))
    exact = RecordIOFaceReader(folder, image_size=100, flip=False, decoder=decoder)
    assert not exact.has_header_record and exact.num_classes == 3
    np.testing.assert_array_equal(exact.labels(), labels)
    for i, a in enumerate(arrays):
        expected = ((a.astype(np.float64) / 255 - 0.5) / 0.5).transpose(2, 0, 1)
        np.testing.assert_allclose(exact[i]["image"], expected, atol=1e-6, rtol=0)
    resized = RecordIOFaceReader(f"{folder}/train", image_size=112, flip=False, decoder=decoder)
    np.testing.assert_allclose(resized[4]["image"], reference(encode(arrays[4], "PNG"), 112), atol=1e-6, rtol=0)


def test_holdout_split_is_stratified_and_disjoint(dataset):
    folder, _, labels = dataset
    train = RecordIOFaceReader(folder, eval_fraction=0.25)
    held = RecordIOFaceReader(folder, split="eval", eval_fraction=0.25)
    assert not held.flip and train.flip
    train.set_augmentation(False)  # unflipped: the stored images, compared as they are
    images = lambda reader: {reader[i]["image"].tobytes() for i in range(len(reader))}  # noqa: E731
    assert len(images(train)) == len(train) and images(train).isdisjoint(images(held))  # none in both splits
    assert len(train) + len(held) == len(labels)
    counts = np.bincount(labels)
    np.testing.assert_array_equal(np.bincount(held.labels(), minlength=4), np.floor(counts * 0.25))
    with pytest.raises(ConfigError, match="eval_fraction"):
        RecordIOFaceReader(folder, split="eval")


def test_decoder_option(dataset, monkeypatch):
    folder, _, _ = dataset
    with pytest.raises(ConfigError, match="decoder must be one of auto, opencv, pillow"):
        RecordIOFaceReader(folder, decoder="turbo")
    monkeypatch.setattr(transforms, "_CV2", [None])  # as if OpenCV were not installed
    with pytest.raises(ConfigError, match="decoder 'opencv' needs the opencv-python-headless package"):
        RecordIOFaceReader(folder, decoder="opencv")
    assert RecordIOFaceReader(folder).transform.decoder == "pillow"


# ----------------------------------------------------------------------------------------------- bad data
def test_missing_and_truncated_files(dataset, tmp_path):
    folder, images, _ = dataset
    with pytest.raises(DataError, match=r"nowhere/train.rec: file does not exist"):
        RecordIOFaceReader(str(tmp_path / "nowhere") + "/")
    idx = os.path.join(folder, "train.idx")
    lines = open(idx).read().splitlines(keepends=True)
    open(idx, "w").write("".join(lines[:10]))  # header says images 1..20
    with pytest.raises(DataError, match=r"train.idx' has no record 10 .*truncated .idx"):
        RecordIOFaceReader(folder)
    open(idx, "w").write("".join(lines[:-1]) + lines[-1][:3])
    with pytest.raises(DataError, match=rf"train.idx' line {len(lines)}: expected"):
        RecordIOFaceReader(folder)
    os.remove(idx)
    with pytest.raises(DataError, match="train.idx: file does not exist"):
        RecordIOFaceReader(folder)


def test_bad_magic_found_at_start_up(dataset):
    folder, images, labels = dataset
    rec = os.path.join(folder, "train.rec")
    blob = bytearray(open(rec, "rb").read())
    at = record_offsets(folder)[5]
    blob[at:at + 4] = b"\0\1\2\3"
    open(rec, "wb").write(bytes(blob))
    with pytest.raises(DataError, match=r"train.rec' record 5 .*bad magic 0x03020100"):
        RecordIOFaceReader(folder)
    reader = RecordIOFaceReader(folder, on_bad_sample="skip")
    assert reader.bad_samples == 1 and len(reader) == len(images) - 1
    np.testing.assert_array_equal(reader.labels(), labels[:4] + labels[5:])


def test_label_outside_range(dataset, tmp_path):
    _, images, labels = dataset
    labels = labels[:-1] + [7]
    folder = write_insightface(str(tmp_path / "lab"), images, labels, num_classes=4, property_classes=4)
    with pytest.raises(DataError, match=rf"train.rec' record {len(images)}: label 7 is outside \[0, 4\)"):
        RecordIOFaceReader(folder)
    reader = RecordIOFaceReader(folder, on_bad_sample="skip")
    assert reader.bad_samples == 1 and reader.labels().max() == 3
    assert RecordIOFaceReader(folder, num_classes=8).num_classes == 8


@DECODERS
def test_undecodable_image_error_and_skip(dataset, tmp_path, decoder):
    _, images, labels = dataset
    images = list(images)
    images[6] = b"\xff\xd8 not really a jpeg"
    folder = write_insightface(str(tmp_path / "dec"), images, labels, property_classes=4)
    reader = RecordIOFaceReader(folder, flip=False, decoder=decoder)  # decode errors surface at the sample
    with pytest.raises(DataError, match=r"train.rec' record 7: cannot decode image"):
        reader[6]
    skipping = RecordIOFaceReader(folder, flip=False, on_bad_sample="skip", decoder=decoder)
    assert skipping.bad_samples == 0
    replaced, following = skipping[6], skipping[7]
    np.testing.assert_array_equal(replaced["image"], following["image"])
    assert int(replaced["label"]) == labels[7]
    skipping[6]
    assert skipping.bad_samples == 1


def test_skips_in_dataloader_workers_reach_the_main_process(dataset, tmp_path):
    import paddle

    _, images, labels = dataset
    images = list(images)
    images[9] = b"garbage"
    folder = write_insightface(str(tmp_path / "workers"), images, labels, property_classes=4)
    reader = RecordIOFaceReader(folder, flip=False, on_bad_sample="skip")
    loader = paddle.io.DataLoader(reader, batch_size=4, shuffle=False, num_workers=2)
    seen = np.concatenate([batch["label"].numpy().ravel() for batch in loader])
    expected = list(labels)
    expected[9] = labels[10]
    np.testing.assert_array_equal(seen, expected)
    assert reader.bad_samples == 1


def _touch_sample(reader, index):
    reader[index]


def test_skip_log_survives_spawn(dataset, tmp_path):
    import multiprocessing

    _, images, labels = dataset
    images = list(images)
    images[4] = b"garbage"
    folder = write_insightface(str(tmp_path / "spawn"), images, labels, property_classes=4)
    reader = RecordIOFaceReader(folder, on_bad_sample="skip", decoder="pillow")
    child = multiprocessing.get_context("spawn").Process(target=_touch_sample, args=(reader, 4))
    child.start()
    child.join(60)
    assert child.exitcode == 0 and reader.bad_samples == 1


# ----------------------------------------------------------------------------------------------- image list
def test_image_list_reader(tmp_path):
    arrays = [face_array(30 + i) for i in range(5)]
    for i, a in enumerate(arrays):
        os.makedirs(tmp_path / f"id{i % 2}", exist_ok=True)
        Image.fromarray(a).save(tmp_path / f"id{i % 2}" / f"img {i}.png")
    rows = [f"id{i % 2}/img {i}.png\t{i % 2}" for i in range(3)] + ["# comment", ""]
    rows += [f"id{i % 2}/img {i}.png {i % 2 + 1}" for i in range(3, 5)]
    (tmp_path / "train.txt").write_text("\n".join(rows) + "\n")
    reader = ImageListReader(str(tmp_path / "train.txt"), flip=False)
    np.testing.assert_array_equal(reader.labels(), [0, 1, 0, 2, 1])
    assert reader.num_classes == 3
    for i, a in enumerate(arrays):
        np.testing.assert_allclose(reader[i]["image"], ((a / 255 - 0.5) / 0.5).transpose(2, 0, 1), atol=1e-6, rtol=0)

    (tmp_path / "bad.txt").write_text("id0/img 0.png\t0\nid1/missing.png\t1\nid0/img 2.png\tabc\n")
    with pytest.raises(DataError, match=r"bad.txt' line 2 \('id1/missing.png'\): file .* does not exist"):
        ImageListReader(str(tmp_path / "bad.txt"))
    skipping = ImageListReader(str(tmp_path / "bad.txt"), on_bad_sample="skip")
    assert len(skipping) == 1 and skipping.bad_samples == 2
    (tmp_path / "bad2.txt").write_text("id0/img 0.png\t0\nid0/img 2.png\tabc\n")
    with pytest.raises(DataError, match=r"bad2.txt' line 2: label 'abc' is not an integer"):
        ImageListReader(str(tmp_path / "bad2.txt"))
    (tmp_path / "late.txt").write_text("id0/img 0.png\t0\nid1/missing.png\t1\n")
    late = ImageListReader(str(tmp_path / "late.txt"), check_files=False)
    with pytest.raises(DataError, match=r"late.txt' line 2 \('id1/missing.png'\): cannot read"):
        late[1]


# ----------------------------------------------------------------------------------------------- verification sets
@DECODERS
def test_bin_round_trip_and_protocol2_numpy_items(tmp_path, decoder):
    arrays = [face_array(50 + i) for i in range(6)]
    issame = [True, False, True]
    write_bin(str(tmp_path / "v.bin"), [encode(a, "PNG") for a in arrays], issame)
    vset = read_bin(str(tmp_path / "v.bin"), decoder=decoder)
    assert vset.name == "v" and vset.num_pairs == 3 and len(vset) == 6
    np.testing.assert_array_equal(vset.issame, issame)
    np.testing.assert_array_equal(vset.pixels, np.stack(arrays))
    expected = ((np.stack(arrays) / 255 - 0.5) / 0.5).transpose(0, 3, 1, 2)
    np.testing.assert_allclose(vset.images(), expected, atol=1e-6, rtol=0)
    np.testing.assert_allclose(vset.images(2, 4, flip=True), expected[2:4, :, :, ::-1], atol=1e-6, rtol=0)
    assert [b.shape[0] for b in vset.batches(4)] == [4, 2]
    # as written by older tools: numpy uint8 arrays of JPEG bytes, numpy bools, pickle protocol 2
    items = [np.frombuffer(encode(a), dtype=np.uint8) for a in arrays]
    with open(tmp_path / "old.bin", "wb") as f:
        pickle.dump((items, [np.bool_(s) for s in issame]), f, protocol=2)
    old = load_verification_set(str(tmp_path / "old.bin"), image_size=64, decoder=decoder)
    assert old.pixels.shape == (6, 64, 64, 3)
    np.testing.assert_allclose(old.images(5, 6)[0], reference(encode(arrays[5]), 64), atol=1e-6, rtol=0)


def test_bin_errors(tmp_path):
    good = encode(face_array(1), "PNG")
    write_bin(str(tmp_path / "bad.bin"), [good, b"junk"], [True])
    with pytest.raises(DataError, match=r"bad.bin' image 1: cannot decode"):
        read_bin(str(tmp_path / "bad.bin"))
    with open(tmp_path / "count.bin", "wb") as f:
        pickle.dump(([good] * 3, [True]), f)
    with pytest.raises(DataError, match="3 images for 1 pairs"):
        read_bin(str(tmp_path / "count.bin"))
    with open(tmp_path / "evil.bin", "wb") as f:
        pickle.dump(([good, good], [os.getpid]), f)
    with pytest.raises(DataError, match="evil.bin. was not loaded: it holds .posix.getpid."):
        read_bin(str(tmp_path / "evil.bin"))
    with pytest.raises(DataError, match="does not exist"):
        read_bin(str(tmp_path / "none.bin"))
    # each was a TypeError or ValueError traceback of numpy or Python (found by a fuzzing helper)
    cases = [((5, [True]), r"got \(int, list\)"), (([good, good], None), r"got \(list, NoneType\)"),
             (([good] * 4, [True, [False]]), "issame holds values other than True/False"), (([], []), "holds no pair")]
    for content, words in cases:
        with open(tmp_path / "shape.bin", "wb") as f:
            pickle.dump(content, f)
        with pytest.raises(DataError, match=f"shape.bin'.*{words}"):
            read_bin(str(tmp_path / "shape.bin"))


def test_pairs_list(tmp_path):
    arrays = [face_array(70 + i) for i in range(3)]
    for i, a in enumerate(arrays):
        Image.fromarray(a).save(tmp_path / f"p{i}.png")
    (tmp_path / "pairs.txt").write_text("p0.png\tp1.png\t1\np1.png\tp2.png\t0\n")
    vset = read_pairs(str(tmp_path / "pairs.txt"))
    np.testing.assert_array_equal(vset.issame, [True, False])
    np.testing.assert_array_equal(vset.pixels, np.stack([arrays[0], arrays[1], arrays[1], arrays[2]]))
    (tmp_path / "broken.txt").write_text("p0.png\tp1.png\t1\np1.png\tgone.png\t0\n")
    with pytest.raises(DataError, match=r"broken.txt' line 2: cannot read .*gone.png"):
        load_verification_set(str(tmp_path / "broken.txt"))
    (tmp_path / "format.txt").write_text("p0.png\tp1.png\tyes\n")
    with pytest.raises(DataError, match=r"format.txt' line 1: expected"):
        read_pairs(str(tmp_path / "format.txt"))


# ----------------------------------------------------------------------------------------------- pack / inspect
def make_folder(root, counts, size=112, fmt="png"):
    arrays = {}
    for c, n in enumerate(counts):
        os.makedirs(os.path.join(root, f"person_{c:02d}"))
        for j in range(n):
            arrays[(c, j)] = face_array(100 * c + j, size)
            Image.fromarray(arrays[(c, j)]).save(os.path.join(root, f"person_{c:02d}", f"{j:03d}.{fmt}"))
    return arrays


def test_pack_folder_read_back_and_inspect(tmp_path):
    counts = (2, 5, 1, 3)
    arrays = make_folder(str(tmp_path / "faces"), counts)
    summary = datatools.pack(str(tmp_path / "faces"), str(tmp_path / "out" / "train"))
    assert (summary["records"], summary["classes"]) == (11, 4)
    assert open(tmp_path / "out" / "property").read().strip() == "4,112,112"
    reader = RecordIOFaceReader(str(tmp_path / "out"), flip=False)
    order = [(c, j) for c, n in enumerate(counts) for j in range(n)]
    np.testing.assert_array_equal(reader.labels(), [c for c, _ in order])
    for i, key in enumerate(order):
        expected = ((arrays[key] / 255 - 0.5) / 0.5).transpose(2, 0, 1)
        np.testing.assert_allclose(reader[i]["image"], expected, atol=1e-6, rtol=0)
    raw = recordio.RecordIOReader(str(tmp_path / "out" / "train.rec"), str(tmp_path / "out" / "train.idx"))
    header, rest = recordio.unpack(raw.read(0))
    assert header.flag == 2 and header.label.tolist() == [12, 16] and rest == b""
    starts = np.cumsum((0,) + counts) + 1
    for c in range(4):
        identity, _ = recordio.unpack(raw.read(12 + c))
        assert identity.label.tolist() == [starts[c], starts[c + 1]]

    stats = datatools.inspect(str(tmp_path / "out"), str(tmp_path / "sheet.png"), samples=9)
    assert (stats["records"], stats["classes"], stats["num_classes"]) == (11, 4, 4)
    assert (stats["images_per_class_min"], stats["images_per_class_median"], stats["images_per_class_max"]) == (
        1, float(np.median(counts)), 5)
    assert stats["image_size"] == "112x112" and stats["header_record"] and stats["bad_records"] == 0
    with Image.open(tmp_path / "sheet.png") as sheet:
        assert sheet.format == "PNG" and sheet.size[0] > 100


def test_pack_label_list_keeps_bytes_and_resize(tmp_path):
    arrays = [face_array(200 + i, size=96) for i in range(4)]
    for i, a in enumerate(arrays):
        Image.fromarray(a).save(tmp_path / f"{i}.jpg", quality=85)
    (tmp_path / "list.txt").write_text("0.jpg\t1\n1.jpg\t0\n2.jpg\t1\n3.jpg\t2\n")
    os.makedirs(tmp_path / "packed")
    datatools.pack(str(tmp_path / "list.txt"), str(tmp_path / "packed"))
    raw = recordio.RecordIOReader(str(tmp_path / "packed" / "train.rec"), str(tmp_path / "packed" / "train.idx"))
    for key, name in zip((1, 2, 3, 4), ("1.jpg", "0.jpg", "2.jpg", "3.jpg")):  # grouped by label, list order kept
        assert recordio.unpack(raw.read(key))[1] == (tmp_path / name).read_bytes()
    Image.fromarray(face_array(9, size=80)).save(tmp_path / "odd.jpg")
    (tmp_path / "mixed.txt").write_text("0.jpg\t0\nodd.jpg\t1\n")
    with pytest.raises(DataError, match="odd.jpg' is 80x80 .*pass resize"):
        datatools.pack(str(tmp_path / "mixed.txt"), str(tmp_path / "mixed" / "train"))
    datatools.pack(str(tmp_path / "mixed.txt"), str(tmp_path / "mixed" / "train"), resize=64)
    assert open(tmp_path / "mixed" / "property").read().strip() == "2,64,64"
    assert RecordIOFaceReader(str(tmp_path / "mixed"), image_size=64)[1]["image"].shape == (3, 64, 64)
    stats = datatools.inspect(str(tmp_path / "list.txt"), None)
    assert (stats["records"], stats["classes"], stats["image_size"]) == (4, 3, "96x96")
    # a negative label was packed ("wrote 2 images of 1 classes") and inspect then failed in np.bincount
    (tmp_path / "negative.txt").write_text("0.jpg\t0\n1.jpg\t-1\n")
    words = "negative.txt' line 2: label -1 is negative; class labels count from 0"
    for run in (lambda: datatools.pack(str(tmp_path / "negative.txt"), str(tmp_path / "neg" / "train")),
                lambda: ImageListReader(str(tmp_path / "negative.txt"))):
        with pytest.raises(DataError, match=words):
            run()
    assert not (tmp_path / "neg").exists()
    stats = datatools.inspect(str(tmp_path / "negative.txt"), None)  # inspect lists it as a bad record
    assert (stats["records"], stats["classes"]) == (1, 1) and any(words in b for b in stats["bad"]), stats


def test_cli_pack_and_inspect(tmp_path, capsys, monkeypatch):
    make_folder(str(tmp_path / "faces"), (2, 3))
    parser = argparse.ArgumentParser(prog="mtl")
    datatools.add_cli(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["data", "pack", str(tmp_path / "faces"), str(tmp_path / "ds" / "train")])
    assert args.func(args) == 0
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    args = parser.parse_args(["data", "inspect", str(tmp_path / "ds")])
    assert args.func(args) == 0
    out = capsys.readouterr().out
    assert "wrote 5 images of 2 classes" in out and "images_per_class_median" in out and "2.5" in out
    # under runs/inspect/ of the current folder, not in the data's folder (issue 53, item 23)
    assert os.path.isfile(tmp_path / "cwd" / "runs" / "inspect" / "ds_samples.png")
    assert sorted(os.listdir(tmp_path / "ds")) == ["labels.json", "property", "train.idx", "train.rec"]
    args = parser.parse_args(["data", "inspect", str(tmp_path / "ds"), "--sheet", str(tmp_path / "sheet.png")])
    assert args.func(args) == 0 and os.path.isfile(tmp_path / "sheet.png")
    write_bin(str(tmp_path / "v.bin"), [encode(face_array(i), "PNG") for i in range(4)], [True, False])
    stats = datatools.inspect(str(tmp_path / "v.bin"), str(tmp_path / "v.png"))
    assert (stats["records"], stats["pairs"], stats["same_pairs"]) == (4, 2, 1)


def test_pack_keeps_the_property_and_names_another_split_of_the_folder_reads(tmp_path):
    """Packing val into the folder of train replaced the shared property and labels.json: train was then read with
    val's class count (its labels past it an error) and names."""
    make_folder(str(tmp_path / "train_faces"), (2, 3, 1))
    make_folder(str(tmp_path / "val_faces"), (1, 2))  # other people: two classes, not three
    datatools.pack(str(tmp_path / "train_faces"), str(tmp_path / "ds" / "train"))
    before = {name: (tmp_path / "ds" / name).read_bytes() for name in os.listdir(tmp_path / "ds")}
    with pytest.raises(DataError, match=r"holds train.rec, whose property and labels.json this pack would replace "
                                        r"\(its property says 3 classes, this pack has 2\); pack into a folder of its "
                                        r"own \(e.g. .*ds/val/train\)"):
        datatools.pack(str(tmp_path / "val_faces"), str(tmp_path / "ds" / "val"))
    assert {name: (tmp_path / "ds" / name).read_bytes() for name in os.listdir(tmp_path / "ds")} == before
    np.testing.assert_array_equal(RecordIOFaceReader(str(tmp_path / "ds" / "train")).labels(), [0, 0, 1, 1, 1, 2])
    # the same people (a split by images): the shared files stay what they are, so the pack goes ahead
    make_folder(str(tmp_path / "more_faces"), (1, 1, 1))
    assert datatools.pack(str(tmp_path / "more_faces"), str(tmp_path / "ds" / "val"))["records"] == 3
    assert (tmp_path / "ds" / "property").read_bytes() == before["property"]
    # a size that differs is known only once the images are read: refused before anything is renamed
    make_folder(str(tmp_path / "small_faces"), (1, 1, 1), size=64)
    with pytest.raises(DataError, match=r"its property says 112x112 images, this pack's are 64x64"):
        datatools.pack(str(tmp_path / "small_faces"), str(tmp_path / "ds" / "test"))
    assert sorted(os.listdir(tmp_path / "ds")) == sorted(list(before) + ["val.rec", "val.idx"])
    # a split that counts its classes from its header record (no property, no names): a property would override it
    write_insightface(str(tmp_path / "bare"), [encode(face_array(i), "PNG") for i in range(5)], [0, 0, 1, 2, 2])
    with pytest.raises(DataError, match=r"its header record says 3 classes, this pack has 2 and its property would"):
        datatools.pack(str(tmp_path / "val_faces"), str(tmp_path / "bare" / "val"))
    assert sorted(os.listdir(tmp_path / "bare")) == ["train.idx", "train.rec"]
    # other names for the same count of classes
    os.rename(tmp_path / "more_faces" / "person_00", tmp_path / "more_faces" / "somebody")
    with pytest.raises(DataError, match="its labels.json names the classes otherwise"):
        datatools.pack(str(tmp_path / "more_faces"), str(tmp_path / "ds" / "test"))


def test_inspect_lists_labels_past_the_stated_classes_as_bad_records(tmp_path):
    """A property with fewer classes than the labels use made inspect fail (IndexError) on the label names."""
    make_folder(str(tmp_path / "faces"), (2, 3, 1))
    datatools.pack(str(tmp_path / "faces"), str(tmp_path / "ds" / "train"))
    (tmp_path / "ds" / "property").write_text("2,112,112\n")
    stats = datatools.inspect(str(tmp_path / "ds"), str(tmp_path / "sheet.png"), samples=9)
    assert (stats["records"], stats["classes"], stats["num_classes"], stats["bad_records"]) == (5, 2, 2, 1)
    assert stats["bad"] == [f"'{tmp_path / 'ds' / 'train.rec'}' record 6: label 2 is outside [0, 2) (property "
                            f"'{tmp_path / 'ds' / 'property'}' says 2 classes)"]
    assert stats["labels"] == {0: "person_00", 1: "person_01"}
    with pytest.raises(DataError, match="record 6: label 2 is outside"):  # what the reader says of the same record
        RecordIOFaceReader(str(tmp_path / "ds"))


def test_an_emptied_index_or_a_header_that_does_not_fit_the_records_is_named(tmp_path):
    """An empty .idx next to a full .rec read as an empty dataset; a header record whose range ended before the
    last images made the reader drop them without a word."""
    make_folder(str(tmp_path / "faces"), (2, 3, 1))
    datatools.pack(str(tmp_path / "faces"), str(tmp_path / "ds" / "train"))
    rec = tmp_path / "ds" / "train.rec"
    (tmp_path / "ds" / "train.idx").write_text("")
    words = f"index file '{tmp_path / 'ds' / 'train.idx'}' lists no record, but '{rec}' holds {os.path.getsize(rec)} "
    for run in (lambda: RecordIOFaceReader(str(tmp_path / "ds")), lambda: datatools.inspect(str(tmp_path / "ds"))):
        with pytest.raises(DataError, match=words):
            run()
    images = [encode(face_array(i), "PNG") for i in range(6)]
    labels = [0, 0, 1, 1, 1, 2]
    write_insightface(str(tmp_path / "fits"), images, labels)
    assert len(RecordIOFaceReader(str(tmp_path / "fits"))) == 6
    folder = write_insightface(str(tmp_path / "altered"), images, labels)
    offsets = record_offsets(folder)
    with open(os.path.join(folder, "train.rec"), "r+b") as f:  # header (7, 10) -> (5, 10): images 5, 6 dropped
        f.seek(offsets[0] + 8 + 24)  # the record's length word, then IfQQ, then (a, b)
        f.write(struct.pack("<f", 5.0))
    for run in (lambda: RecordIOFaceReader(folder), lambda: datatools.inspect(folder)):
        with pytest.raises(DataError, match=r"train.rec' record 5 holds an image although header record 0 says "
                                            r"images are records 1..4 and identity records 5..9"):
            run()
    with open(os.path.join(folder, "train.idx"), "w") as f:  # a set without identity records: read as before
        f.write("".join(f"{k}\t{offsets[k]}\n" for k in range(7)))
    with open(os.path.join(folder, "train.rec"), "r+b") as f:
        f.seek(offsets[0] + 8 + 24)  # the record's length word, then IfQQ, then (a, b)
        f.write(struct.pack("<f", 7.0))
    np.testing.assert_array_equal(RecordIOFaceReader(folder).labels(), labels)
