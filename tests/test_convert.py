"""``mtl convert``: insightface's .pth read without torch, every tensor in its place; PLSC's layout.

References: insightface's own arcface_torch networks with random weights and random BatchNorm statistics, as the
committed fixture tests/fixtures/insightface_backbones.npz holds them (made under torch by
tests/references/make_peer_fixtures.py: the weights' rule and CRCs, an input and the peer's embeddings of it);
a real torch.save archive of the peer's ViT (tests/fixtures/insightface_vit_small.pth, tests/test_vit.py); PLSC's
parameter names written out from its model code (plsc/models/iresnet.py, mobilefacenet.py at PaddlePaddle/PLSC
bd0c824), since PLSC itself cannot run here; for the reader alone, a torch.save archive written by hand (below)
from torch's documented layout.
"""
import collections
import contextlib
import json
import os
import pickle
import re
import zipfile

import numpy as np
import paddle
import pytest

from mtl.backbones.base import build_backbone
from mtl.cli import main as mtl_main
from mtl.convert.torch_file import read_torch_file
from mtl.core import registry
from mtl.core.errors import DataError
from mtl.core.safe_pickle import load_paddle_file
from tests.references import peers
from tests.references.torch_format import Storage, Tensor, insightface_names, randomized, torch_layout, write_torch_file

registry.load_builtin()


def test_reader_rebuilds_views_offsets_and_dtypes(tmp_path):
    base = np.arange(24, dtype=np.float32)
    shared = Storage("0", base, "FloatStorage")
    long = Storage("1", np.array([5, 6, 7], dtype=np.int64), "LongStorage")
    half = Storage("2", np.array([0.5, -2.0], dtype=np.float16), "HalfStorage")
    state = collections.OrderedDict([
        ("matrix", Tensor(shared, 0, (4, 6), (6, 1))),
        ("transposed", Tensor(shared, 0, (6, 4), (1, 6))),  # a view, not contiguous
        ("block", Tensor(shared, 8, (2, 3), (6, 1))),  # rows 1-2, columns 2-4
        ("scalar", Tensor(long, 2, (), ())),
        ("half", Tensor(half, 0, (2,), (1,))),
    ])
    path = str(tmp_path / "x.pth")
    write_torch_file(path, {"state_dict_backbone": state, "epoch": 3}, [shared, long, half])
    got = read_torch_file(path)
    matrix = base.reshape(4, 6)
    assert got["epoch"] == 3
    out = got["state_dict_backbone"]
    assert list(out) == list(state)
    np.testing.assert_array_equal(out["matrix"], matrix)
    np.testing.assert_array_equal(out["transposed"], matrix.T)
    np.testing.assert_array_equal(out["block"], matrix[1:3, 2:5])
    assert out["scalar"] == 7 and out["scalar"].dtype == np.int64
    assert out["half"].dtype == np.float16 and out["half"].tolist() == [0.5, -2.0]


class Exploit:
    def __reduce__(self):
        return (os.system, ("echo pwned",))


def test_reader_refuses_anything_but_tensors(tmp_path):
    path = str(tmp_path / "evil.pth")
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("archive/data.pkl", pickle.dumps({"w": Exploit()}, protocol=2))
    with pytest.raises(DataError, match=r"evil.pth' was not loaded: it holds '(posix|os)\.system'"):
        read_torch_file(path)
    not_zip = tmp_path / "old.pth"
    not_zip.write_bytes(pickle.dumps({"w": 1}))
    with pytest.raises(DataError, match="not a zip-format torch file"):
        read_torch_file(str(not_zip))


def test_round_trip_without_torch_and_a_misfit_named(tmp_path, capsys):
    """Our iresnet18 written in insightface's layout by hand converts back to the same function; the same file given
    as iresnet34 stops at the first tensor iresnet34 lacks, in one line."""
    source = randomized({"type": "iresnet18", "input_size": 32, "embedding_size": 16})
    path, dst = str(tmp_path / "r18.pth"), str(tmp_path / "r18.pdparams")
    state, storages = torch_layout(insightface_names(source))
    write_torch_file(path, state, storages)
    mtl_main(["convert", "insightface", path, dst, "--arch", "iresnet18"])
    assert '"input_size": 32' in capsys.readouterr().out
    loaded = build_backbone({"type": "iresnet18", "input_size": 32, "embedding_size": 16, "pretrained": dst}).eval()
    x = paddle.to_tensor(np.random.default_rng(1).standard_normal((2, 3, 32, 32)).astype("float32"))
    np.testing.assert_array_equal(loaded({"image": x}).numpy(), source({"image": x}).numpy())
    with pytest.raises(SystemExit):
        mtl_main(["convert", "insightface", path, str(tmp_path / "r34.pdparams"), "--arch", "iresnet34"])
    err = capsys.readouterr().err.strip()  # 8 more blocks of 15 tensors each
    assert err == (f"error: '{path}' has no tensor for 'layer1.2.bn1.weight' of iresnet34 (120 missing; the "
                   f"file's blocks per stage are (2, 2, 2, 2), an iresnet18)")


def plsc_iresnet_names(depths):
    """The state_dict names PLSC's IResNet creates (plsc/models/iresnet.py: conv1, bn1, prelu, _make_layer's blocks
    with downsample Sequential(conv1x1, BatchNorm2D) on the first block, bn2, fc, features, the PartialFC head)."""
    bn = ("weight", "bias", "_mean", "_variance")
    names = ["conv1.weight", *(f"bn1.{p}" for p in bn), "prelu._weight"]
    for stage, depth in enumerate(depths, start=1):
        for block in range(depth):
            prefix = f"layer{stage}.{block}."
            names += [f"{prefix}bn1.{p}" for p in bn] + [f"{prefix}conv1.weight"]
            names += [f"{prefix}bn2.{p}" for p in bn] + [f"{prefix}prelu._weight", f"{prefix}conv2.weight"]
            names += [f"{prefix}bn3.{p}" for p in bn]
            if block == 0:
                names += [f"{prefix}downsample.0.weight"] + [f"{prefix}downsample.1.{p}" for p in bn]
    return names + [f"bn2.{p}" for p in bn] + ["fc.weight", "fc.bias"] + [f"features.{p}" for p in bn] + \
        ["head.weight"]


def test_plsc_layout_converts_by_name(tmp_path):
    """A .pdparams with exactly PLSC's IResNet-18 names (and its Partial FC head, dropped) converts; the tensors
    land where PLSC's names say."""
    names = plsc_iresnet_names((2, 2, 2, 2))
    shapes = {k: tuple(v.shape) for k, v in registry.build("backbone", {"type": "iresnet18", "input_size": 32,
                                                                        "embedding_size": 16}).state_dict().items()}
    assert sorted(names[:-1]) == sorted(shapes)  # PLSC's names are ours, plus head.weight
    rng = np.random.default_rng(2)
    state = {n: rng.standard_normal(shapes.get(n, (10, 16))).astype("float32") for n in names}
    state["StructuredToParameterName@@"] = {n: f"param_{i}" for i, n in enumerate(names)}
    src, dst = str(tmp_path / "plsc.pdparams"), str(tmp_path / "ours.pdparams")
    with open(src, "wb") as f:
        pickle.dump(state, f, protocol=4)  # what paddle.save writes: a dict of numpy arrays
    mtl_main(["convert", "plsc", src, dst, "--arch", "iresnet18"])
    converted = load_paddle_file(dst)
    assert "head.weight" not in converted
    for name in names[:-1]:
        np.testing.assert_array_equal(np.asarray(converted[name]), state[name])


@contextlib.contextmanager
def zero_initial_weights():
    """Parameters created inside start at zero wherever their layer would draw them (Paddle's global initializer:
    r100's 65 M Gaussian draws cost seconds at each of its two builds). The converted weights overwrite every one;
    one left behind would be a zero where the peer has a random value, as visible as a random one."""
    zero = paddle.nn.initializer.Constant(0.0)
    paddle.nn.initializer.set_global_initializer(zero, zero)
    try:
        yield
    finally:
        paddle.nn.initializer.set_global_initializer(None, None)


def converted_embedding(fixture, network, folder, capsys):
    """``network``'s weights regenerated from the fixture (each tensor checked against the peer's CRC-32), written
    as insightface saves them (a torch.save archive, written here without torch), converted by ``mtl convert
    insightface``, built from the config it prints and writes, run in eval mode on the fixture's input (the
    networks' random initial weights, overwritten by the conversion, drawn as zeros: :func:`zero_initial_weights`)."""
    with zero_initial_weights():
        return _converted_embedding(fixture, network, folder, capsys)


def _converted_embedding(fixture, network, folder, capsys):
    arch = peers.NETWORKS[network][0]
    path, dst = str(folder / f"{network}.pth"), str(folder / "ours.pdparams")
    state, storages = torch_layout(peers.network_tensors(fixture, network))
    write_torch_file(path, state, storages)
    del state, storages
    mtl_main(["convert", "insightface", path, dst, "--arch", arch])
    printed = re.search(r"backbone: (\{.*\})", capsys.readouterr().out).group(1)
    config = json.load(open(folder / "ours.json"))["backbone"]  # written beside the weights, for mtl eval
    assert json.loads(printed) == {**config, "pretrained": dst}
    backbone = build_backbone({**config, "pretrained": dst}).eval()
    with paddle.no_grad():
        return backbone({"image": paddle.to_tensor(fixture["input"])}).numpy()


SLOW_NETWORKS = ("r34", "r50", "r100", "mbf_large")  # deeper stages of the same blocks as r18 and mbf


@pytest.mark.parametrize("network", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW_NETWORKS else n
                                     for n in peers.NETWORKS])
def test_converted_backbone_embeds_as_insightfaces_own_network(network, tmp_path, capsys):
    """insightface's own network at 112x112 (its backbones/ code, run under torch by
    tests/references/make_peer_fixtures.py with random weights, BatchNorm statistics, PReLU slopes and, for vit_t,
    LayerNorms and position embeddings) and our backbone converted from the same weights give the same eval-mode
    embedding of the same input, within 1e-4 of the largest value (the README's promise)."""
    fixture = peers.load("insightface_backbones.npz")
    expected = fixture[f"{network}/output"]
    got = converted_embedding(fixture, network, tmp_path, capsys)
    relative = np.abs(got - expected).max() / np.abs(expected).max()
    print(f"{network}: largest difference {relative:.2e} of the largest value {np.abs(expected).max():.3g}")
    assert got.shape == expected.shape == (2, 512) and relative < 1e-4


@pytest.mark.slow
@pytest.mark.subprocess
def test_the_committed_backbone_fixture_is_what_insightfaces_code_gives_now(tmp_path):
    """The live check: the fixture maker run again under ``$MTL_TORCH_PYTHON`` writes the committed fixture."""
    if peers.torch_python() is None:
        pytest.skip(peers.LIVE_SKIP_REASON)
    fresh = peers.load("insightface_backbones.npz", peers.make_live(["backbones"], tmp_path))
    peers.assert_same_fixture(fresh, peers.load("insightface_backbones.npz"))


def test_convert_refuses_a_destination_it_would_damage_and_writes_both_files_or_neither(tmp_path, capsys):
    """Found by a fuzzing helper: DST model.json got the weights and then their config over them (exit 0, no weights
    left); an existing r18.pdparams or an unrelated r18.json beside it were replaced without a word; a 1-d fc.weight
    was an IndexError."""
    source = randomized({"type": "iresnet18", "input_size": 32, "embedding_size": 16})
    path = str(tmp_path / "r18.pth")
    state, storages = torch_layout(insightface_names(source))
    write_torch_file(path, state, storages)

    def refused(dst, *more):
        with pytest.raises(SystemExit):
            mtl_main(["convert", "insightface", path, str(dst), "--arch", "iresnet18", *more])
        return capsys.readouterr().err.strip()

    assert "go into a file ending in .pdparams" in refused(tmp_path / "model.json")
    assert not (tmp_path / "model.json").exists()
    (tmp_path / "afile").write_text("x")
    assert refused(tmp_path / "afile" / "m.pdparams").endswith(f"'{tmp_path / 'afile'}' is a file, not a folder")
    (tmp_path / "r18.json").write_text("keep")  # someone else's file where the config would go
    assert refused(tmp_path / "r18.pdparams") == (f"error: DST: '{tmp_path / 'r18.json'}' already exists; give "
                                                  "another DST, or --overwrite to replace it")
    assert (tmp_path / "r18.json").read_text() == "keep" and not (tmp_path / "r18.pdparams").exists()
    mtl_main(["convert", "insightface", path, str(tmp_path / "r18.pdparams"), "--arch", "iresnet18", "--overwrite"])
    assert json.loads((tmp_path / "r18.json").read_text())["backbone"]["type"] == "iresnet18"
    weights = (tmp_path / "r18.pdparams").read_bytes()
    assert "already exists" in refused(tmp_path / "r18.pdparams")
    assert (tmp_path / "r18.pdparams").read_bytes() == weights
    assert sorted(os.listdir(tmp_path)) == ["afile", "r18.json", "r18.pdparams", "r18.pth"]  # no temporary file
    mtl_main(["convert", "insightface", path, str(tmp_path / "models" / "r18.pdparams"), "--arch", "iresnet18"])
    assert (tmp_path / "models" / "r18.json").is_file()  # the folder is made, as the README's command needs
    state["fc.weight"] = Tensor(state["fc.weight"].storage, state["fc.weight"].offset, (512 * 4,), (1,))
    write_torch_file(path, state, storages)
    assert refused(tmp_path / "flat.pdparams") == (f"error: '{path}': tensor 'fc.weight' has shape (2048,), but in "
                                                   "every such model it has 2 dimension(s)")
