"""The face ViT (mtl/backbones/vit.py): parameter counts and output shapes of vit_t/s/b against the peer's definition
(counted from insightface arcface_torch's backbones/vit.py by reading it, and, when a torch virtual environment is
there, by running the peer itself), the forward of a small ViT against the peer's with the same weights, recompute
against no recompute (forward and every gradient), and its activations on the memory plan."""
import json
import os
import subprocess

import numpy as np
import paddle
import pytest

from mtl.registry import plugin_class
from tests.dist_util import ROOT

PEERS = os.path.join(ROOT, "..", "shared", "peers")
TORCH_PYTHON = os.path.join(os.environ.get("MTL_TORCH_VENV", os.path.join(ROOT, "..", "torchvenv")), "bin", "python")
SIZES = {"vit_t": (256, 12), "vit_s": (512, 12), "vit_b": (512, 24)}  # (embed_dim, depth) in the peer's get_model


def peer_parameter_count(dim, depth, tokens=144, features=512, mlp_ratio=4, channels=3, patch=9):
    """The peer's ``sum(p.numel() for p in model.parameters())``, layer by layer from its code (vit.py):
    PatchEmbed conv (weight + bias), pos_embed, mask_token; per Block: 2 LayerNorms, qkv (no bias), proj, fc1, fc2;
    the final LayerNorm; feature = Linear(dim * tokens, dim, no bias), BN(dim), Linear(dim, features, no bias),
    BN(features) (BatchNorm's running statistics are buffers, not parameters)."""
    hidden = mlp_ratio * dim
    stem = channels * patch * patch * dim + dim + tokens * dim + dim
    block = 2 * 2 * dim + dim * 3 * dim + (dim * dim + dim) + (dim * hidden + hidden) + (hidden * dim + dim)
    head = 2 * dim + dim * tokens * dim + 2 * dim + dim * features + 2 * features
    return stem + depth * block + head


def learnable(model):
    return sum(int(np.prod(p.shape)) for p in model.parameters() if not p.stop_gradient)


@pytest.mark.parametrize("name", sorted(SIZES))
def test_parameter_count_is_the_peers(name):
    with paddle.LazyGuard():  # shapes only: nothing is initialised
        model = plugin_class("backbone", name)()
    assert learnable(model) == peer_parameter_count(*SIZES[name])
    assert peer_parameter_count(256, 12) == 19_137_792  # vit_t, also printed by the peer run below


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(SIZES))
def test_output_shape_at_112(name):
    paddle.seed(0)
    model = plugin_class("backbone", name)()
    model.eval()
    with paddle.no_grad():
        out = model({"image": paddle.randn([2, 3, 112, 112])})
    assert out.shape == [2, 512] and model.num_patches == 144


def small_vit(**kw):
    options = dict(embedding_size=8, input_size=18, patch_size=9, embed_dim=16, depth=2, num_heads=2)
    options.update(kw)
    return plugin_class("backbone", "vit")(**options)


def _converted(arrays):
    """The peer's state_dict as ours: torch Linear weights are [out, in], Paddle's [in, out]; BatchNorm's running
    statistics are named _mean / _variance."""
    out = {}
    for key, value in arrays.items():
        if key in ("input", "output"):
            continue
        key = key.replace("running_mean", "_mean").replace("running_var", "_variance")
        out[key] = value.T if value.ndim == 2 else value
    return out


@pytest.fixture(scope="module")
def peer_run(tmp_path_factory):
    """The peer's sizes and small model, from the torch environment (skipped when it or the peer is missing)."""
    if not os.path.isfile(TORCH_PYTHON) or not os.path.isfile(os.path.join(PEERS, "arcface_torch", "backbones",
                                                                           "vit.py")):
        pytest.skip("needs a torch virtual environment (MTL_TORCH_VENV, default ../torchvenv) and the peer's code")
    out = tmp_path_factory.mktemp("peer_vit")
    script = os.path.join(ROOT, "tests", "torch_scripts", "peer_vit.py")
    done = subprocess.run([TORCH_PYTHON, script, PEERS, str(out)], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    with open(out / "sizes.json") as f:
        return json.load(f), dict(np.load(out / "small.npz"))


@pytest.mark.slow
@pytest.mark.subprocess
def test_sizes_and_forward_equal_the_peer_run_in_torch(peer_run):
    sizes, small = peer_run
    for name in SIZES:
        with paddle.LazyGuard():
            ours = learnable(plugin_class("backbone", name)())
        assert sizes[name] == {"parameters": ours, "output": [2, 512]}, name
    model = small_vit(mask_ratio=0.0, drop_path_rate=0.0)
    model.set_state_dict(_converted(small))
    model.eval()
    with paddle.no_grad():
        out = model({"image": paddle.to_tensor(small["input"])}).numpy()
    np.testing.assert_allclose(out, small["output"], rtol=1e-4, atol=1e-5)
    print(f"\nViT forward vs the peer (same weights): largest difference {np.abs(out - small['output']).max():.2e}")


def _loss_and_gradients(model, images, seed):
    paddle.seed(seed)
    out = model({"image": images})
    loss = (out * paddle.arange(out.shape[1], dtype="float32")).sum()
    loss.backward()
    return float(loss), {n: p.grad.numpy().copy() for n, p in model.named_parameters() if p.grad is not None}


def test_recompute_gives_the_same_forward_and_gradients():
    """Drop path, dropout and masking on (the random state of each block's forward replayed in its backward)."""
    options = dict(drop_path_rate=0.3, drop_rate=0.1, attn_drop_rate=0.1, mask_ratio=0.25)
    paddle.seed(1)
    plain = small_vit(**options)
    again = small_vit(recompute=True, **options)
    again.set_state_dict(plain.state_dict())
    images = paddle.randn([4, 3, 18, 18])
    loss, grads = _loss_and_gradients(plain, images, 7)
    loss_r, grads_r = _loss_and_gradients(again, images, 7)
    assert loss_r == loss and set(grads_r) == set(grads) and len(grads) == len(list(plain.parameters())) - 4
    for name in grads:
        np.testing.assert_array_equal(grads_r[name], grads[name], err_msg=name)


def test_activations_are_on_the_memory_plan_and_fall_with_recompute_and_fewer_rows():
    from mtl.train.memory_plan import backbone_parts

    plain, again = small_vit(), small_vit(recompute=True)
    assert plain.activation_bytes(8) == 2 * plain.activation_bytes(4)
    assert again.activation_bytes(8) < plain.activation_bytes(8)
    parts = backbone_parts(plain, optimizer_slots=2, rows=8)
    assert parts["activations (8 rows, estimate)"] == plain.activation_bytes(8)


def test_size_options_are_checked():
    with pytest.raises(ValueError, match="embed_dim 18 must be a multiple of num_heads 4"):
        small_vit(embed_dim=18, num_heads=4)
    with pytest.raises(ValueError, match="embed_dim must be a positive integer"):
        plugin_class("backbone", "vit")()


def test_exports_with_a_dynamic_batch_as_mtl_export_does(tmp_path):
    """paddle.jit.save of the backbone (as ``mtl export``: ``field_adapter``, batch axis None) reloads to the eager
    forward; masking, drop path and recompute are training-only."""
    from mtl.inference import field_adapter

    model = small_vit(mask_ratio=0.2, drop_path_rate=0.2, recompute=True)
    model.eval()
    images = paddle.randn([3, 3, 18, 18])
    eager = model({"image": images}).numpy()
    spec = paddle.static.InputSpec([None, 3, 18, 18], "float32", name="image")
    paddle.jit.save(paddle.jit.to_static(field_adapter(model, "image", True), input_spec=[spec], full_graph=True),
                    str(tmp_path / "vit"))
    np.testing.assert_array_equal(paddle.jit.load(str(tmp_path / "vit"))(images).numpy(), eager)
