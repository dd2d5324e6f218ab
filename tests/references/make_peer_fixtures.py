"""Make the peer fixtures of tests/fixtures/ by running insightface's own arcface_torch code under torch.

The tests never need torch: they compare against what this script wrote (see :mod:`tests.references.peers` for
what each file holds). Run it again when a fixture should change (another peer commit, another torch, a new
network); it takes about two minutes on two cores. From the repository root:

    python3 -m venv ../.torch-peers      # beside the checkout, outside it: torch is never a project dependency
    ../.torch-peers/bin/pip install torch==2.13.0 numpy==2.4.6 scikit-learn==1.9.1 \\
        opencv-python-headless==5.0.0.93 scikit-image==0.26.0
    ../.torch-peers/bin/python tests/references/make_peer_fixtures.py [--peer DIR] [--out tests/fixtures] \\
        [--only backbones vit ijb]

``--peer`` is insightface's ``recognition/arcface_torch`` folder (default ``../shared/peers/arcface_torch``
beside the checkout: its files listed in that folder's SOURCE, unmodified). The same command with another
``--out`` is the live check of the tests (``MTL_TORCH_PYTHON=$(realpath ../.torch-peers/bin/python) make test``).

What runs of the peer, and what is changed around it:

* ``backbones``: its ``get_model`` networks, eval mode, with :func:`tests.references.peers.draw`'s weights;
* ``vit``: its ``VisionTransformer`` (vit_t / vit_s / vit_b sizes; a small one saved with ``torch.save``). Its
  ``vit.py`` imports three helpers of timm, which is not installed: they are provided here with timm's definitions;
* ``ijb``: ``eval_ijbc.py`` as a script. It imports pandas, menpo, prettytable and matplotlib and moves tensors to
  CUDA at module level; the modules that are missing are stubbed (only their names are used, for reading text
  tables, colours, the printed table and the PDF plot), ``.cuda()`` returns the tensor or module itself (CPU torch),
  ``np.int`` (removed in numpy 2) is restored, and the script's own code runs otherwise unchanged: its module-level
  flags (``use_flip_test``, ``use_detector_score``) and, to feed it fixed features, its ``get_image_feature`` are
  replaced before it runs (an edit of its syntax tree), and its ``min`` is wrapped to record which ROC point its TAR
  table reads.

Nothing here imports ``mtl``: this is the independent side of the comparison (only the numpy helpers of
``tests/references`` that both sides share: the weight rule and the IJB-format set).
"""
import argparse
import ast
import builtins
import importlib
import json
import os
import sys
import tempfile
import types

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

from tests.references import peers  # noqa: E402  (numpy only)


# ---------------------------------------------------------------- the peer's networks
def drop_path(x, p, training):
    """timm's drop_path: per-sample Bernoulli(1 - p) mask, kept samples scaled by 1 / (1 - p)."""
    import torch

    if p == 0.0 or not training:
        return x
    keep = 1.0 - p
    mask = torch.floor(keep + torch.rand((x.shape[0],) + (1,) * (x.ndim - 1), dtype=x.dtype))
    return x / keep * mask


def install_timm_stub():
    """timm.models.layers' DropPath, to_2tuple and trunc_normal_ (what the peer's vit.py imports)."""
    import torch

    class DropPath(torch.nn.Module):
        def __init__(self, p=None):
            super().__init__()
            self.p = p or 0.0

        def forward(self, x):
            return drop_path(x, self.p, self.training)

    layers = types.ModuleType("timm.models.layers")
    layers.DropPath = DropPath
    layers.to_2tuple = lambda v: tuple(v) if isinstance(v, (tuple, list)) else (v, v)
    layers.trunc_normal_ = lambda t, mean=0.0, std=1.0, a=-2.0, b=2.0: torch.nn.init.trunc_normal_(t, mean, std, a, b)
    models, timm = types.ModuleType("timm.models"), types.ModuleType("timm")
    models.layers, timm.models = layers, models
    sys.modules.update({"timm": timm, "timm.models": models, "timm.models.layers": layers})


def build_peer(network):
    """The peer's model by its own ``get_model`` name (r18 ... r100, mbf, mbf_large, vit_t), 512-d, float32."""
    from backbones import get_model

    if network.startswith("r"):
        return get_model(network, fp16=False, num_features=512, dropout=0.0)
    return get_model(network, fp16=False, num_features=512)


def tensor_kinds(model):
    """``{state_dict name: kind of peers.KINDS}``, from the module each entry belongs to."""
    import torch

    kinds = {}
    norms = (torch.nn.BatchNorm1d, torch.nn.BatchNorm2d, torch.nn.LayerNorm)
    for prefix, module in model.named_modules():
        for name, _ in list(module.named_parameters(recurse=False)) + list(module.named_buffers(recurse=False)):
            key = f"{prefix}.{name}" if prefix else name
            if isinstance(module, norms):
                kind = {"weight": "norm_weight", "bias": "norm_bias", "num_batches_tracked": "count"}.get(name, name)
            elif isinstance(module, torch.nn.PReLU):
                kind = "prelu"
            elif isinstance(module, (torch.nn.Conv2d, torch.nn.Linear)):
                kind = name
            elif name in ("pos_embed", "mask_token"):
                kind = "embedding"
            else:
                raise ValueError(f"no kind for {key} of {type(module).__name__}")
            kinds[key] = kind
    return kinds


def fill(model, seed):
    """Every state_dict entry from peers.draw; returns (names, kinds, shapes, CRC-32 of each tensor as torch holds
    it)."""
    import torch

    kinds = tensor_kinds(model)
    state = model.state_dict()
    names, shapes, crcs = list(state), [], []
    with torch.no_grad():
        for index, name in enumerate(names):
            value = torch.from_numpy(peers.draw(kinds[name], state[name].shape, seed, index))
            state[name].copy_(value.to(state[name].dtype))
            shapes.append(list(state[name].shape))
            crcs.append(peers.crc32(state[name].numpy()))
    return names, [kinds[n] for n in names], shapes, crcs


def make_backbones(out):
    """insightface_backbones.npz: each network's tensor list, CRCs and eval-mode embeddings of peers.peer_input()."""
    import torch

    install_timm_stub()
    x = torch.from_numpy(peers.peer_input())
    arrays = {"input": x.numpy()}
    for network, (_, seed) in peers.NETWORKS.items():
        model = build_peer(network).eval()
        names, kinds, shapes, crcs = fill(model, seed)
        with torch.no_grad():
            output = model(x).numpy()
        arrays.update({f"{network}/names": np.array(names), f"{network}/kinds": np.array(kinds),
                       f"{network}/shapes": np.array(json.dumps(shapes)),
                       f"{network}/crc32": np.array(crcs, dtype=np.uint32), f"{network}/output": output})
        print(f"{network}: {sum(int(np.prod(s)) for s in shapes):,} numbers in {len(names)} tensors, output "
              f"{list(output.shape)}", flush=True)
        del model
    np.savez_compressed(os.path.join(out, "insightface_backbones.npz"), **arrays)


def make_vit(out):
    """insightface_vit.npz (sizes of vit_t/s/b; the small ViT's input and output) and insightface_vit_small.pth."""
    import torch

    install_timm_stub()
    from backbones import get_model
    from backbones.vit import VisionTransformer

    torch.manual_seed(0)
    sizes = {}
    for name in ("vit_t", "vit_s", "vit_b"):
        model = get_model(name, num_features=512).eval()
        with torch.no_grad():
            output = model(torch.randn(2, 3, 112, 112))
        sizes[name] = {"parameters": int(sum(p.numel() for p in model.parameters())), "output": list(output.shape)}
        del model
    small = VisionTransformer(img_size=18, patch_size=9, num_classes=8, embed_dim=16, depth=2, num_heads=2,
                              mask_ratio=0.0, drop_path_rate=0.0).eval()
    with torch.no_grad():
        for module in small.modules():  # running statistics away from (0, 1), so that eval mode uses them
            if isinstance(module, torch.nn.BatchNorm1d):
                module.running_mean.uniform_(-0.5, 0.5)
                module.running_var.uniform_(0.5, 2.0)
                module.weight.uniform_(0.5, 1.5)
                module.bias.uniform_(-0.5, 0.5)
        x = torch.randn(3, 3, 18, 18)
        y = small(x)
    torch.save(small.state_dict(), os.path.join(out, "insightface_vit_small.pth"))
    np.savez_compressed(os.path.join(out, "insightface_vit.npz"), sizes=np.array(json.dumps(sizes)), input=x.numpy(),
             output=y.numpy())


# ---------------------------------------------------------------- eval_ijbc.py
class Anything:
    """A stand-in module / object: every attribute is a callable that returns another stand-in."""

    def __getattr__(self, name):
        return Anything()

    def __call__(self, *args, **kwargs):
        return Anything()


def stub_modules():
    """Stand-ins for the modules eval_ijbc.py imports but this interpreter lacks (never numpy, torch, cv2,
    sklearn or skimage: those are the reference)."""
    class Table:
        def __init__(self, fields):
            self.rows = [list(fields)]

        def add_row(self, row):
            self.rows.append(list(row))

        def __str__(self):
            return "\n".join(" | ".join(map(str, r)) for r in self.rows)

    def read_csv(path, sep=" ", header=None):
        rows = [line.split(sep) for line in open(path).read().splitlines() if line.strip()]
        return types.SimpleNamespace(values=np.array(rows, dtype=object))

    stubs = {"pandas": {"read_csv": read_csv, "DataFrame": type("DataFrame", (), {}),  # sklearn looks for these
                        "Series": type("Series", (), {})}, "prettytable": {"PrettyTable": Table},
             "menpo": {}, "menpo.visualize": {}, "menpo.visualize.viewmatplotlib": {
                 "sample_colours_from_colourmap": lambda n, name: [(0.0, 0.0, 0.0)] * n},
             "matplotlib": {"use": lambda *a, **k: None}, "matplotlib.pyplot": {"__getattr__": lambda n: Anything()}}
    for name, attrs in stubs.items():
        try:
            importlib.import_module(name)
        except ImportError:
            module = types.ModuleType(name)
            module.__dict__.update(attrs)
            sys.modules[name] = module
    if "matplotlib.pyplot" in sys.modules and isinstance(sys.modules["matplotlib"], types.ModuleType) and \
            "pyplot" not in vars(sys.modules["matplotlib"]):
        sys.modules["matplotlib"].pyplot = sys.modules["matplotlib.pyplot"]


def run_eval_ijbc(peer, argv, flags, functions):
    """Execute eval_ijbc.py as ``__main__`` with ``argv``; module-level assignments of ``flags`` and definitions of
    ``functions`` are replaced by the given values; returns (its namespace, the ROC indices its TAR table read)."""
    import sklearn.preprocessing  # noqa: F401  (the script calls sklearn.preprocessing.normalize after import sklearn)
    import torch

    np.int = int  # the script's np.int (removed in numpy 2)
    torch.Tensor.cuda = lambda self, *a, **k: self
    torch.nn.Module.cuda = lambda self, *a, **k: self
    stub_modules()
    path = os.path.join(peer, "eval_ijbc.py")
    tree = ast.parse(open(path).read(), path)
    tree.body = [node for node in tree.body if not (
        isinstance(node, ast.FunctionDef) and node.name in functions) and not (
        isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
        and node.targets[0].id in flags)]
    chosen = []

    def recording_min(*args, **kwargs):
        found = builtins.min(*args, **kwargs)
        chosen.append(found[1])
        return found

    namespace = {"__name__": "__main__", "__file__": path, "min": recording_min, **flags, **functions}
    sys.argv = [path, *argv]
    exec(compile(tree, path, "exec"), namespace)
    return namespace, chosen


def peer_result(namespace, chosen):
    """What the tests compare: the pair scores, the ROC, the TAR at each FAR its table shows, the AUC."""
    tpr = namespace["tpr"]
    return {"score": namespace["score"], "fpr": namespace["fpr"], "tpr": tpr, "auc": np.array(namespace["roc_auc"]),
            "tar": np.array([tpr[i] for i in chosen[-len(namespace["x_labels"]):]])}


def aligned_faces(namespace, model, root):
    """Every face of the set aligned by the script's own ``Embedding.get``: ``[N, 3, 112, 112]`` uint8, RGB."""
    import cv2

    embedding = namespace["Embedding"](model, (3, 112, 112), 1)
    faces = []
    for line in open(namespace["img_list_path"]).readlines():  # its own list ("files" is reused later)
        fields = line.strip().split(" ")
        img = cv2.imread(os.path.join(root, "loose_crop", fields[0]))
        pair = embedding.get(img, np.array([float(x) for x in fields[1:-1]], np.float32).reshape(5, 2))
        assert np.array_equal(pair[1], pair[0][..., ::-1]), "the second face is the mirror image of the first"
        faces.append(pair[0])
    return np.stack(faces)


def make_ijb(out, peer):
    """insightface_eval_ijbc.npz: eval_ijbc.py with its own mbf (features, aligned faces, scores, ROC, TAR), then
    with those features given, once per protocol variant (flip test on/off x detector-score weighting on/off)."""
    import torch

    from tests.references import ijb_set

    work = tempfile.mkdtemp(prefix="peer_ijb_")
    root = ijb_set.write_ijb(os.path.join(work, "ijb"))
    model = build_peer(peers.IJB_NETWORK).eval()
    fill(model, peers.NETWORKS[peers.IJB_NETWORK][1])
    pth = os.path.join(work, "model.pth")
    torch.save(model.state_dict(), pth)
    argv = ["--image-path", root, "--result-dir", work, "--target", "IJBC", "--batch-size", "5", "--job", "peer"]
    namespace, chosen = run_eval_ijbc(peer, argv + ["--model-prefix", pth, "--network", peers.IJB_NETWORK], {}, {})
    arrays = {f"default_{k}": v for k, v in peer_result(namespace, chosen).items()}
    feats, scores = namespace["img_feats"], namespace["faceness_scores"]
    arrays.update(set_digest=np.array(ijb_set.set_digest(root)), img_feats=feats, faceness_scores=scores,
                  aligned=aligned_faces(namespace, pth, root))
    for flip in (True, False):
        for detector in (True, False):
            namespace, chosen = run_eval_ijbc(peer, argv, {"use_flip_test": flip, "use_detector_score": detector},
                                              {"get_image_feature": lambda *a: (feats, scores)})
            key = f"{int(flip)}{int(detector)}"
            arrays.update({f"{key}_{k}": v for k, v in peer_result(namespace, chosen).items()})
    np.savez_compressed(os.path.join(out, "insightface_eval_ijbc.npz"), **arrays)


PARTS = {"backbones": lambda out, peer: make_backbones(out), "vit": lambda out, peer: make_vit(out),
         "ijb": make_ijb}


def main(argv=None):
    """Parse the command line and write the fixtures asked for."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--peer", default=peers.PEER_CODE, help="insightface's recognition/arcface_torch folder")
    parser.add_argument("--out", default=peers.FIXTURES, help="where the fixtures go (default tests/fixtures)")
    parser.add_argument("--only", nargs="+", choices=sorted(PARTS), default=sorted(PARTS))
    args = parser.parse_args(argv)
    peer = os.path.abspath(args.peer)
    if not os.path.isfile(os.path.join(peer, "eval_ijbc.py")):
        parser.error(f"'{peer}' is not insightface's arcface_torch folder (no eval_ijbc.py); give --peer DIR")
    sys.path.insert(0, peer)
    os.makedirs(args.out, exist_ok=True)
    for part in args.only:
        PARTS[part](args.out, peer)
        print(f"wrote the {part} fixture(s) to {args.out}", flush=True)


if __name__ == "__main__":
    main()
