"""A newcomer's first hour (issue 30): each stumble reproduced, then checked fixed.

The numbered sections follow the issue's items; the commands' own tests (predict, describe, labels) have their
own files (tests/test_predict.py, tests/test_plugin_reference.py, tests/test_label_names.py).
"""
import json
import os
import re
import sys
import warnings

import pytest
import yaml

from mtl.config.loading import load_job
from mtl.core.errors import ConfigError
from mtl.train.job import build_job
from mtl.train.trainer import Trainer
from tests import warm_python

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def environment(**extra):
    """A subprocess environment: this checkout importable, one thread, the quiet console (no MTL_VERBOSE)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT, **extra)
    env.pop("MTL_VERBOSE", None)
    return env


def mtl(*args, expect=0, cwd=ROOT, **env):
    """``python -m mtl.cli ARGS`` in a subprocess; the finished process (its exit status checked)."""
    proc = warm_python.run([sys.executable, "-m", "mtl.cli", *map(str, args)], capture_output=True, text=True,
                           cwd=cwd, timeout=600, env=environment(**env))
    assert proc.returncode == expect, proc.stdout + proc.stderr
    return proc


def image_job(out, steps=4, **over):
    """Two synthetic image tasks on the small CNN (BatchNorm: per-rank statistics in its checkpoints)."""
    data = {"seed": 0, "output_dir": str(out), "device": "cpu",
            "tasks": [{"name": "ids", "reader": {"type": "synthetic", "num_samples": 24, "num_classes": 4,
                                                 "shape": [1, 8, 8]},
                       "head": {"type": "arcface", "scale": 8.0}, "eval": None},
                      {"name": "kind", "reader": {"type": "synthetic", "num_samples": 24, "num_classes": 3,
                                                  "shape": [1, 8, 8], "seed": 5},
                       "head": {"type": "softmax"}, "eval": None}],
            "backbone": {"type": "cnn", "in_channels": 1, "input_size": 8, "channels": [4, 8],
                         "embedding_size": 8},
            "schedule": {"batch_size": 8, "steps": steps}, "optimizer": {"lr": 0.05},
            "log": {"progress": False, "plot": False}, "checkpoint": {"every": 0, "keep": 3},
            "data": {"num_workers": 0}}
    data.update(over)
    return data


def train_here(data, **kw):
    """Build and train ``data`` in this process (quiet); the summary."""
    job = build_job(load_job(data=data), announce_plan=False)
    return Trainer(job, console=lambda *a: None, **{k: v for k, v in kw.items() if k != "until"}).run(
        until=kw.get("until"))


# ---- 2. a one-process --resume warns about every backbone parameter ------------------------------------------------
def test_a_resume_restores_the_backbone_without_paddle_warnings(tmp_path):
    data = image_job(tmp_path / "run")
    train_here(data, until=2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train_here(data, resume=True)
    messages = [str(w.message) for w in caught]
    assert not [m for m in messages if "Skip loading" in m or "state dict is empty" in m], messages
    full = image_job(tmp_path / "full")
    train_here(full)
    for a, b in zip(*(open(os.path.join(d["output_dir"], "metrics.jsonl")).read().splitlines()
                      for d in (full, data))):
        a, b = json.loads(a), json.loads(b)
        assert {k: v for k, v in a.items() if k != "samples_per_s"} == \
            {k: v for k, v in b.items() if k != "samples_per_s"}


# ---- 11. an MLP job (no BatchNorm) warns that its statistics are empty ---------------------------------------------
def test_a_checkpoint_of_a_backbone_without_batchnorm_is_written_without_warnings(tmp_path):
    data = image_job(tmp_path / "run", steps=2)
    data["backbone"] = {"type": "mlp", "input_shape": [1, 8, 8], "hidden": [8], "embedding_size": 8}
    data["optimizer"] = {"type": "sgd", "lr": 0.05}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train_here(data)
    assert not [str(w.message) for w in caught if "state dict is empty" in str(w.message)]
    assert os.path.isfile(tmp_path / "run" / "checkpoints" / "step_2" / "statistics.rank0.pdparams")


# ---- 3. the memory plan's advice is a command that works -----------------------------------------------------------
def write_task_job(folder, head, averaging=None, backbone=None):
    """A job whose one task comes from a task file (the case where the head's key path is not ``tasks.0.head``)."""
    (folder / "tasks").mkdir()
    (folder / "tasks" / "faces.yaml").write_text(yaml.safe_dump(
        {"name": "faces", "reader": {"type": "synthetic", "num_samples": 16, "num_classes": 4, "shape": [1, 8, 8]},
         "head": head}))
    job = image_job(folder / "run", tasks=["tasks/faces.yaml"])
    job["averaging"] = averaging or {"type": "none"}
    job["backbone"] = backbone or job["backbone"]
    path = folder / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    return str(path)


def refusal(path, overrides=(), available=1000):
    """The ConfigError of the memory plan of ``path`` with ``available`` bytes per process."""
    from mtl.core import registry
    from mtl.train import memory_plan

    cfg = load_job(path, list(overrides))
    backbone = registry.build("backbone", dict(cfg["backbone"]))
    original = memory_plan.available_bytes
    memory_plan.available_bytes = lambda: available
    try:
        memory_plan.check_job_memory(cfg, backbone, lambda t: {"num_classes": 4}, announce=False)
    except ConfigError as exc:
        return str(exc)
    finally:
        memory_plan.available_bytes = original
    return None


def suggested_sets(message):
    """The ``KEY=VALUE`` of every ``--set KEY=VALUE`` in ``message``, as the shell passes them."""
    import shlex

    return [shlex.split(part.replace(")", " "))[0] for part in message.split("--set ")[1:]]


@pytest.mark.parametrize("head", [{"type": "arcface", "scale": 8.0}, {"type": "softmax"}])
def test_the_memory_plans_advice_for_a_head_is_a_set_command_the_job_accepts(tmp_path, head):
    path = write_task_job(tmp_path, {**head, "num_classes": 4})
    message = refusal(path)
    assert message and "tasks.0.head" in message, message
    if head["type"] == "arcface":
        sets = suggested_sets(message)
        assert sets == ["tasks.0.head.sample_ratio=0.1"], message
        cfg = load_job(path, sets)  # accepted: the key exists where the message says
        assert cfg["tasks"][0]["head"]["sample_ratio"] == 0.1
        assert "more processes" in message
    else:  # the softmax head has no sample_ratio: no command that the job would refuse
        assert "sample_ratio" not in message and "more processes" in message, message


def test_the_memory_plans_advice_for_the_averager_is_a_set_command_the_job_accepts(tmp_path):
    backbone = {"type": "mlp", "input_shape": [1, 8, 8], "hidden": [64], "embedding_size": 8}
    window = {"type": "window", "average_window_rate": 0.5}
    path = write_task_job(tmp_path, {"type": "softmax", "num_classes": 4}, window, backbone)
    message = refusal(path)
    assert message.startswith(f"{path}: averaging: averager 'window'"), message
    sets = suggested_sets(message)
    assert sets == ["averaging={type: ema}", "averaging={type: none}"], message
    for command in sets:
        load_job(path, [command])  # every suggestion is accepted


# ---- 11. the memory plan of a small job is not printed -------------------------------------------------------------
def test_a_small_jobs_memory_plan_is_not_printed_a_large_ones_is(tmp_path, capsys, monkeypatch):
    import mtl.train.job

    data = image_job(tmp_path / "run")
    build_job(load_job(data=data))
    assert "memory plan" not in capsys.readouterr().out
    monkeypatch.setattr(mtl.train.job, "PLAN_SHOWN_FROM", 1)
    build_job(load_job(data=data))
    out = capsys.readouterr().out
    assert out.startswith("memory plan per process") and "task 'ids' head 'arcface'" in out, out


# ---- 10. messages that mislead ---------------------------------------------------------------------------------
def test_too_few_head_classes_says_how_many_the_labels_need(tmp_path):
    data = image_job(tmp_path / "run")
    data["tasks"][1]["head"] = {"type": "softmax", "num_classes": 2}
    with pytest.raises(ConfigError) as refused:
        build_job(load_job(data=data), announce_plan=False)
    message = str(refused.value)
    assert "tasks.1.head.num_classes" in message and "labels are 0..2 (3 classes)" in message, message
    assert "set num_classes to 3" in message and "go up to" not in message


def task_file_job(tmp_path, reader=None, head=None):
    """A job whose one task is the file ``tasks/faces.yaml`` (an image list of 6 random images and 2 people)."""
    from tests.newcomer_runs import write_images

    images = tmp_path / "images"
    write_images(str(images))
    (images / "list.txt").write_text("".join(f"{'ab'[i % 2]}/{i}.png\t{i % 2}\n" for i in range(6)))
    task = {"name": "faces", "reader": {"type": "image_list", "list": str(images / "list.txt"), **(reader or {})},
            "head": head or {"type": "arcface", "scale": 8.0}}
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "faces.yaml").write_text(yaml.safe_dump(task))
    job = image_job(tmp_path / "run", tasks=["tasks/faces.yaml"])
    job["backbone"]["in_channels"] = 3
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    return str(tmp_path / "job.yaml"), str(tmp_path / "tasks" / "faces.yaml")


def refused(path, overrides=()):
    with pytest.raises(ConfigError) as caught:
        build_job(load_job(path, list(overrides)), announce_plan=False)
    return str(caught.value)


@pytest.mark.parametrize("override, key, words", [
    ("tasks.0.head.foo=1", "tasks.0.head.foo", "has no parameter 'foo'"),
    ("tasks.0.head.scale=-1", "tasks.0.head.scale", "scale must be > 0"),
    ("tasks.0.reader.preprocess.equalise=true", "tasks.0.reader.preprocess.equalise", "did you mean 'equalize'"),
    ("tasks.0.reader.holdout_classes=[9]", "tasks.0.reader.holdout_classes", "label(s) [9]"),
    ("tasks.0.head.num_classes=1", "tasks.0.head.num_classes", "set num_classes to 2"),
])
def test_a_bad_value_given_by_set_is_blamed_on_set_not_on_the_task_file(tmp_path, override, key, words):
    path, task_file = task_file_job(tmp_path)
    message = refused(path, [override])
    assert message.startswith(f"--set: {key}: "), message
    assert words in message and task_file not in message and "\n" not in message, message


@pytest.mark.parametrize("reader, key, suggestion", [
    ({"preprocess": {"equalise": True}}, "reader.preprocess.equalise", "equalize"),
    ({"augment": {"rotat": 5}}, "reader.augment.rotat", "rotate"),
])
def test_a_typo_under_preprocess_or_augment_names_the_task_file_and_the_key(tmp_path, reader, key, suggestion):
    path, task_file = task_file_job(tmp_path, reader)
    message = refused(path)
    assert message.startswith(f"{task_file}: {key}: "), message
    assert f"did you mean '{suggestion}'" in message and "list.txt" not in message, message


def test_resume_with_overwrite_is_refused_before_anything_is_loaded(tmp_path):
    proc = mtl("train", "examples/configs/demo.yaml", "--set", f"output_dir={tmp_path}", "--resume", "--overwrite",
               expect=2)
    assert proc.stdout == "" and proc.stderr.count("\n") == 1, proc.stdout + proc.stderr
    assert "--resume" in proc.stderr and "--overwrite" in proc.stderr and "pass one of them" in proc.stderr


def stop_sentence(capsys, monkeypatch, argv, **env):
    """What ``mtl`` prints when a run is stopped on request, run as ``argv`` (with ``env``): (status, stderr)."""
    from mtl import cli
    from mtl.train.preemption import Preempted

    monkeypatch.setattr(sys, "argv", argv)
    for key, value in env.items():
        monkeypatch.setenv(key, value)

    def stopped(args):
        raise Preempted("stopped after step 3 on request (Ctrl-C, SIGINT); checkpoint runs/x/checkpoints/step_3")

    with pytest.raises(SystemExit) as exit_status:
        cli.run(stopped, None)
    return exit_status.value.code, capsys.readouterr().err


def test_a_stop_on_request_says_the_whole_command_that_continues(capsys, monkeypatch):
    monkeypatch.delenv("MTL_LAUNCH_COMMAND", raising=False)
    code, err = stop_sentence(capsys, monkeypatch, ["/venv/bin/mtl", "train", "job.yaml", "--until", "9"])
    assert code == 75
    assert err == ("stopped after step 3 on request (Ctrl-C, SIGINT); checkpoint runs/x/checkpoints/step_3. To "
                   "continue from it, run: mtl train job.yaml --resume (exit status 75)\n")
    code, err = stop_sentence(capsys, monkeypatch, ["examples/train_joint.py", "job.yaml"], MTL_LAUNCH_COMMAND=
                              "mtl launch --nproc_per_node 2 examples/train_joint.py job.yaml --overwrite")
    assert "run: mtl launch --nproc_per_node 2 examples/train_joint.py job.yaml --resume (exit" in err, err


def test_a_worker_stopped_through_mtl_launch_names_the_signal_mtl_launch_got(tmp_path, monkeypatch):
    import signal
    import time

    from mtl.train.preemption import StopRequest

    names = {}
    for got in ("SIGINT", "SIGTERM", None):
        path = tmp_path / f"signal_{got}"
        if got:
            path.write_text(got)
        monkeypatch.setenv("MTL_LAUNCH_SIGNAL", str(path))
        with StopRequest() as stop:
            os.kill(os.getpid(), signal.SIGTERM)  # what the launcher sends its workers, whatever it got
            time.sleep(0.05)
        names[got] = stop.signal_name
    assert names == {"SIGINT": "Ctrl-C, SIGINT to mtl launch", "SIGTERM": "SIGTERM", None: "SIGTERM"}


# ---- 12. help texts -------------------------------------------------------------------------------------------------
def test_every_argument_of_every_command_has_a_help_text_and_shows_its_default():
    from mtl import cli

    parser = cli.build_parser()
    missing = [(name, words) for name, each in cli.parsers(parser) for words, text in cli.arguments(each)
               if not text.strip()]
    assert not missing, missing
    export_help = dict(cli.parsers(parser))["mtl export"].format_help()
    assert "(default: 13)" in " ".join(export_help.split()) and "(default: auto)" in export_help
    assert "(default: None)" not in export_help and "(default: False)" not in export_help


@pytest.mark.parametrize("words", [["checkpoint"], ["data"], []])
def test_a_command_without_its_sub_command_lists_the_choices(words):
    proc = mtl(*words, expect=2)
    assert "required" not in proc.stderr and "choose a command:" in proc.stderr, proc.stderr
    if words == ["checkpoint"]:
        assert "\n  info     what a checkpoint holds\n  reshard  write the checkpoint again" in proc.stderr


def test_mtl_launch_help_says_what_it_does_with_an_example():
    proc = mtl("launch", "--help")
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("usage: mtl launch") and len(lines) < 30, proc.stdout
    assert "  mtl launch --nproc_per_node 2 examples/train_joint.py examples/configs/demo.yaml" in proc.stdout
    assert "--resume" in proc.stdout and "Paddle 3.3's launcher" not in proc.stdout
    assert mtl("launch", expect=2).stderr.startswith("usage: mtl launch")


# ---- 13. display --------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def face_run(tmp_path_factory):
    from tests.newcomer_runs import face_run

    return face_run(tmp_path_factory.mktemp("face"))


def saved_figures(monkeypatch):
    """The matplotlib figures saved from now on (``Figure.savefig`` still writes them)."""
    import matplotlib.figure

    saved, original = [], matplotlib.figure.Figure.savefig

    def keep(fig, *args, **kw):
        saved.append(fig)
        return original(fig, *args, **kw)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", keep)
    return saved


def test_mtl_eval_shows_the_far_it_reached_and_names_the_rocs_number(face_run, tmp_path, monkeypatch):
    from mtl.commands.evaluate import evaluate

    run, export, pairs = face_run
    printed, figures = [], saved_figures(monkeypatch)
    result = evaluate(export, [pairs], out_dir=str(tmp_path), console=printed.append)["pairs"]
    table = next(p for p in printed if p.startswith("| set"))
    header, _, row = table.splitlines()
    cells = dict(zip([c.strip() for c in header.strip("|").split("|")], [c.strip() for c in row.strip("|").split("|")]))
    assert "VAL@FAR=1e-3" not in header and cells["VAL"] == f"{result['val_at_far']:.5f}"
    assert cells["at FAR"] == f"{result['far']:.5f}"  # the FAR reached, not the target
    assert any("FAR 1e-3" in p for p in printed)  # the target is said once, below the table
    legend = [t.get_text() for t in figures[-1].axes[0].get_legend().get_texts()]
    assert legend == [f"pairs (accuracy {result['accuracy']:.4f})"]


def test_mtl_compare_tick_labels_never_overlap(tmp_path):
    from mtl.studies.comparison import compare_runs, comparison_figure

    tasks = {"t": ("softmax", "accuracy", True, 0.5)}
    names = ["weighting_uncertainty_seed0", "weighting_famo_seed0", "weighting_static_seed1", "a",
             "averylongnamewithoutanyseparatorsatall", "x-y"]
    runs = compare_runs([fake_run(tmp_path / name, tasks) for name in names])
    fig = comparison_figure(runs)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    for ax in fig.axes:
        boxes = [label.get_window_extent(renderer) for label in ax.get_xticklabels()]
        assert len(boxes) == len(names)
        for left, right in zip(boxes, boxes[1:]):
            assert left.x1 < right.x0, (left, right)  # a gap between neighbours


def fake_run(folder, tasks):
    """A run folder whose summary.json has ``tasks`` = {name: (head, metric, higher_is_better, value)}."""
    os.makedirs(folder)
    summary = {"steps": 10, "tasks": {name: {"head": head, "primary_metric": metric, "higher_is_better": higher,
                                             "eval": {metric: value}, "eval_averaged": None}
                                      for name, (head, metric, higher, value) in tasks.items()}}
    with open(os.path.join(folder, "summary.json"), "w") as f:
        json.dump(summary, f)
    return str(folder)


# ---- 11. matplotlib's font-cache notice ----------------------------------------------------------------------------
FONT_NOTICE = ("import logging, sys\nfrom mtl.core.console import configure_console\nconfigure_console({verbose})\n"
               "logging.getLogger('matplotlib.font_manager').warning("
               "'Matplotlib is building the font cache; this may take a moment.')\n"
               "logging.getLogger('matplotlib.font_manager').warning('another warning')\n")


@pytest.mark.parametrize("verbose", [False, True])
def test_matplotlibs_font_cache_notice_is_hidden_unless_verbose(verbose):
    """The notice matplotlib logs on its logger when a first plot on a fresh machine builds the font cache."""
    proc = warm_python.run([sys.executable, "-c", FONT_NOTICE.format(verbose=verbose)], capture_output=True,
                           text=True, cwd=ROOT, env=environment(), timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert ("font cache" in proc.stderr) == verbose and "another warning" in proc.stderr, proc.stderr


# ---- 9. the docs agree with the tool -------------------------------------------------------------------------------
def doc(name):
    with open(os.path.join(ROOT, "docs", name)) as f:
        return f.read()


def test_every_strategy_the_weighting_page_names_in_a_table_is_registered_or_said_to_be_a_variant():
    """Each table row of docs/weighting.md names a registered strategy, or the page says which config it is (and
    that config loads)."""
    import re

    from mtl.core import registry

    registry.load_builtin()
    registered = {e.name for e in registry.entries("weighting")}
    text = doc("weighting.md")
    rows = set()
    for table in re.findall(r"(?:^\|.*\n)+", text, re.M):  # the tables whose first column names strategies
        cells = [line.split("|")[1].strip().strip("`") for line in table.splitlines()]
        if cells[0] in ("strategy", "weighting"):
            rows |= {c for c in cells[2:]}
    assert len(rows) >= 20, rows
    for name in sorted(rows - registered):
        said = re.search(rf"`{name}` in this table is `weighting: (\{{[^`]+\}})`", text)
        assert said, f"docs/weighting.md lists '{name}', which is not a registered strategy and is not explained"
        load_job(data={**image_job("unused"), "weighting": yaml.safe_load(said.group(1))})


def test_the_reliability_page_does_not_say_a_resume_needs_the_same_process_count():
    text = " ".join(doc("reliability.md").split())
    assert "needs the same number of processes" not in text
    assert "A checkpoint of W processes loads on W'" in text  # what tests/test_reshard.py checks


def test_the_tasks_page_claims_no_multilabel_class_count_limit_that_is_not_enforced(tmp_path):
    """A multi-label head's size is the reader's number of labels, whatever the task's class count."""
    text = " ".join(doc("tasks.md").split())
    assert "may not be below the task's class count" not in text
    job = build_job(load_job(os.path.join(ROOT, "examples", "configs", "demo.yaml"),
                             [f"output_dir={tmp_path}", "tasks.0.head={type: multilabel}"]), announce_plan=False)
    assert job.tasks[0].head.num_classes == 7 and job.tasks[0].reader.num_classes == 7  # as the page says


# ---- --resume STEP_OR_PATH ---------------------------------------------------------------------------------------
def step_lines(out):
    """metrics.jsonl's step records without the wall-clock rate."""
    with open(os.path.join(out, "metrics.jsonl")) as f:
        records = [json.loads(line) for line in f]
    return [{k: v for k, v in r.items() if k != "samples_per_s"} for r in records if "lr" in r]


def test_resume_from_a_named_checkpoint_equals_an_uninterrupted_run(tmp_path):
    full = image_job(tmp_path / "full", steps=6, checkpoint={"every": 2, "keep": 5})
    train_here(full)
    said = []
    job = build_job(load_job(data=full), announce_plan=False)
    Trainer(job, resume=True, resume_from="step_2", console=said.append).run()  # from step 2 of the finished run
    assert "removed the later checkpoints step_4, step_6" in " ".join(said), said
    reference = image_job(tmp_path / "reference", steps=6, checkpoint={"every": 2, "keep": 5})
    train_here(reference)
    assert step_lines(full["output_dir"]) == step_lines(reference["output_dir"])
    elsewhere = image_job(tmp_path / "warm", steps=6, checkpoint={"every": 2, "keep": 5})  # a new folder
    train_here(elsewhere, resume=True, resume_from=os.path.join(reference["output_dir"], "checkpoints", "step_4"))
    assert step_lines(elsewhere["output_dir"]) == step_lines(reference["output_dir"])[4:]
    with pytest.raises(ConfigError, match=r"--resume step_3: .* is not a complete checkpoint .*: step_2, step_4, "
                                          r"step_6"):
        train_here(full, resume=True, resume_from="step_3")


def test_resume_takes_a_step_number_and_still_reads_a_config_after_it():
    import argparse

    from mtl.commands.train import add_train_args

    parser = argparse.ArgumentParser()
    add_train_args(parser)
    assert parser.parse_args(["job.yaml", "--resume"]).resume == "latest"
    assert parser.parse_args(["job.yaml", "--resume", "500"]).resume == "500"
    assert parser.parse_args(["job.yaml"]).resume is None


# ---- mtl eval RUN: the run's own evaluation data --------------------------------------------------------------------
def test_mtl_eval_of_a_run_without_sets_scores_its_own_split_as_the_run_did(face_run, tmp_path):
    """The run's final evaluation (summary.json: live and averaged weights) is the reference."""
    from mtl.commands.evaluate_run import evaluate_run

    run, export, _ = face_run
    summary = json.load(open(os.path.join(run, "summary.json")))["tasks"]
    printed = []
    for weights, column in (("auto", "eval_averaged"), ("live", "eval")):
        results = evaluate_run(run, weights, str(tmp_path / weights), console=printed.append)
        for task, metrics in results.items():
            assert metrics.keys() == summary[task][column].keys()
            for name, value in metrics.items():
                assert value == pytest.approx(summary[task][column][name], abs=1e-9), (weights, task, name)
    assert printed[0].startswith(f"evaluating {run}") and "(averaged weights)" in printed[0]
    assert "| ids    | arcface | verification_accuracy * ↑ |" in printed[1], printed[1]
    assert json.load(open(tmp_path / "live" / "eval_run.json"))["tasks"] == results
    with pytest.raises(ConfigError, match="is an export: it holds no data of its own to score, so mtl eval needs"):
        evaluate_run(export)


# ---- 6. the console of mtl launch -----------------------------------------------------------------------------------
def launch(tmp_path, *args):
    """``mtl launch --nproc_per_node 2 examples/train_joint.py ARGS``: (exit status, console output as written:
    bytes decoded without newline translation, so that carriage returns stay)."""
    proc = warm_python.run([sys.executable, "-m", "mtl.cli", "launch", "--nproc_per_node", "2",
                           os.path.join(ROOT, "examples", "train_joint.py"), *map(str, args)],
                          capture_output=True, cwd=str(tmp_path), timeout=600, env=environment())
    return proc.returncode, (proc.stdout + proc.stderr).decode(errors="replace")


@pytest.mark.distributed
@pytest.mark.slow
def test_mtl_launch_shows_one_progress_line_and_a_failure_once_with_its_exit_status(tmp_path):
    data = image_job(tmp_path / "run", steps=30)
    data["log"] = {"every": 1, "progress": True, "plot": False}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(data))
    code, output = launch(tmp_path, tmp_path / "job.yaml")
    assert code == 0, output[-3000:]
    bar_lines = [line for line in output.split("\n") if "train:" in line]
    # one line updated in place: tqdm redraws it every 0.1 s, so how often depends on the machine's speed (9 times
    # for 30 steps in 0.8 s); the first and the last drawing and one between are there on any machine
    assert len(bar_lines) == 1, output[:3000]
    counts = [int(re.search(r"\| *(\d+)/30 \[", d).group(1)) for d in bar_lines[0].split("\r") if d.strip()]
    assert counts[0] == 0 and counts[-1] == 30 and any(0 < n < 30 for n in counts), (counts, output[:3000])
    assert counts == sorted(counts), counts  # the steps only go forward
    code, output = launch(tmp_path, tmp_path / "job.yaml", "--set", f"output_dir={tmp_path / 'bad'}",
                          "tasks.1.head.num_classes=2")
    assert code == 2, output[-3000:]  # a user error's status, as a single process exits with
    errors = [line for line in output.splitlines() if "error" in line.lower()]
    assert len(errors) == 1 and "num_classes 2" in errors[0], output
    assert "LAUNCH" not in output and "Container" not in output, output


def test_the_launcher_looks_at_its_processes_every_tenth_of_a_second(monkeypatch):
    """mtl's launcher makes Paddle's ``Pod.watch`` look every WATCH_INTERVAL seconds (Paddle's own: every second):
    a launch ends, or stops its other processes after a failure, when its processes do."""
    from paddle.distributed.launch.job import pod, status

    from mtl.commands import launcher_entry

    monkeypatch.setattr(pod.Pod, "watch", pod.Pod.watch)  # Paddle's, back after the test
    launcher_entry.watch_often()
    waits = []
    monkeypatch.setattr(pod.time, "sleep", waits.append)

    class Finishing:
        """A container that is done at the third look at its status."""
        looks = 0

        @property
        def status(self):
            Finishing.looks += 1
            return status.Status.COMPLETED if Finishing.looks > 2 else status.Status.RUNNING

    watched = pod.Pod()
    watched._init_containers, watched._containers = [], [Finishing()]
    assert watched.watch(timeout=2) == status.Status.COMPLETED
    assert waits and set(waits) == {launcher_entry.WATCH_INTERVAL} and launcher_entry.WATCH_INTERVAL <= 0.1


@pytest.mark.distributed
@pytest.mark.slow
def test_mtl_launch_reports_the_rank_that_failed_with_its_status(tmp_path):
    job = os.path.join(ROOT, "tests", "dist_scripts", "failing_job.yaml")
    code, output = launch(os.path.dirname(job), job, "--set", f"output_dir={tmp_path}")
    assert code == 1, output[-3000:]  # rank 1's (a bug in a plug-in: a traceback, status 1)
    assert output.count("RuntimeError: deliberate failure on rank 1") == 1, output
    assert "rank 1 failed with exit status 1; the end of its log (" in output, output
    assert "LAUNCH" not in output and "Container failed" not in output, output


# ---- 7. make demo-faces ---------------------------------------------------------------------------------------------
def test_the_faces_tables_of_one_seed_say_one_seed_not_a_zero_spread():
    from examples import faces_tables

    per_seed = {"orl": [0.9514], "yale": [0.8788]}
    result = {"arms": {"separate": {"datasets": per_seed, "all": {"accuracy": [0.846], "tar_far_1e-2": [0.5],
                                                                  "tar_far_1e-3": [0.2]}, "cross_condition": [0.1]}},
              "sampling": {"separate": {"orl": 32, "yale": 32}}}
    text = faces_tables.tables(result)
    assert "0.9514 (one seed)" in text and "0.8460 (one seed)" in text and "±" not in text, text


def test_make_demo_faces_says_which_people_and_writes_its_report_into_its_folder():
    demo = warm_python.run(["make", "-n", "demo-faces"], capture_output=True, text=True, cwd=ROOT, check=True).stdout
    command = next(line for line in demo.splitlines() if "faces_report.py" in line)
    out = command.split("--out ")[1].split()[0]
    assert f"--json {out}/report.json" in command, command
    said = " ".join(demo.split())
    assert "validation people" in said and "the test people (examples/configs/faces_six_test.yaml" in said, said
    assert f"{out}/report.md" in said and f"{out}/roc_all_people.png" in said
