"""The overhead benchmark still runs (tiny sizes) and both of its sides compute the same first-step loss."""
import os
import re
import subprocess
import sys

import pytest

from tests import warm_python

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def in_tmp(tmp_path):
    """The environment of a benchmark whose scratch folders (``tempfile.mkdtemp``, never removed) go to tmp_path."""
    return dict(os.environ, TMPDIR=str(tmp_path))


@pytest.mark.subprocess
def test_overhead_benchmark_runs_and_both_sides_agree(tmp_path):
    proc = warm_python.run([sys.executable, os.path.join(ROOT, "bench", "bench_overhead.py"), "--steps", "2",
                           "--batch", "24", "--classes", "40"], capture_output=True, text=True, timeout=300,
                          env=in_tmp(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    m = re.search(r"first-step total loss: toolkit ([0-9.]+), hand-written ([0-9.]+)", proc.stdout)
    assert m, proc.stdout
    toolkit, reference = float(m.group(1)), float(m.group(2))
    assert abs(toolkit - reference) <= 1e-5 * abs(reference)
    assert re.search(r"overhead ratio [0-9.]+", proc.stdout)


@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="one core: there is no second BLAS thread to compare")
def test_threads_benchmark_runs_each_setting_in_its_own_process(tmp_path):
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "bench_threads.py"), "--quick", "--rounds", "1",
                           "--steps", "1"], capture_output=True, text=True, timeout=600, env=in_tmp(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert re.search(r"\|\s+40 \|\s+1 \|\s+[0-9.]+ \|\s+[0-9.]+ \|\s+[0-9.]+ \|", proc.stdout), proc.stdout
    for blas in ("1", str(os.cpu_count() or 1)):
        assert f"BLAS threads {blas}: " in proc.stderr, proc.stderr[-2000:]


@pytest.mark.slow
@pytest.mark.subprocess
def test_accumulation_benchmark_runs(tmp_path):
    proc = warm_python.run([sys.executable, os.path.join(ROOT, "bench", "bench_accumulate.py"), "--steps", "1",
                           "--batch", "16", "--ks", "1,2"], capture_output=True, text=True, timeout=600,
                          env=in_tmp(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert re.search(r"K=2: step \d+ ms \(x[0-9.]+\), peak RSS \d+ MiB, of which training adds -?\d+ MiB",
                     proc.stdout), proc.stdout


@pytest.mark.subprocess
def test_text_encoder_benchmark_runs_and_both_sides_agree(tmp_path):
    proc = warm_python.run([sys.executable, os.path.join(ROOT, "bench", "bench_text_encoder.py"), "--steps", "2",
                           "--batch", "8", "--hidden", "16", "--path",
                           os.path.join(ROOT, "tests", "fixtures", "text", "ewt_sample.conllu")],
                          capture_output=True, text=True, timeout=300, env=in_tmp(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    m = re.search(r"first-step loss: toolkit ([0-9.]+), hand-written ([0-9.]+)", proc.stdout)
    assert m, proc.stdout
    assert abs(float(m.group(1)) - float(m.group(2))) <= 1e-5 * abs(float(m.group(2)))
    assert re.search(r"overhead ratio [0-9.]+", proc.stdout)
