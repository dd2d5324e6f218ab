"""ONNX export: onnxruntime on backbone.onnx gives the Paddle inference model's embeddings, at any batch size."""
import json
import os
import sys

import numpy as np
import pytest

from tests import warm_python

pytest.importorskip("paddle2onnx")
ort = pytest.importorskip("onnxruntime")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_cli(*args):
    env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1")
    proc = warm_python.run([sys.executable, "-m", "mtl.cli", *args], capture_output=True, text=True, env=env,
                           cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


@pytest.fixture(scope="module")
def onnx_export(tmp_path_factory):
    """The digits demo's backbone, trained for a few steps (in this process), exported with --onnx by the command
    (in a process of its own: its console is checked)."""
    from tests.shared_runs import train_here

    tmp = tmp_path_factory.mktemp("onnx")
    run = str(tmp / "run")
    train_here("-c", os.path.join(ROOT, "examples", "configs", "demo.yaml"), "-o", "schedule.steps=6",
               f"output_dir={run}", "log.progress=false", "log.plot=false", "eval.every=0", "checkpoint.every=0",
               "data.num_workers=0")
    out = str(tmp / "export")
    proc = run_cli("export", run, out, "--onnx")
    return out, proc


@pytest.mark.subprocess
def test_onnx_embeddings_match_paddle_inference_model(onnx_export):
    import paddle

    out, proc = onnx_export
    assert "backbone.onnx" in proc.stdout
    assert json.load(open(os.path.join(out, "export.json")))["onnx"] == "backbone.onnx"
    session = ort.InferenceSession(os.path.join(out, "backbone.onnx"), providers=["CPUExecutionProvider"])
    (inp,) = session.get_inputs()
    assert not isinstance(inp.shape[0], int)  # the batch axis is symbolic: dynamic batch
    paddle_model = paddle.jit.load(os.path.join(out, "backbone"))
    paddle_model.eval()
    from sklearn.datasets import load_digits

    digits = load_digits().images.astype(np.float32) / 8.0 - 1.0  # real digits, scaled to [-1, 1] as the reader does
    for batch in (1, 7, 32):  # one file for every batch size
        x = np.ascontiguousarray(digits[:batch, None])
        onnx_emb = session.run(None, {inp.name: x})[0]
        paddle_emb = paddle_model(paddle.to_tensor(x)).numpy()
        assert onnx_emb.shape == paddle_emb.shape == (batch, 64)
        assert np.abs(onnx_emb - paddle_emb).max() <= 1e-4


@pytest.mark.subprocess
def test_onnx_export_console_is_quiet(onnx_export):
    _, proc = onnx_export
    for noise in ("pir_interpreter", "No ccache found", "OMP_NUM_THREADS", "[INFO]", "Polygraphy", "[Paddle2ONNX]"):
        assert noise not in proc.stderr + proc.stdout
