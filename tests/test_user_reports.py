"""What a new user hit, each reproduced and checked against an independent reference.

1. ``--until N`` stops like a pre-emption at step N: checkpoint of step N, no final evaluation, a line naming the
   checkpoint and the command that continues; ``--resume`` then equals an uninterrupted run exactly.
3. Ctrl-C on the launcher of a 2-process run: the stop sentence reaches the launcher's console on its own line,
   and ``mtl launch`` exits with status 75 as a single process does.
5. ``mtl compare`` shows each task's primary metric under its own name and direction (table and plot).
6. A reader plug-in attribute that hides a method of ``Reader`` is refused with one sentence.
7. A corrupt image during training: the error starts on its own line, the rank's log holds the traceback;
   ``mtl data pack`` leaves nothing behind when it fails and keeps an existing good pack.
8. A missing label list names the task file, the key path, the path as given and as resolved.
9. ``mtl checkpoint info RUN_DIR`` uses the run's latest checkpoint.
10. Under the launcher the workers' start-up noise is quiet; the window averager's copies as the plan prints them.
11. A head with more classes than the data is accepted with a warning; fewer is refused.
"""
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time

import numpy as np
import paddle
import pytest
import yaml

from mtl.core.errors import ConfigError, DataError
from tests import warm_python

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN = os.path.join(ROOT, "examples", "train_joint.py")
STEPS = 12


def environment():
    """A subprocess environment: this checkout importable, one thread, the quiet console (no MTL_VERBOSE)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT)
    env.pop("MTL_VERBOSE", None)
    if not paddle.is_compiled_with_cuda():
        env.pop("CUDA_VISIBLE_DEVICES", None)  # see tests/dist_util.py
    return env


def synthetic_job(out, steps=STEPS, progress=False):
    """Two small synthetic tasks on an MLP, with EMA averaging; no periodic checkpoint."""
    return {"seed": 3, "device": "cpu", "output_dir": str(out),
            "tasks": [{"name": "arc", "reader": {"type": "synthetic", "num_samples": 48, "num_classes": 5, "seed": 1},
                       "head": {"type": "arcface", "scale": 8.0}, "eval": None},
                      {"name": "soft", "reader": {"type": "synthetic", "num_samples": 40, "num_classes": 3, "seed": 2},
                       "head": "softmax", "eval": None}],
            "backbone": {"type": "mlp", "input_shape": [1, 8, 8], "hidden": [32], "embedding_size": 16},
            "schedule": {"batch_size": 8, "steps": steps},
            "optimizer": {"type": "momentum", "lr": 0.02, "warmup_steps": 2},
            "averaging": {"type": "ema", "decay": 0.9},
            "log": {"every": 1, "progress": progress, "plot": False}, "checkpoint": {"every": 0, "keep": 2},
            "data": {"num_workers": 0}}


def write_job(folder, name, **kw):
    """``folder/name.yaml`` holding :func:`synthetic_job` with output ``folder/name``; (config, output)."""
    path = os.path.join(folder, f"{name}.yaml")
    with open(path, "w") as f:
        yaml.safe_dump(synthetic_job(os.path.join(folder, name), **kw), f)
    return path, os.path.join(folder, name)


def run(cmd, expect=0):
    proc = warm_python.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=600, env=environment())
    assert proc.returncode == expect, proc.stdout + proc.stderr
    return proc


def step_records(out):
    with open(os.path.join(out, "metrics.jsonl")) as f:
        return [r for r in map(json.loads, f) if "lr" in r]


def all_records(out):
    with open(os.path.join(out, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """An uninterrupted run of :func:`synthetic_job` (its final checkpoint is step_12)."""
    config, out = write_job(str(tmp_path_factory.mktemp("finished")), "full")
    run([sys.executable, TRAIN, config])
    return out


# ---- 1. --until N ------------------------------------------------------------------------------------------------
UNTIL_LINE = re.compile(r"stopped by --until after step (\d+) of (\d+)\. To continue from the latest checkpoint "
                        r"(\S+), run: (.+)")


@pytest.mark.slow
def test_until_checkpoints_step_n_skips_the_final_evaluation_and_resumes_bit_identically(finished_run, tmp_path):
    config, out = write_job(str(tmp_path), "cut")
    proc = run([sys.executable, TRAIN, config, "--until", "7"])
    lines = [line for line in proc.stdout.splitlines() if "--until" in line]
    assert len(lines) == 1, proc.stdout
    match = UNTIL_LINE.fullmatch(lines[0])
    assert match, lines[0]
    assert match.group(1, 2) == ("7", str(STEPS))
    assert match.group(3) == os.path.join(out, "checkpoints", "step_7")
    with open(os.path.join(match.group(3), "state.json")) as f:
        assert json.load(f)["step"] == 7
    assert not os.path.exists(os.path.join(out, "summary.json"))  # not a finished run
    assert not any("final" in r or any(k.startswith("eval") for k in r) for r in all_records(out))
    assert [r["step"] for r in step_records(out)] == list(range(1, 8))
    command = shlex.split(match.group(4))
    assert command[0] == "python" and command[-1] == "--resume" and "--until" not in command
    run([sys.executable, *command[1:]])
    full, resumed = step_records(finished_run), step_records(out)
    assert [r["step"] for r in resumed] == list(range(1, STEPS + 1))
    for a, b in zip(full, resumed):
        assert {k: v for k, v in a.items() if k != "samples_per_s"} == \
            {k: v for k, v in b.items() if k != "samples_per_s"}, a["step"]


# ---- 9. mtl checkpoint info RUN_DIR ------------------------------------------------------------------------------
@pytest.mark.slow
def test_checkpoint_info_accepts_a_run_folder_and_says_which_checkpoint(finished_run, tmp_path):
    latest = os.path.join(finished_run, "checkpoints", f"step_{STEPS}")
    of_checkpoint = run([sys.executable, "-m", "mtl.cli", "checkpoint", "info", latest]).stdout
    assert re.search(rf"^step\s+{STEPS}$", of_checkpoint, re.M), of_checkpoint
    of_run = run([sys.executable, "-m", "mtl.cli", "checkpoint", "info", finished_run]).stdout
    first, rest = of_run.split("\n", 1)
    assert latest in first and "latest checkpoint" in first
    assert rest == of_checkpoint
    proc = run([sys.executable, "-m", "mtl.cli", "checkpoint", "info", str(tmp_path)], expect=2)
    assert proc.stdout == "" and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert str(tmp_path) in proc.stderr and "neither" in proc.stderr


# ---- 5. mtl compare ----------------------------------------------------------------------------------------------
def fake_run(folder, tasks):
    """A run folder whose summary.json has ``tasks`` = {name: (head, metric, higher_is_better, value)}."""
    os.makedirs(folder)
    summary = {"steps": 10, "tasks": {name: {"head": head, "primary_metric": metric, "higher_is_better": higher,
                                             "eval": {metric: value, "other": -1.0}, "eval_averaged": None}
                                      for name, (head, metric, higher, value) in tasks.items()}}
    with open(os.path.join(folder, "summary.json"), "w") as f:
        json.dump(summary, f)
    return str(folder)


def table_cells(table):
    return [[c.strip() for c in line.strip().strip("|").split("|")] for line in table.splitlines()[2:]]


def test_compare_shows_each_primary_metric_under_its_own_name_and_direction(tmp_path):
    from mtl.studies.comparison import compare_runs, compare_table, comparison_figure

    cls = fake_run(tmp_path / "cls", {"t": ("softmax", "accuracy", True, 0.75), "u": ("softmax", "accuracy", True,
                                                                                      0.5)})
    reg = fake_run(tmp_path / "reg", {"t": ("regression", "rmse", False, 1.5), "u": ("softmax", "accuracy", True,
                                                                                     0.25)})
    runs = compare_runs([cls, reg])
    rows = {(r[0], r[1].split()[0]): r for r in table_cells(compare_table(runs)) if r[0] in ("t", "u")}
    assert set(rows) == {("t", "accuracy"), ("t", "rmse"), ("u", "accuracy")}
    assert rows[("t", "accuracy")][2:] == ["0.7500", "n/a"] and "higher is better" in rows[("t", "accuracy")][1]
    assert rows[("t", "rmse")][2:] == ["n/a", "1.5000"] and "lower is better" in rows[("t", "rmse")][1]
    assert rows[("u", "accuracy")][2:] == ["0.5000", "0.2500"]
    fig = comparison_figure(runs)
    panels = {(ax.get_title(), ax.get_ylabel()): [p.get_height() for p in ax.patches] for ax in fig.axes}
    assert panels == {("t", "accuracy (higher is better)"): [0.75], ("t", "rmse (lower is better)"): [1.5],
                      ("u", "accuracy (higher is better)"): [0.5, 0.25]}


# ---- 6. reserved names of reader plug-ins ------------------------------------------------------------------------
READER_PLUGIN = '''
import numpy as np
from mtl.core.contracts import Field
from mtl.readers.base import Reader
from mtl.core.registry import register_reader


@register_reader("ur_labelled")
class LabelledReader(Reader):
    """Stores its labels as self.labels (hides Reader.labels())."""

    num_classes = 3

    def __init__(self, split="train", shape=(1, 8, 8)):
        self.shape = tuple(shape)
        self.labels = np.arange(12) % 3

    def fields(self):
        return [Field("image", self.shape, "float32"), Field("label", (), "int64")]

    def __len__(self):
        return 12

    def __getitem__(self, i):
        return {"image": np.zeros(self.shape, np.float32), "label": np.array(self.labels[i], np.int64)}
'''


def one_task_job(tmp_path, reader, head="softmax", plugins=(), eval_cfg=None):
    return {"seed": 0, "device": "cpu", "output_dir": str(tmp_path / "run"), "plugins": list(plugins),
            "tasks": [{"name": "wide", "reader": reader, "head": head, "eval": eval_cfg}],
            "backbone": {"type": "mlp", "input_shape": [1, 8, 8], "hidden": [16], "embedding_size": 8},
            "schedule": {"batch_size": 4, "steps": 2}, "log": {"progress": False, "plot": False},
            "averaging": {"type": "none"}}


def build(tmp_path, job, training=False):
    """Build ``job`` (``training``: as a training run does, announcing the memory plan and warnings)."""
    from mtl.config.loading import load_job
    from mtl.train.job import build_job

    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    return build_job(load_job(str(path)), announce_plan=training)


def test_a_reader_attribute_hiding_a_reader_method_is_refused_with_one_sentence(tmp_path):
    from mtl.core.registry import register_reader
    from mtl.readers.base import Reader

    with pytest.raises(ConfigError) as refused:
        @register_reader("ur_class_attribute")
        class ClassAttribute(Reader):
            labels = (0, 1, 2)
    message = str(refused.value)
    assert "ClassAttribute" in message and "'labels'" in message and "Reader.labels()" in message, message
    assert "rename" in message and "\n" not in message
    folder = tmp_path / "plugins"
    folder.mkdir()
    (folder / "labelled.py").write_text(READER_PLUGIN)
    with pytest.raises(ConfigError) as refused:
        build(tmp_path, one_task_job(tmp_path, {"type": "ur_labelled"}, plugins=[str(folder)], eval_cfg={}))
    message = str(refused.value)
    assert "LabelledReader" in message and "self.labels" in message and "Reader.labels()" in message, message
    assert "rename" in message and "fix the split" not in message and "\n" not in message
    assert "tasks.0.reader" in message and str(tmp_path / "job.yaml") in message


def test_a_reader_may_override_a_method_with_a_method_or_a_settable_property():
    from mtl.core.registry import register_reader
    from mtl.readers.base import Reader

    @register_reader("ur_overrides")
    class Overrides(Reader):
        def __init__(self):
            self.bad_samples = 4  # the subclass's own property has a setter: no shadowing

        def labels(self):
            return np.zeros(2)

        @property
        def bad_samples(self):
            return self._bad

        @bad_samples.setter
        def bad_samples(self, value):
            self._bad = value

    reader = Overrides()
    assert reader.bad_samples == 4 and list(reader.labels()) == [0.0, 0.0]


# ---- 11. a head with more classes than the data ------------------------------------------------------------------
def test_more_head_classes_than_the_data_warn_fewer_are_refused(tmp_path, capsys):
    reader = {"type": "synthetic", "num_samples": 20, "num_classes": 10, "seed": 1}
    job = build(tmp_path, one_task_job(tmp_path, reader, {"type": "softmax", "num_classes": 20}), training=True)
    assert job.tasks[0].head.class_count() == 20
    err = capsys.readouterr().err
    warnings = [line for line in err.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1, err
    assert "task 'wide'" in warnings[0] and "has 20 classes" in warnings[0], warnings[0]
    assert "labels are 0..9 (10 classes)" in warnings[0]
    assert "tasks.0.head.num_classes" in warnings[0]
    build(tmp_path, one_task_job(tmp_path, reader, {"type": "softmax", "num_classes": 10}), training=True)
    assert "warning" not in capsys.readouterr().err
    with pytest.raises(ConfigError, match=r"tasks\.0\.head\.num_classes: task 'wide': head has num_classes 5"):
        build(tmp_path, one_task_job(tmp_path, reader, {"type": "softmax", "num_classes": 5}))


# ---- 8. a missing label list -------------------------------------------------------------------------------------
def test_a_missing_label_list_names_task_file_key_and_both_paths(tmp_path, monkeypatch):
    from mtl.config.loading import load_job
    from mtl.train.job import build_job

    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "faces.yaml").write_text(yaml.safe_dump({"name": "faces", "reader": {"type": "image_list",
                                                                                  "list": "nope.txt"},
                                                      "head": {"type": "arcface", "scale": 8.0}}))
    job = one_task_job(tmp_path, None)
    job["backbone"]["input_shape"] = [3, 8, 8]
    job["tasks"] = [str(tasks / "faces.yaml")]
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    with pytest.raises(ConfigError) as refused:
        build_job(load_job(str(tmp_path / "job.yaml")), announce_plan=False)
    message = str(refused.value)
    assert message.startswith(f"{tasks / 'faces.yaml'}: reader.list: "), message
    assert "'nope.txt'" in message and f"'{elsewhere / 'nope.txt'}'" in message
    assert "task file's folder" in message and str(tasks) in message and "\n" not in message
    job["tasks"] = [{"name": "faces", "reader": {"type": "image_list", "list": "nope.txt"}, "head": "softmax"}]
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    with pytest.raises(ConfigError) as refused:
        build_job(load_job(str(tmp_path / "job.yaml")), announce_plan=False)
    assert str(refused.value).startswith(f"{tmp_path / 'job.yaml'}: tasks.0.reader.list: "), str(refused.value)


# ---- 7. a corrupt image ------------------------------------------------------------------------------------------
def write_images(folder, count=6, size=8, corrupt=None):
    """``count`` random PNG images of ``size`` px in two identity folders (a/, b/), plus ``corrupt`` (garbage)."""
    from PIL import Image

    rng = np.random.RandomState(0)
    for i in range(count):
        sub = os.path.join(folder, "ab"[i % 2])
        os.makedirs(sub, exist_ok=True)
        Image.fromarray(rng.randint(0, 255, (size, size, 3)).astype(np.uint8)).save(os.path.join(sub, f"{i}.png"))
    if corrupt:
        with open(os.path.join(folder, corrupt), "wb") as f:
            f.write(b"\x89PNG\r\n\x1a\n not an image at all")


@pytest.mark.slow
def test_a_corrupt_image_error_starts_its_own_line_and_the_rank_log_holds_the_traceback(tmp_path):
    images = tmp_path / "images"
    write_images(str(images), corrupt="b/bad.png")
    lines = [f"{'ab'[i % 2]}/{i}.png\t{i % 2}" for i in range(6)] + ["b/bad.png\t1"]
    (images / "list.txt").write_text("\n".join(lines) + "\n")
    job = synthetic_job(tmp_path / "run", steps=6, progress=True)
    # Pillow: OpenCV would print lines of its own about the image first (quiet by default now, see console.py)
    job["tasks"] = [{"name": "faces", "reader": {"type": "image_list", "list": str(images / "list.txt"),
                                                 "decoder": "pillow"},
                     "head": {"type": "arcface", "scale": 8.0}, "eval": None}]
    job["backbone"]["input_shape"] = [3, 8, 8]
    job["schedule"]["batch_size"] = 4
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    proc = run([sys.executable, TRAIN, str(tmp_path / "job.yaml")], expect=2)
    errors = [line for line in proc.stderr.split("\n") if "error:" in line]
    assert len(errors) == 1 and errors[0].startswith("error: task 'faces'"), proc.stderr
    assert "bad.png" in errors[0]
    log_file = tmp_path / "run" / "logs" / "rank0.log"
    assert str(log_file) in errors[0]
    text = log_file.read_text()
    assert "Traceback (most recent call last)" in text and "bad.png" in text, text


def test_a_failed_pack_leaves_nothing_and_keeps_a_good_pack(tmp_path):
    from mtl.commands.data import pack

    source = tmp_path / "faces"
    write_images(str(source))
    out = tmp_path / "packed"
    pack(str(source), str(out / "train"))
    good = {name: (out / name).read_bytes() for name in os.listdir(out)}
    assert set(good) == {"train.rec", "train.idx", "property", "labels.json"}
    write_images(str(source), corrupt="b/zz_bad.png")  # the last image of class b: written after every good one
    with pytest.raises(DataError, match="zz_bad.png"):
        pack(str(source), str(out / "train"))
    assert {name: (out / name).read_bytes() for name in os.listdir(out)} == good
    fresh = tmp_path / "fresh"
    with pytest.raises(DataError):
        pack(str(source), str(fresh / "train"))
    assert not fresh.exists() or os.listdir(fresh) == []


# ---- 10. the window averager's copies ----------------------------------------------------------------------------
def test_the_window_averager_holds_2_copies_in_steady_state_and_4_at_the_peak(monkeypatch):
    from mtl.train.averaging import window
    from mtl.train.memory_plan import PlanEntry, format_plan

    monkeypatch.setattr(window, "FOLD_EVERY", 8)  # a precision fold every 8 steps instead of 16384
    layer = paddle.nn.Linear(16, 16)
    param_bytes = sum(int(p.numel()) * 4 for p in layer.parameters())
    averager = window.WindowAverage(layer, average_window_rate=1.0, min_average_window=3, max_average_window=3)
    held, applied = [], []
    for _ in range(24):
        averager.step()
        held.append(averager.nbytes()["device"] / param_bytes)
        with averager.apply():
            applied.append(averager.nbytes()["device"] / param_bytes)
    assert held[5:] and min(held[5:]) == 2 and max(held) == 3 and max(applied) == 4
    assert window.WindowAverage.peak_copies == 4 and window.WindowAverage.steady_copies == 2
    plan = format_plan([PlanEntry("averager 'window'", "averaging", {"4 copies": 4 * param_bytes},
                                  note=window.WindowAverage.copies_note())], 1 << 30, 1)
    assert "2 copies per parameter in steady state" in plan and "4 copies" in plan, plan


# ---- 3 and 10. Ctrl-C and the console under the launcher --------------------------------------------------------
WORKER_NOISE = ("Modified FLAGS detected", "topology.py", "_default_pg", "distributed strategy initialized",
                "No ccache found")


def interrupt_after(proc, out, steps, send, timeout=300):
    """Call ``send()`` once ``out/metrics.jsonl`` holds ``steps`` records; (exit status, console output)."""
    path = os.path.join(out, "metrics.jsonl")
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        if os.path.isfile(path) and sum(1 for _ in open(path)) >= steps:
            send()
            break
        time.sleep(0.05)
    output, _ = proc.communicate(timeout=timeout)
    return proc.returncode, output


def start(cmd):
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
                            env=environment(), start_new_session=True)


def assert_stop_sentence(output, out):
    stopped = step_records(out)[-1]["step"]
    assert stopped < 400
    lines = [line for line in output.split("\n") if f"stopped after step {stopped} on request" in line]
    assert len(lines) == 1 and lines[0].startswith("stopped after step"), output[-3000:]
    assert os.path.join(out, "checkpoints", f"step_{stopped}") in lines[0]
    assert os.path.isfile(os.path.join(out, "checkpoints", f"step_{stopped}", "state.json"))


@pytest.mark.distributed
@pytest.mark.slow
def test_ctrl_c_on_the_paddle_launcher_shows_the_stop_sentence_on_its_console(tmp_path):
    config, out = write_job(str(tmp_path), "cut", steps=400, progress=True)
    proc = start([sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", "2", "--log_dir",
                  str(tmp_path / "log"), TRAIN, config])
    _, output = interrupt_after(proc, out, 20, lambda: proc.send_signal(signal.SIGINT))
    # (Paddle 3.3's launcher then exits with the signal's number, 2, whatever its workers did: see mtl launch)
    assert_stop_sentence(output, out)
    assert [noise for noise in WORKER_NOISE[:-1] if noise in output] == [], output[:3000]


@pytest.mark.distributed
@pytest.mark.slow
def test_ctrl_c_on_mtl_launch_exits_75_with_the_sentence_and_a_quiet_console(tmp_path):
    config, out = write_job(str(tmp_path), "cut", steps=400, progress=True)
    proc = start([sys.executable, "-m", "mtl.cli", "launch", "--nproc_per_node", "2", "--log_dir",
                  str(tmp_path / "log"), TRAIN, config])
    # a terminal's Ctrl-C signals the whole foreground process group: mtl launch and Paddle's launcher
    code, output = interrupt_after(proc, out, 20, lambda: os.killpg(proc.pid, signal.SIGINT))
    assert code == 75, output[-3000:]
    assert_stop_sentence(output, out)
    # what the user did (not the SIGTERM the launcher passes on) and the whole command that continues (issue 30)
    assert "on request (Ctrl-C, SIGINT to mtl launch)" in output, output[-3000:]
    assert f"To continue from it, run: mtl launch --nproc_per_node 2 --log_dir {tmp_path / 'log'} {TRAIN} {config} " \
           "--resume" in output, output[-3000:]
    assert [noise for noise in WORKER_NOISE + ("LAUNCH INFO",) if noise in output] == [], output[:3000]
