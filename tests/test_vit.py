"""The face ViT (mtl/backbones/vit.py): parameter counts and output shapes of vit_t/s/b against the peer's definition
(counted from insightface arcface_torch's backbones/vit.py by reading it, and as the peer itself counted them under
torch: tests/fixtures/insightface_vit.npz), the forward of a small ViT against the peer's with the same weights (its
torch.save archive, read without torch), recompute against no recompute (forward and every gradient), and its
activations on the memory plan."""
import json

import numpy as np
import paddle
import pytest

from mtl.convert.torch_file import read_torch_file
from mtl.core.registry import plugin_class
from tests.references import peers

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
@pytest.mark.parametrize("name", ["vit_s", "vit_t"])  # vit_b is vit_s at twice the depth (SIZES); its blocks, and
def test_output_shape_at_112(name):  # its parameter count, are checked above without the 5 s of drawing 86M weights
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
        key = key.replace("running_mean", "_mean").replace("running_var", "_variance")
        out[key] = value.T if value.ndim == 2 else value
    return out


def test_sizes_equal_the_peers_own_counts():
    """vit_t / vit_s / vit_b: the learnable parameters the peer's model has (as it counted them under torch) and its
    output shape at 112x112."""
    sizes = json.loads(str(peers.load("insightface_vit.npz")["sizes"]))
    for name in SIZES:
        with paddle.LazyGuard():
            ours = learnable(plugin_class("backbone", name)())
        assert sizes[name] == {"parameters": ours, "output": [2, 512]}, name


def test_forward_equals_the_peers_with_its_saved_weights():
    """A small ViT of the peer's VisionTransformer (image 18, patch 9, 2 blocks, random BatchNorm statistics), its
    state_dict as ``torch.save`` wrote it (tests/fixtures/insightface_vit_small.pth, read by our torch-free reader),
    loaded into ours: the eval-mode output of the fixture's input within 1e-4 (relative) + 1e-5 of the peer's."""
    fixture = peers.load("insightface_vit.npz")
    state = read_torch_file(peers.fixture_path("insightface_vit_small.pth"))
    model = small_vit(mask_ratio=0.0, drop_path_rate=0.0)
    model.set_state_dict(_converted({k: v for k, v in state.items() if v.dtype.kind == "f"}))
    model.eval()
    with paddle.no_grad():
        out = model({"image": paddle.to_tensor(fixture["input"])}).numpy()
    np.testing.assert_allclose(out, fixture["output"], rtol=1e-4, atol=1e-5)
    print(f"\nViT forward vs the peer (same weights): largest difference {np.abs(out - fixture['output']).max():.2e}")


@pytest.mark.slow
@pytest.mark.subprocess
def test_the_committed_vit_fixtures_are_what_the_peers_code_gives_now(tmp_path):
    """The live check: the fixture maker run again under ``$MTL_TORCH_PYTHON`` writes the committed sizes and
    output (the small model's weights are drawn by torch's generator: compared through its output)."""
    if peers.torch_python() is None:
        pytest.skip(peers.LIVE_SKIP_REASON)
    fresh = peers.load("insightface_vit.npz", peers.make_live(["vit"], tmp_path))
    peers.assert_same_fixture(fresh, peers.load("insightface_vit.npz"))


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
    from mtl.serving.inference import field_adapter

    model = small_vit(mask_ratio=0.2, drop_path_rate=0.2, recompute=True)
    model.eval()
    images = paddle.randn([3, 3, 18, 18])
    eager = model({"image": images}).numpy()
    spec = paddle.static.InputSpec([None, 3, 18, 18], "float32", name="image")
    paddle.jit.save(paddle.jit.to_static(field_adapter(model, "image", True), input_spec=[spec], full_graph=True),
                    str(tmp_path / "vit"))
    np.testing.assert_array_equal(paddle.jit.load(str(tmp_path / "vit"))(images).numpy(), eager)
