"""Text files that are not UTF-8 (a list saved as GBK or Windows-1252, a binary file given by mistake): every reader
of a user's text file names the file, the line and the byte in one DataError, where Python's decoder names neither;
UTF-8 files read exactly as ``open(path, encoding="utf-8", newline=...)`` reads them."""
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mtl.core.errors import DataError
from mtl.core.utf8 import open_utf8

GBK = "中文".encode("gbk")  # b"\xd6\xd0\xce\xc4": not UTF-8


@settings(max_examples=60, deadline=None)
@given(text=st.text(alphabet=st.sampled_from(list("ab é\t\r\n中#0"))), newline=st.sampled_from([None, ""]))
def test_utf8_text_reads_as_text_mode_reads_it(tmp_path_factory, text, newline):
    path = tmp_path_factory.mktemp("u") / "f.txt"
    path.write_bytes(text.encode("utf-8"))
    with open(path, encoding="utf-8", newline=newline) as f:
        expected = list(f)
    assert list(open_utf8(path, "file", newline)) == expected
    with open(path, encoding="utf-8", newline=newline) as f, open_utf8(path, "file", newline) as g:
        assert f.readline() == g.readline() and f.read() == g.read()


@settings(max_examples=80, deadline=None)
@given(text=st.text(alphabet=st.sampled_from(list("ab\t1é\r\n")), max_size=30), data=st.data())
def test_the_line_and_byte_named_are_those_of_the_first_undecodable_byte(tmp_path_factory, text, data):
    """Reference: Python's own text layer (surrogate escapes for the bad bytes, universal newlines): the first line
    that holds an escaped byte, and that byte's position in the line's UTF-8 bytes."""
    at = data.draw(st.integers(0, len(text)))
    raw = text[:at].encode() + GBK + text[at:].encode()
    path = tmp_path_factory.mktemp("u") / "list.txt"
    path.write_bytes(raw)
    with open(path, encoding="utf-8", errors="surrogateescape") as f:
        lines = list(f)
    line = next(i for i, t in enumerate(lines) if any("\udc80" <= c <= "\udcff" for c in t))
    column = next(i for i, c in enumerate(lines[line]) if "\udc80" <= c <= "\udcff")
    byte = len(lines[line][:column].encode("utf-8", "surrogateescape")) + 1
    with pytest.raises(DataError) as caught:
        list(open_utf8(path, "image list"))
    assert str(caught.value) == (f"image list '{path}' is not UTF-8 text: line {line + 1}, byte {byte} of the "
                                 f"line (0xd6); save it as UTF-8")


def test_a_long_file_is_read_as_a_stream_and_a_late_fault_still_named(tmp_path):
    """Lines are read as they come (the first arrive before the bad byte far into the file is reached)."""
    path = tmp_path / "long.txt"
    path.write_bytes(b"a.png\t0\n" * 200_000 + GBK + b"\n")
    stream = open_utf8(path, "image list")
    assert next(iter(stream)) == "a.png\t0\n"
    with pytest.raises(DataError, match="line 200001, byte 1 of the line"):
        for _ in stream:
            pass


def _write(tmp_path, name, text):
    path = tmp_path / name
    path.write_bytes(text.encode("utf-8").replace(b"@", GBK))
    return str(path)


def readers():
    """(id, function of tmp_path that reads a file with a GBK name in its second line, what the error calls it)."""
    from mtl.data.verification_sets import read_pairs
    from mtl.evaluation.conditions import light_azimuths
    from mtl.evaluation.ijb import _rows
    from mtl.readers.csv_reader import read_csv
    from mtl.readers.image_list import parse_label_list, read_target_table
    from mtl.readers.label_names import read_label_file
    from mtl.readers.text_pairs import read_tsv
    from mtl.serving.prediction import read_table
    from mtl.text.conllu import read_conllu
    from mtl.text.embed import read_texts
    from mtl.text.iob2 import read_iob2
    from mtl.text.squad import read_squad
    from mtl.text.tokenizer import read_vocab

    return [
        ("image list", lambda t: parse_label_list(_write(t, "l.txt", "a.png\t0\n@.png\t1\n")), "image list"),
        ("target list", lambda t: read_target_table(_write(t, "t.tsv", "path\tage\n@.png\t3\n"), ["age"], ["x"]),
         "target list"),
        ("pairs list", lambda t: read_pairs(_write(t, "p.txt", "a.png\tb.png\t1\n@.png\tb.png\t0\n"), str(t)),
         "pairs list"),
        ("condition table", lambda t: light_azimuths(t, ["a.png"]) if _write(t, "index.tsv", "path\tazimuth\n@\t1\n")
         else None, "target list"),
        ("CSV table", lambda t: read_csv(_write(t, "t.csv", "a,b\n@,1\n")), "CSV file"),
        ("CSV input", lambda t: read_table(_write(t, "in.csv", "a,b\n@,1\n"), {"columns": ["a"]}), "input"),
        ("IJB meta", lambda t: _rows(_write(t, "m.txt", "1 2 1\n@ 2 0\n"), 3, "'t1 t2 label'"), "IJB meta file"),
        ("label map", lambda t: read_label_file(_write(t, "labels.json", '{"label":\n@}')), "label map"),
        ("TSV pairs", lambda t: read_tsv(_write(t, "d.tsv", "a\tb\n@\tx\n"), ["a", "b"]), "TSV file"),
        ("CoNLL-U", lambda t: read_conllu(_write(t, "c.conllu", "# text = a\n@1\ta\t_\t_\t_\t_\t0\troot\t_\t_\n")),
         "CoNLL-U file"),
        ("IOB2", lambda t: read_iob2(_write(t, "n.iob2", "a\tO\n@\tB-PER\n")), "IOB2 file"),
        ("SQuAD", lambda t: read_squad(_write(t, "s.json", '{"data":\n@}')), "SQuAD file"),
        ("vocab.txt", lambda t: read_vocab(_write(t, "vocab.txt", "[PAD]\n@\n")), "vocabulary file"),
        ("texts to embed", lambda t: read_texts([_write(t, "s.txt", "one\n@\n")]), "input"),
    ]


@pytest.mark.parametrize("case", readers(), ids=lambda c: c[0])
def test_every_reader_of_a_users_text_file_names_a_non_utf8_line(tmp_path, case):
    _, read, what = case
    with pytest.raises(DataError) as caught:
        read(tmp_path)
    assert f"{what} '" in str(caught.value) and "is not UTF-8 text: line 2, byte 1 of the line (0xd6)" in \
        str(caught.value), str(caught.value)
    assert os.path.basename(str(caught.value).split("'")[1]) in os.listdir(tmp_path)


def test_a_config_or_task_file_that_is_not_utf8_is_named_with_its_line(tmp_path):
    from mtl.config.loading import load_job
    from mtl.core.errors import ConfigError

    path = _write(tmp_path, "job.yaml", "seed: 0\n# @\ntasks: []\n")
    with pytest.raises(ConfigError, match="is not UTF-8 text: line 2, byte 3 of the line .0xd6.; save it as UTF-8"):
        load_job(path)


def test_a_same_person_pairs_file_that_is_not_utf8_or_not_json_names_the_key(tmp_path):
    from mtl.core.errors import ParameterError
    from mtl.headkit.filtering import same_person_pairs

    for text, words in (("[\n@]", "is not UTF-8 text: line 2, byte 1"), ("[{", "is not JSON")):
        path = _write(tmp_path, "pairs.json", text)
        with pytest.raises(ParameterError, match=f"same_person.pairs: file '{path}' {words}"):
            same_person_pairs({"pairs": path, "offsets": {"a": 0}}, 10)


def test_a_byte_order_mark_first_is_not_part_of_the_text(tmp_path):
    """Windows editors save UTF-8 with a byte-order mark first; it was read into the first path of a pairs list
    ("cannot read 'sets/\\ufeffs1/1.png'", found by a fuzzing helper). Only a leading one is dropped."""
    from PIL import Image

    from mtl.data.verification_sets import read_pairs

    path = tmp_path / "list.txt"
    path.write_bytes(b"\xef\xbb\xbfa.png\t1\nb\xef\xbb\xbf.png\t0\n")
    assert list(open_utf8(path, "file")) == ["a.png\t1\n", "b\ufeff.png\t0\n"]
    for name in ("a.png", "b.png"):
        Image.new("RGB", (8, 8), (10, 20, 30)).save(tmp_path / name)
    (tmp_path / "pairs.txt").write_bytes("\ufeffa.png\tb.png\t1\n".encode())
    assert read_pairs(str(tmp_path / "pairs.txt"), image_size=8).issame.tolist() == [True]
