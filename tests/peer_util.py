"""The independent reference of the face-model tests: insightface's arcface_torch code, run with PyTorch in a
separate virtual environment (torch is never a dependency of this project).

The interpreter is ``$MTL_TORCH_PYTHON``, else ``/work/torchvenv/bin/python`` when it exists (set it up with
``python3 -m venv /work/torchvenv && /work/torchvenv/bin/pip install torch numpy scikit-learn
opencv-python-headless scikit-image``); the peer's code is ``$MTL_ARCFACE_TORCH``, else ``shared/peers/arcface_torch``
beside the checkout. Tests that need them skip when either is missing. ``tests/peer_harness.py`` is what runs there.
"""
import os
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HARNESS = os.path.join(ROOT, "tests", "peer_harness.py")
DEFAULT_TORCH_PYTHON = "/work/torchvenv/bin/python"


def torch_python():
    """The interpreter with torch, or None."""
    path = os.environ.get("MTL_TORCH_PYTHON") or DEFAULT_TORCH_PYTHON
    return path if os.path.isfile(path) and os.access(path, os.X_OK) else None


def peer_dir():
    """insightface's ``recognition/arcface_torch`` folder (the files listed in its SOURCE), or None."""
    candidates = [os.environ.get("MTL_ARCFACE_TORCH"), os.path.join(ROOT, "..", "shared", "peers", "arcface_torch"),
                  "/work/shared/peers/arcface_torch"]
    return next((os.path.abspath(c) for c in candidates if c and os.path.isfile(os.path.join(c, "eval_ijbc.py"))),
                None)


def require_peer():
    """(torch interpreter, peer folder); skips the test when either is missing."""
    python, peer = torch_python(), peer_dir()
    if python is None:
        pytest.skip("no torch interpreter (set MTL_TORCH_PYTHON; see tests/peer_util.py)")
    if peer is None:
        pytest.skip("insightface's arcface_torch code is not there (set MTL_ARCFACE_TORCH)")
    return python, peer


def run_harness(*args, timeout=900):
    """Run ``tests/peer_harness.py ARGS`` with the torch interpreter; its stdout, or a failure with its stderr."""
    python, peer = require_peer()
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    proc = subprocess.run([python, HARNESS, "--peer", peer, *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=env)
    if proc.returncode != 0:
        pytest.fail(f"the peer harness failed ({' '.join(map(str, args))}):\n{proc.stderr[-3000:]}")
    return proc.stdout


