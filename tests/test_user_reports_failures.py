"""Issue 53, failures and recovery (12-15) and messages and docs that mislead (16-24), each reproduced first.

12. A bad image among the held-out people fails before training, naming the task; one that goes bad during training
    fails the final evaluation with the task, the stage, ``summary.json`` written and the checkpoint and command
    that score it.
13. A rank killed by a signal is said to be killed, by which signal and why that usually happens, not to have left
    an error in its (empty) log; the rank that lost it does not promise one either.
15. A failed ``--resume`` leaves no empty run folder.
"""
import json
import os
import re
import sys

import numpy as np
import pytest
import yaml

from mtl.core.errors import DataError
from tests import warm_python
from tests.face_folders import GARBAGE, face_folder, face_job, write_png
from tests.shared_runs import two_process_run

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def environment():
    """A subprocess environment: this checkout importable, one thread, the quiet console."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT)
    env.pop("MTL_VERBOSE", None)
    env.pop("CUDA_VISIBLE_DEVICES", None)
    return env


def run(cmd, expect=0, **kw):
    """Run ``cmd`` (a ``[sys.executable, ...]`` command) in a fork of the tests' warm Python; the result."""
    proc = warm_python.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=600, env=environment(), **kw)
    assert proc.returncode == expect, proc.stdout + proc.stderr
    return proc


def mtl(*args, expect=0):
    return run([sys.executable, "-m", "mtl.cli", *args], expect=expect)


def error_lines(proc):
    return [line for line in (proc.stdout + proc.stderr).splitlines() if "error:" in line]


# ---- 12. a bad image among the held-out people -------------------------------------------------------------------
@pytest.mark.subprocess
def test_a_bad_image_of_the_held_out_people_fails_before_training_naming_the_task(tmp_path):
    list_path = face_folder(str(tmp_path / "faces"))
    (tmp_path / "faces" / "c" / "1.png").write_bytes(GARBAGE)  # a held-out person's image
    config = tmp_path / "job.yaml"
    config.write_text(yaml.safe_dump(face_job(tmp_path / "run", list_path)))
    proc = mtl("train", str(config), expect=2)
    errors = error_lines(proc)
    assert len(errors) == 1 and errors[0].startswith("error: "), proc.stdout + proc.stderr
    assert "task 'faces'" in errors[0] and "evaluation split" in errors[0] and "before training" in errors[0]
    assert "line 10 ('c/1.png')" in errors[0] and "tasks.0.reader" in errors[0]
    assert not (tmp_path / "run").exists()  # nothing trained, nothing written
    assert "step" not in proc.stdout


@pytest.mark.slow
def test_an_evaluation_that_fails_after_training_names_task_and_stage_and_keeps_the_run(tmp_path):
    from mtl.commands.evaluate_run import evaluate_run
    from mtl.config.loading import load_job
    from mtl.train.job import build_job
    from mtl.train.trainer import Trainer

    list_path = face_folder(str(tmp_path / "faces"))
    run_dir = tmp_path / "run"
    job = build_job(load_job(data=face_job(run_dir, list_path)), announce_plan=False)
    trainer = Trainer(job, console=lambda *a: None)
    bad = tmp_path / "faces" / "d" / "2.png"
    bad.write_bytes(GARBAGE)  # goes bad after the start-up check, during training
    with pytest.raises(DataError) as failed:
        trainer.run()
    message = str(failed.value)
    checkpoint = run_dir / "checkpoints" / "step_4"
    assert message.startswith("task 'faces': the final evaluation, after training, failed: "), message
    assert "line 15 ('d/2.png')" in message
    assert f"the checkpoint {checkpoint} holds the training" in message
    assert message.rstrip(")").endswith(f"score it with: mtl eval {run_dir} (traceback in {run_dir}/logs/rank0.log")
    assert (checkpoint / "state.json").is_file()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 4 and "d/2.png" in summary["evaluation_failed"]
    assert summary["tasks"]["faces"]["eval"] is None and summary["tasks"]["faces"]["loss_end"] > 0
    log_text = (run_dir / "logs" / "rank0.log").read_text()
    assert "Traceback (most recent call last)" in log_text and "d/2.png" in log_text
    write_png(str(bad), 32)  # fixed: the command the message gives scores the run
    results = evaluate_run(str(run_dir), console=lambda *a: None)
    assert set(results) == {"faces"} and 0.0 <= results["faces"]["verification_accuracy"] <= 1.0, results


# ---- 15. a failed --resume ---------------------------------------------------------------------------------------
def small_job(out, steps=4):
    """One synthetic softmax task on an MLP (fast), no evaluation, into ``out``."""
    return {"seed": 0, "device": "cpu", "output_dir": str(out),
            "tasks": [{"name": "soft", "reader": {"type": "synthetic", "num_samples": 16, "num_classes": 3},
                       "head": "softmax", "eval": None}],
            "backbone": {"type": "mlp", "input_shape": [1, 8, 8], "hidden": [8], "embedding_size": 8},
            "schedule": {"batch_size": 4, "steps": steps}, "log": {"progress": False, "plot": False},
            "averaging": {"type": "none"}, "checkpoint": {"every": 2, "keep": 3}, "data": {"num_workers": 0}}


def test_a_failed_resume_leaves_no_run_folder_and_keeps_an_existing_one(tmp_path):
    from mtl.config.loading import load_job
    from mtl.core.errors import ConfigError
    from mtl.train.job import build_job
    from mtl.train.trainer import Trainer

    out = tmp_path / "new" / "run"
    job = build_job(load_job(data=small_job(out)), announce_plan=False)
    for wanted in ("3", "step_3", str(tmp_path / "elsewhere")):  # a step, or a folder, of no checkpoint
        with pytest.raises(ConfigError, match="is not a complete checkpoint"):
            Trainer(job, resume=True, resume_from=wanted, console=lambda *a: None)
        assert not (tmp_path / "new").exists(), wanted
    # a warm start from a checkpoint of another schedule: refused while restoring, nothing left either
    other = small_job(tmp_path / "other")
    other["schedule"]["batch_size"] = 8
    Trainer(build_job(load_job(data=other), announce_plan=False), console=lambda *a: None).run()
    with pytest.raises(ConfigError, match="another schedule"):
        Trainer(job, resume=True, resume_from=str(tmp_path / "other" / "checkpoints" / "step_4"),
                console=lambda *a: None)
    assert not (tmp_path / "new").exists()
    # an existing run's folder keeps everything it held
    (tmp_path / "new").mkdir()
    (tmp_path / "new" / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError):
        Trainer(job, resume=True, resume_from="3", console=lambda *a: None)
    assert sorted(os.listdir(tmp_path / "new")) == ["notes.txt"]


# ---- 13. a rank killed by a signal -------------------------------------------------------------------------------
KILLED_SCRIPT = '''
import os, signal, sys, time
if os.environ["PADDLE_TRAINER_ID"] == sys.argv[1]:
    time.sleep(0.5)
    os.kill(os.getpid(), signal.SIGKILL)
time.sleep(60)
'''


def launch_killed(tmp_path, rank):
    """``mtl launch`` of 2 processes of a script whose rank ``rank`` kills itself with SIGKILL; (status, output)."""
    import subprocess

    script = tmp_path / "killed.py"
    script.write_text(KILLED_SCRIPT)
    proc = subprocess.run([sys.executable, "-m", "mtl.cli", "launch", "--nproc_per_node", "2", "--log_dir",
                           str(tmp_path / "logs"), str(script), str(rank)], capture_output=True, text=True,
                          cwd=ROOT, env=environment(), timeout=300)
    return proc.returncode, proc.stdout + proc.stderr


@pytest.mark.distributed
@pytest.mark.subprocess
@pytest.mark.parametrize("rank", [1, 0])
def test_a_rank_killed_by_signal_9_is_said_to_be_killed_not_to_have_an_error_in_its_log(tmp_path, rank):
    code, output = launch_killed(tmp_path, rank)
    assert code == 128 + 9, output
    lines = [line for line in output.splitlines() if f"rank {rank}" in line]
    assert lines == [f"rank {rank} was killed by signal 9 (SIGKILL: out of memory, or by hand); it could write no "
                     f"error of its own"], output
    assert "the end of its log" not in output and "Container failed" not in output, output
    # the launcher's logs are where --log_dir said, not in a temporary folder named after the failure
    assert "the launcher's logs are in" not in output and (tmp_path / "logs" / "workerlog.0").is_file(), output


def test_a_rank_that_lost_its_peer_does_not_promise_an_error_in_the_peer_s_log(monkeypatch, capsys):
    from mtl import cli

    monkeypatch.setattr(cli, "LOST_PEER_DELAY", 0.0)
    monkeypatch.setenv("PADDLE_TRAINER_ID", "0")
    monkeypatch.setenv("PADDLE_TRAINERS_NUM", "2")

    def collective(_args):
        raise RuntimeError("(External) [gloo] Connection closed by peer [127.0.0.1]:5000")

    with pytest.raises(SystemExit):
        cli.run(collective, None)
    err = capsys.readouterr().err
    assert err.startswith("error (rank 0): lost contact with another process in a collective"), err
    assert "its error is in its log" not in err
    assert "probably ended first: the launcher says how (its error, or the signal that killed it)" in err, err


# ---- 14. what a resume resumed -----------------------------------------------------------------------------------
def resume_lines(text):
    return [line for line in text.splitlines() if line.startswith("--resume: from checkpoint")]


def test_a_resume_says_which_checkpoint_and_on_how_many_processes(tmp_path):
    from mtl.config.loading import load_job
    from mtl.train.job import build_job
    from mtl.train.trainer import Trainer

    def job():
        return build_job(load_job(data=small_job(tmp_path / "run", steps=6)), announce_plan=False)

    Trainer(job(), console=lambda *a: None).run(until=3)
    said = []
    Trainer(job(), resume=True, console=said.append).run()
    lines = resume_lines("\n".join(map(str, said)))
    assert lines == [f"--resume: from checkpoint {tmp_path / 'run' / 'checkpoints' / 'step_3'} (step 3 of 6), "
                     f"written by 1 process and continued on 1"], said
    said = []
    Trainer(job(), resume=True, resume_from="4", console=said.append).run()  # a named one
    assert resume_lines("\n".join(map(str, said)))[0].startswith(
        f"--resume: from checkpoint {tmp_path / 'run' / 'checkpoints' / 'step_4'} (step 4 of 6)"), said


@two_process_run("failures_cut")
def _two_process_cut(folder):
    config = os.path.join(folder, "job.yaml")
    with open(config, "w") as f:
        yaml.safe_dump(small_job(os.path.join(folder, "run"), steps=6), f)
    return {"train": [config, "--until", "4"]}, str(folder)


@pytest.mark.distributed
@pytest.mark.two_process_runs("failures_cut")
def test_a_resume_on_another_process_count_says_from_how_many_to_how_many(two_process, tmp_path):
    import shutil

    shutil.copytree(os.path.join(two_process["failures_cut"], "run"), tmp_path / "run")  # the shared run stays as is
    config = tmp_path / "job.yaml"
    config.write_text(yaml.safe_dump(small_job(tmp_path / "run", steps=6)))
    proc = run([sys.executable, os.path.join(ROOT, "examples", "train_joint.py"), str(config), "--resume"])
    assert resume_lines(proc.stdout) == [f"--resume: from checkpoint {tmp_path / 'run' / 'checkpoints' / 'step_4'} "
                                         f"(step 4 of 6), written by 2 processes and continued on 1"], proc.stdout


# ---- 18. a reader.num_classes that is too small ------------------------------------------------------------------
def build_face_job(tmp_path, list_path=None, **reader):
    """Build :func:`face_job` on ``list_path`` (default: four new people, labels 0..3) with the reader keys
    ``reader``."""
    from mtl.config.loading import load_job
    from mtl.train.job import build_job

    data = face_job(tmp_path / "run", list_path or face_folder(str(tmp_path / "faces")))
    data["tasks"][0]["reader"].pop("holdout_classes")
    data["tasks"][0]["reader"].update(reader)
    data["tasks"][0]["eval"] = {"split": bool(reader.get("holdout_classes"))}
    return build_job(load_job(data=data), announce_plan=False)


@pytest.mark.parametrize("reader", [{}, {"on_bad_sample": "skip"}, {"on_bad_sample": "skip", "holdout_classes": [3]},
                                    {"holdout_classes": [1]}])
def test_a_too_small_num_classes_is_named_as_such_whatever_on_bad_sample_says(tmp_path, reader):
    from mtl.core.errors import ConfigError

    with pytest.raises(ConfigError) as refused:
        build_face_job(tmp_path, num_classes=3, **reader)
    message = str(refused.value)
    assert "tasks.0.reader.num_classes: " in message and "holdout_classes" not in message.split(": ", 1)[0], message
    assert "num_classes is 3 but the labels of label list" in message, message
    assert "go up to 3 (4 classes; label 3 first at line 13 ('d/0.png'))" in message, message
    assert "set num_classes to 4 or leave it out" in message and "on_bad_sample" not in message, message


def test_a_stray_label_past_num_classes_is_still_a_bad_sample(tmp_path):
    """A label far past the rest (a corrupt line) is not a class count: ``on_bad_sample: skip`` skips it."""
    list_path = tmp_path / "faces" / "list.txt"
    face_folder(str(tmp_path / "faces"))
    list_path.write_text(list_path.read_text().replace("d/3.png\t3", "d/3.png\t977"))
    job = build_face_job(tmp_path, str(list_path), num_classes=4, on_bad_sample="skip")
    assert job.tasks[0].reader.bad_samples == 1 and len(job.tasks[0].reader) == 15


def test_a_training_split_of_one_class_warns_that_its_loss_is_0_from_the_start(tmp_path, capsys):
    """(Not refused: a 1-class head is how the distributed tests give a rank an empty shard.)"""
    from mtl.config.loading import load_job
    from mtl.train.job import build_job

    data = face_job(tmp_path / "run", face_folder(str(tmp_path / "faces")))
    data["tasks"][0]["reader"]["holdout_classes"] = [1, 2, 3]
    build_job(load_job(data=data), announce_plan=True)
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "task 'faces': its training split holds one class" in warnings[0], warnings
    assert "loss is 0 from the start" in warnings[0] and "tasks.0.head.num_classes" in warnings[0]
    data["tasks"][0]["reader"]["holdout_classes"] = [2, 3]
    build_job(load_job(data=data), announce_plan=True)
    assert "warning" not in capsys.readouterr().err


def test_the_loss_plot_of_losses_that_are_all_zero_has_no_warning_and_shows_them(tmp_path):
    import warnings

    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    from mtl.train.reporting import plot_losses

    records = [{"step": s, "loss": 0.0, "loss/t": 0.0} for s in range(1, 11)]
    made = []
    original = pyplot.subplots
    pyplot_subplots = lambda *a, **k: made.append(original(*a, **k)) or made[-1]  # noqa: E731
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        import unittest.mock

        with unittest.mock.patch.object(pyplot, "subplots", pyplot_subplots):
            plot_losses(records, ["t"], str(tmp_path / "loss.png"))
    ax = made[0][1][0, 0]
    assert ax.get_yscale() == "linear" and (tmp_path / "loss.png").is_file()
    assert [list(line.get_ydata()) for line in ax.get_lines()][0] == [0.0] * 10


def test_a_too_small_num_classes_of_a_recordio_pack_names_its_record(tmp_path):
    from mtl.config.loading import load_job
    from mtl.core.errors import ConfigError
    from mtl.train.job import build_job
    from mtl.writers.pack import pack

    face_folder(str(tmp_path / "faces"))
    pack(str(tmp_path / "faces"), str(tmp_path / "packed" / "train"))
    data = face_job(tmp_path / "run", "unused")
    data["tasks"][0]["reader"] = {"type": "recordio", "path": str(tmp_path / "packed" / "train.rec"),
                                  "num_classes": 2, "on_bad_sample": "skip", "decoder": "pillow"}
    data["tasks"][0]["eval"] = None
    with pytest.raises(ConfigError) as refused:
        build_job(load_job(data=data), announce_plan=False)
    message = str(refused.value)
    assert f"num_classes is 2 but the labels of '{tmp_path / 'packed' / 'train.rec'}' go up to 3 (4 classes; label 2 " \
           f"first at record " in message and "set num_classes to 4" in message, message


# ---- 19. an empty person folder ----------------------------------------------------------------------------------
def test_an_empty_person_folder_is_left_out_of_a_pack_with_a_warning(tmp_path, capsys):
    from mtl.data.recordio import RecordIOReader
    from mtl.readers.recordio_reader import image_rows
    from mtl.writers.pack import pack

    face_folder(str(tmp_path / "faces"), people="abd")
    (tmp_path / "faces" / "c").mkdir()  # sorted between b and d
    (tmp_path / "faces" / "c" / "notes.txt").write_text("no image here")
    summary = pack(str(tmp_path / "faces"), str(tmp_path / "packed" / "train"))
    assert summary["classes"] == 3 and summary["records"] == 12, summary
    names = json.loads((tmp_path / "packed" / "labels.json").read_text())["label"]
    assert names == ["a", "b", "d"]
    rows, classes = image_rows(RecordIOReader(str(tmp_path / "packed" / "train.rec"),
                                              str(tmp_path / "packed" / "train.idx")))
    assert classes == 3 and len(rows) == 12
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and f"'{tmp_path / 'faces' / 'c'}'" in warnings[0], warnings
    assert "no image" in warnings[0] and "left out" in warnings[0]


# ---- 20. backbone.pretrained of a file that holds no weights -----------------------------------------------------
NOT_WEIGHTS = {
    "numbers.csv": (b"0.5,0.25\n0.125,1\n", "a text file"),  # '0' is pickle's POP: "IndexError: pop from empty list"
    "notes.md": (b"# my model\n", "a text file"),
    "model.pth": (b"PK\x03\x04" + bytes(60), "a zip archive"),
    "model.safetensors": (len(b'{"a": {}}').to_bytes(8, "little") + b'{"a": {}}', "a safetensors file"),
    "empty.pdparams": (b"", "an empty file"),
    "backbone.pdiparams": (bytes(32), "the parameters of an exported inference model"),
}


@pytest.mark.parametrize("name", sorted(NOT_WEIGHTS))
def test_backbone_pretrained_of_a_file_without_weights_says_what_the_file_is(tmp_path, name):
    from mtl.backbones.base import build_backbone
    from mtl.core.errors import MtlError

    content, kind = NOT_WEIGHTS[name]
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(MtlError) as refused:
        build_backbone({"type": "mlp", "input_shape": [1, 8, 8], "hidden": [8], "embedding_size": 8,
                        "pretrained": str(path)}, "job.yaml")
    message = str(refused.value)
    assert message.startswith(f"job.yaml: backbone.pretrained: '{path}' is {kind}, not pretrained weights"), message
    assert "Error" not in message and "\n" not in message, message


def test_the_reference_makers_name_no_absolute_folder_of_a_machine():
    import glob
    import re

    for path in glob.glob(os.path.join(ROOT, "tests", "references", "*.py")):
        with open(path) as f:
            text = f.read()
        found = re.findall(r"(?<![\w.$)])/(?:work|home|root|tmp|opt|Users)/[\w.-]+", text)
        assert not found, (path, found)


def test_a_refused_pickle_that_is_text_is_still_said_to_be_refused(tmp_path):
    from mtl.backbones.base import build_backbone

    path = tmp_path / "evil.pdparams"
    path.write_bytes(b"cposix\nsystem\n(S'true'\ntR.")  # protocol 0: ASCII text
    with pytest.raises(DataError, match=r"evil.pdparams' was not loaded: it holds 'posix.system'"):
        build_backbone({"type": "mlp", "input_shape": [1, 8, 8], "hidden": [8], "embedding_size": 8,
                        "pretrained": str(path)}, "job.yaml")


# ---- 21. mtl convert's messages ----------------------------------------------------------------------------------
VIT_FIXTURE = os.path.join(ROOT, "tests", "fixtures", "insightface_vit_small.pth")  # a torch.save archive of a ViT


def convert_error(*args):
    """The one error line of ``mtl convert ARGS`` (in this process)."""
    from mtl.cli import main

    with pytest.raises(SystemExit) as ended:
        main(["convert", *args])
    assert ended.value.code == 2
    return str(ended.value.code)


def test_convert_insightface_of_a_paddle_file_points_to_convert_plsc(tmp_path, capsys):
    import pickle

    src = tmp_path / "plsc_r50.pdparams"
    with open(src, "wb") as f:
        pickle.dump({"conv1.weight": np.zeros((2, 3, 3, 3), np.float32)}, f, protocol=4)  # as paddle.save writes
    convert_error("insightface", str(src), str(tmp_path / "out.pdparams"), "--arch", "iresnet50")
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: '{src}' is a Paddle file (paddle.save), not a torch.save archive"), err
    assert f"mtl convert plsc {src} {tmp_path / 'out.pdparams'} --arch iresnet50" in err
    assert "torch.save(model" not in err and "PyTorch" not in err, err
    convert_error("plsc", VIT_FIXTURE, str(tmp_path / "out.pdparams"), "--arch", "vit_t")
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: '{VIT_FIXTURE}' is a torch.save archive, not a Paddle file"), err
    assert f"mtl convert insightface {VIT_FIXTURE} {tmp_path / 'out.pdparams'} --arch vit_t" in err, err


@pytest.mark.parametrize("arch", ["iresnet50", "mobilefacenet"])
def test_convert_of_a_vit_with_another_arch_points_to_the_vit_archs(tmp_path, capsys, arch):
    convert_error("insightface", VIT_FIXTURE, str(tmp_path / "out.pdparams"), "--arch", arch)
    err = capsys.readouterr().err.strip()
    assert "the file holds a ViT (width 16, depth 2): give --arch vit_t, vit_s or vit_b" in err, err
    assert not (tmp_path / "out.pdparams").exists()


def test_the_readme_does_not_say_convert_insightface_reads_plsc_files():
    with open(os.path.join(ROOT, "README.md")) as f:
        text = " ".join(f.read().split())
    sentence = text[text.index("`mtl convert insightface"):]
    sentence = sentence[:sentence.index(". ")]
    assert "PLSC" not in sentence.split("`mtl convert plsc")[0], sentence
    assert "`mtl convert plsc " in text


# ---- 17. an output_dir that holds checkpoints, and the commands of the docs after make demo ----------------------
def test_an_output_dir_with_checkpoints_is_blamed_on_where_output_dir_came_from(tmp_path):
    from mtl.config.loading import load_job
    from mtl.core.errors import ConfigError
    from mtl.train.job import build_job
    from mtl.train.trainer import Trainer

    config = tmp_path / "job.yaml"
    config.write_text(yaml.safe_dump(small_job(tmp_path / "run", steps=2)))
    Trainer(build_job(load_job(str(config)), announce_plan=False), console=lambda *a: None).run()
    with pytest.raises(ConfigError) as refused:  # output_dir from the file, another key from --set
        Trainer(build_job(load_job(str(config), ["schedule.steps=3"]), announce_plan=False), console=lambda *a: None)
    assert str(refused.value).startswith(f"{config}: output_dir: output_dir '{tmp_path / 'run'}' already holds "
                                         "checkpoints"), str(refused.value)
    other = tmp_path / "other.yaml"
    other.write_text(yaml.safe_dump(small_job(tmp_path / "elsewhere", steps=2)))
    with pytest.raises(ConfigError) as refused:  # output_dir from --set
        Trainer(build_job(load_job(str(other), [f"output_dir={tmp_path / 'run'}"]), announce_plan=False),
                console=lambda *a: None)
    assert str(refused.value).startswith(f"--set: output_dir: output_dir '{tmp_path / 'run'}' already holds "), \
        str(refused.value)


def documented_demo_runs(doc):
    """Every ``mtl train`` command of ``docs/<doc>`` that trains the demo config (what ``make demo`` trained)."""
    import shlex

    with open(os.path.join(ROOT, "docs", doc)) as f:
        lines = [line.split("  #")[0].strip() for line in f]
    return [shlex.split(line) for line in lines if line.startswith("mtl train") and "configs/demo.yaml" in line]


@pytest.mark.parametrize("doc", ["configuration.md", "tasks.md"])
def test_the_docs_demo_commands_do_not_train_into_the_folder_make_demo_filled(doc):
    commands = documented_demo_runs(doc)
    assert commands, doc
    with open(os.path.join(ROOT, "examples", "configs", "demo.yaml")) as f:
        demo_folder = yaml.safe_load(f)["output_dir"]
    for words in commands:
        folders = [w.split("=", 1)[1] for w in words if w.startswith("output_dir=")]
        assert "--overwrite" in words or (folders and folders[-1] != demo_folder), " ".join(words)


# ---- 23. mtl compare's bars, counts, data inspect, mtl plugins, the loss plot's legend ---------------------------
def compare_run(folder, value, pairs=630.0):
    """A run folder whose summary.json gives task 't' accuracy ``value`` (and its pair count)."""
    os.makedirs(folder)
    summary = {"steps": 10, "tasks": {"t": {"head": "arcface", "primary_metric": "accuracy", "higher_is_better": True,
                                            "eval": {"accuracy": value, "verification_pairs": pairs},
                                            "eval_averaged": None}}}
    with open(os.path.join(folder, "summary.json"), "w") as f:
        json.dump(summary, f)
    return str(folder)


def test_compare_bars_show_their_values_and_a_range_where_close_values_differ(tmp_path):
    from mtl.studies.comparison import compare_runs, comparison_figure

    runs = compare_runs([compare_run(tmp_path / "a", 0.862), compare_run(tmp_path / "b", 0.865)])
    fig = comparison_figure(runs)
    ax = fig.axes[0]
    fig.canvas.draw()
    texts = sorted(t.get_text() for t in ax.texts)
    assert texts == ["0.8620", "0.8650"], texts
    low, high = ax.get_ylim()
    # the two bars' visible parts: their tops differ by a tenth of the axis or more (at a zero baseline: 0.3 %)
    assert (0.865 - 0.862) / (high - low) >= 0.1 and low < 0.862 and high > 0.865, (low, high)
    assert [p.get_height() for p in ax.patches] == [0.862, 0.865]


def test_counts_print_as_whole_numbers_and_rates_keep_four_digits():
    from mtl.train.reporting import format_value, metrics_table

    assert format_value(630.0, "verification_pairs") == "630" and format_value(0.8625, "accuracy") == "0.8625"
    assert format_value(1.0, "accuracy") == "1.0000"
    table = metrics_table({"t": {"head": "arcface", "loss_start": 2.0, "loss_end": 1.0, "primary_metric": "accuracy",
                                 "higher_is_better": True, "eval": {"accuracy": 0.75, "verification_pairs": 630.0}}})
    row = next(line for line in table.splitlines() if "verification_pairs" in line)
    assert "| 630 " in row and "630.0000" not in table, table


def test_data_inspect_says_width_by_height_and_keeps_the_sheet_out_of_the_data_folder(tmp_path, monkeypatch, capsys):
    from PIL import Image

    from mtl.commands import data as datatools

    folder = tmp_path / "faces"
    for person in "ab":
        (folder / person).mkdir(parents=True)
        for i in range(2):
            Image.new("RGB", (12, 8), (i * 90, 50, 50)).save(folder / person / f"{i}.png")  # 12 wide, 8 high
    assert datatools.pack(str(folder), str(tmp_path / "packed" / "train"))["image_size"] == "12x8"
    capsys.readouterr()
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    stats = datatools.inspect(str(tmp_path / "packed"), None)
    assert stats["image_size"] == "12x8", stats["image_size"]
    args = argparse_data(["data", "inspect", str(tmp_path / "packed")])
    assert args.func(args) == 0
    assert sorted(os.listdir(tmp_path / "packed")) == ["labels.json", "property", "train.idx", "train.rec"]
    sheet = tmp_path / "cwd" / "runs" / "inspect" / "packed_samples.png"
    out = capsys.readouterr().out
    assert sheet.is_file() and str(sheet.relative_to(tmp_path / "cwd")) in out
    assert re.search(r"^image_size \(width x height\)\s+12x8$", out, re.M), out


def argparse_data(argv):
    import argparse

    from mtl.commands import data as datatools

    parser = argparse.ArgumentParser(prog="mtl")
    datatools.add_cli(parser.add_subparsers(dest="command"))
    return parser.parse_args(argv)


def test_mtl_plugins_shows_whole_first_sentences():
    from mtl.core import registry

    registry.load_builtin()
    entries = {(e.kind, e.name): e.description for e in registry.entries()
               if os.path.relpath(os.path.abspath(e.origin), ROOT).startswith(("mtl", "heads"))}  # not the tests'
    assert len(entries) > 60
    assert entries[("reader", "concat")] == ("The samples of several readers, one after another, with class labels "
                                             "offset per source (none with ``shared_labels``).")
    assert entries[("backbone", "iresnet50")] == "IResNet-50 (blocks per stage 3, 4, 14, 3); 43.6M parameters at " \
                                                 "112x112 and 512-d."
    for (kind, name), text in entries.items():
        assert text.endswith((".", ")", "?", "!")) or kind == "weighting", (kind, name, text)
        assert not text.endswith(("e.g.", "i.e.", "al.")), (kind, name, text)


def test_the_loss_plot_legend_does_not_cover_the_curves(tmp_path):
    import unittest.mock

    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    from mtl.train.reporting import plot_losses

    tasks = ["iris", "wine", "breast_cancer", "diabetes"]  # examples/configs/tabular_mtl.yaml's
    records = [{"step": s, "loss": 4.0 / s, **{f"loss/{t}": (k + 1.0) / s for k, t in enumerate(tasks)}}
               for s in range(1, 50)]
    made = []
    original = pyplot.subplots
    with unittest.mock.patch.object(pyplot, "subplots", lambda *a, **k: made.append(original(*a, **k)) or made[-1]):
        with unittest.mock.patch.object(pyplot, "close"):
            plot_losses(records, tasks, str(tmp_path / "loss.png"))
    fig, axes = made[0]
    ax = axes[0, 0]
    fig.canvas.draw()
    legend = ax.get_legend()
    assert legend is not None and len(legend.get_texts()) == 5
    assert not legend.get_window_extent().overlaps(ax.get_window_extent()), "the legend lies over the curves"


# ---- 16. docs/distributed.md's claim of equal losses -------------------------------------------------------------
def test_the_equal_losses_claim_says_where_it_holds():
    """Docs only: the bullet that claims equal losses at 1 and 2 processes names BatchNorm's exception and the demo's
    measured gap (1 vs 2 processes, the demo with --until 14 and log.every=1: 8.59e-2 relative at step 14)."""
    with open(os.path.join(ROOT, "docs", "distributed.md")) as f:
        bullets = " ".join(f.read().split()).split("* **")
    claim = next(b for b in bullets if "same per-step losses" in b)
    assert "without BatchNorm" in claim and "sync_bn" in claim and "8.6e-2 at step 14" in claim, claim


# ---- 24. small claims ----------------------------------------------------------------------------------------------
def makefile_install_line():
    with open(os.path.join(ROOT, "Makefile")) as f:
        return next(line.strip() for line in f if "pip install" in line and "-e ." in line)


@pytest.mark.subprocess
def test_make_s_editable_install_hides_setuptools_editable_installation_box():
    """The Makefile's ``pip install -e .`` sets a warning filter; setuptools' own note, emitted as setuptools emits it
    (``InformationOnly.emit``, the box pip showed on ``make demo``), is silenced by it and only by it."""
    import shlex
    import subprocess

    words = shlex.split(makefile_install_line())
    filters = [w.split("=", 1)[1] for w in words if w.startswith("PYTHONWARNINGS=")]
    assert filters, makefile_install_line()
    code = ("from setuptools.warnings import InformationOnly\n"
            "InformationOnly.emit('Editable installation.', 'Please be careful with folders named like the package')")
    for env, shown in (({}, True), ({"PYTHONWARNINGS": filters[0]}, False)):
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              env={**environment(), **env})
        assert ("Editable installation" in done.stderr) == shown, (env, done.stderr)


def test_make_demo_faces_and_the_readme_say_how_often_the_report_prints():
    from mtl.core.progress import WATCH_EVERY

    for name in ("Makefile", "README.md"):
        with open(os.path.join(ROOT, name)) as f:
            text = " ".join(f.read().split())
        assert "a progress line per step" not in text, name
        assert f"every {WATCH_EVERY:g} s while one trains" in text, name


def docs_table(text, after):
    """``{(task, metric): (value, loss start, loss end)}`` of the first run-end table in ``text`` after ``after``."""
    block = text[text.index(after):].split("```")[1]
    found, task, losses = {}, None, None
    for line in block.splitlines()[3:]:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 5:
            continue
        if cells[0]:
            task, losses = cells[0], tuple(cells[2].split(" -> "))
        found[(task, cells[3].split(" ")[0])] = (cells[4], *losses)
    return found


def assert_docs_table_is_the_run(doc_after, config, tmp_path, extra=()):
    """Train ``config`` as the docs say and compare every figure of the docs' table with the run's summary.json."""
    from mtl.train.reporting import format_value

    out = tmp_path / "run"
    run([sys.executable, "-m", "mtl.cli", "train", os.path.join(ROOT, "examples", "configs", config), "--set",
         f"output_dir={out}", "log.plot=false", *extra])
    summary = json.loads((out / "summary.json").read_text())["tasks"]
    with open(os.path.join(ROOT, "docs", "tasks.md")) as f:
        table = docs_table(f.read(), doc_after)
    assert table
    for (task, metric), (value, start, end) in table.items():
        info = summary[task]
        printed = (format_value(info["eval"][metric], metric), f"{info['loss_start']:.4f}", f"{info['loss_end']:.4f}")
        assert len(value) == len(printed[0]), (task, metric, value, printed)  # the run's format: same digits
        tolerance = (THRESHOLD_TOLERANCE if metric.endswith("threshold") else FIGURE_TOLERANCE, LOSS_TOLERANCE,
                     LOSS_TOLERANCE)
        for shown, got, tol in zip((value, start, end), printed, tolerance):
            assert abs(float(shown) - float(got)) <= tol, (task, metric, (value, start, end), printed)


# The docs' tables were printed on a CPU with AVX2; Paddle and MKL take other code paths with AVX-512 and round
# differently, and 300 to 400 steps carry that into the last digits (AVX-512 here: diabetes RMSE 0.7401 for 0.7399,
# macro F1 0.9934 for 0.9947, losses within 1e-4). A verification threshold is the mean of the folds' best
# thresholds, each anywhere on a plateau of equal accuracy: 0.7910 for 0.8100 at the same accuracy 0.9947. A changed
# recipe moves these figures by more.
FIGURE_TOLERANCE, LOSS_TOLERANCE, THRESHOLD_TOLERANCE = 0.002, 2e-4, 0.05


@pytest.mark.subprocess
def test_docs_tasks_tabular_table_is_what_the_run_prints(tmp_path):
    assert_docs_table_is_the_run("`tabular_mtl` (300 steps", "tabular_mtl.yaml", tmp_path)


@pytest.mark.slow
@pytest.mark.subprocess
def test_docs_tasks_four_heads_table_is_what_the_run_prints(tmp_path):
    """(22 CPU-seconds: the figures the docs show are of the whole 400-step run.)"""
    assert_docs_table_is_the_run("`digits_four_heads` (400 steps", "digits_four_heads.yaml", tmp_path)
