"""Bad command-line input of ``mtl tokenizer train``, ``mtl launch``, ``mtl data pack / inspect`` and ``mtl train``'s
output folder: one sentence naming the option and the value (exit status 2), before anything is read or started; no
traceback."""
import os

import pytest

from mtl.cli import main as mtl_main
from mtl.commands import launch
from mtl.core.errors import DataError
from tests.cli_run import cli

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def binary(tmp_path):
    path = tmp_path / "image.png"
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)))
    return path


def test_tokenizer_names_a_missing_file_of_either_option(tmp_path, capsys):
    for option in ("--conllu", "--text"):
        code, err = cli(["tokenizer", "train", option, tmp_path / "none.txt", "-o", tmp_path / "t.json"], capsys)
        assert code == 2 and err.strip() == f"error: {option} {tmp_path / 'none.txt'}: no such file", err
    assert not (tmp_path / "t.json").exists()


def test_tokenizer_names_a_file_that_is_not_text(binary, tmp_path, capsys):
    code, err = cli(["tokenizer", "train", "--text", binary, "-o", tmp_path / "t.json"], capsys)
    assert code == 2 and f"--text file '{binary}' is not UTF-8 text: line 1" in err and "Traceback" not in err, err
    code, err = cli(["tokenizer", "train", "--conllu", binary, "-o", tmp_path / "t.json"], capsys)
    assert code == 2 and f"CoNLL-U file '{binary}' is not UTF-8 text: line 1" in err and "Traceback" not in err, err


@pytest.mark.parametrize("vocab, frequency", [(0, 2), (8000, 0), (-5, 2)])
def test_tokenizer_refuses_a_vocabulary_or_frequency_below_one(tmp_path, capsys, vocab, frequency):
    (tmp_path / "text.txt").write_text("some words here\n")
    code, err = cli(["tokenizer", "train", "--text", tmp_path / "text.txt", "--vocab-size", vocab,
                     "--min-frequency", frequency, "-o", tmp_path / "t.json"], capsys)
    assert code == 2 and "--vocab-size and --min-frequency must be at least 1" in err, err
    assert f"got {vocab} and {frequency}" in err and not (tmp_path / "t.json").exists()


@pytest.mark.parametrize("value, stops", [("0", True), ("-1", True), ("1", False), ("2", False), ("abc", False)])
def test_launch_refuses_fewer_than_one_process_before_starting_the_launcher(monkeypatch, capsys, value, stops):
    """Paddle's launcher starts one process for 0 or -1 without a word; "abc" is left to its own argument parser."""
    started = []
    monkeypatch.setattr(launch, "run_launcher", lambda argv, verbose: started.append(argv) or 0)
    monkeypatch.setattr(launch, "gpu_build", lambda: False)
    for args in (["--nproc_per_node", value], [f"--nproc_per_node={value}"]):
        code = launch.launch_main([*args, "train.py"])
        err = capsys.readouterr().err
        if stops:
            assert code == 2 and not started
            assert err.strip() == f"error: --nproc_per_node must be at least 1 (processes on this machine), got {value}"
        else:
            assert code == 0 and started.pop() == [*args, "train.py"] and not err


def test_train_names_an_output_dir_that_cannot_be_a_folder_before_reading_any_data(tmp_path, capsys, monkeypatch):
    import mtl.train.job

    monkeypatch.setattr(mtl.train.job, "build_job", lambda *a, **k: pytest.fail("the job was built"))
    (tmp_path / "afile").write_text("mine\n")
    demo = os.path.join(ROOT, "examples", "configs", "demo.yaml")
    for out, words in ((tmp_path / "afile", f"'{tmp_path / 'afile'}' is a file, not a folder"),
                       (tmp_path / "afile" / "run", f"cannot create the folder '{tmp_path / 'afile' / 'run'}': "
                                                    f"'{tmp_path / 'afile'}' is a file")):
        code, err = cli(["train", demo, "--set", f"output_dir={out}"], capsys)
        assert code == 2 and f"error: output_dir: {words}" in err and "Traceback" not in err, err
    assert (tmp_path / "afile").read_text() == "mine\n" and sorted(os.listdir(tmp_path)) == ["afile"]


def test_an_output_dir_without_write_permission_is_named_and_nothing_is_created(tmp_path, monkeypatch):
    """(The suite may run as root, for whom every folder is writable: the permission answer is the test's.)"""
    from mtl.core.errors import ConfigError
    from mtl.store.rundir import check_output_dir, make_output_dir

    check_output_dir(str(tmp_path / "new" / "run"))  # a folder that can be made: no error, nothing made
    assert not (tmp_path / "new").exists()
    monkeypatch.setattr(os, "access", lambda path, mode: path != str(tmp_path))
    with pytest.raises(ConfigError, match=f"the folder '{tmp_path}' is not writable .no permission., so "
                                          f"'{tmp_path / 'new' / 'run'}' cannot be created there"):
        make_output_dir(str(tmp_path / "new" / "run"))
    assert not (tmp_path / "new").exists()
    with pytest.raises(ConfigError, match=f"the folder '{tmp_path}' is not writable .no permission.$"):
        check_output_dir(str(tmp_path))


@pytest.mark.parametrize("size, words", [(10, "every character of the text and the special tokens are kept"),
                                         (5000, "no pair of pieces is left that occurs 2 times or more")])
def test_tokenizer_says_when_the_vocabulary_is_not_the_size_asked_for(tmp_path, capsys, size, words):
    """Reference: the size of the vocabulary in the written file (tokenizers' own count)."""
    import json

    (tmp_path / "text.txt").write_text("the cat sat on the mat\nthe dog sat\n")
    mtl_main(["tokenizer", "train", "--text", str(tmp_path / "text.txt"), "--vocab-size", str(size), "-o",
              str(tmp_path / "t.json")])
    pieces = len(json.load(open(tmp_path / "t.json"))["model"]["vocab"])
    assert pieces != size and f"note: {pieces} pieces, not the {size} asked for: {words}" in capsys.readouterr().out


def test_embed_and_predict_say_an_input_folder_is_a_folder(tmp_path):
    """The readers of mtl embed's inputs (images and arrays, texts); mtl predict's calls the same check."""
    from mtl.core.errors import DataError
    from mtl.serving.export import read_inputs
    from mtl.text.embed import read_texts

    (tmp_path / "faces").mkdir()
    for read in (lambda p: read_inputs([p], [3, 8, 8]), lambda p: read_texts([p])):
        with pytest.raises(DataError, match=f"input '{tmp_path / 'faces'}' is a folder; give its files "
                                            f"\\(e.g. '{tmp_path / 'faces' / '[*]'}.png'\\)"):
            read(str(tmp_path / "faces"))
        with pytest.raises(DataError, match=f"input '{tmp_path / 'none.png'}' does not exist"):
            read(str(tmp_path / "none.png"))


def test_the_training_scripts_own_options_are_not_the_launchers():
    """Reference: Paddle's launcher's own parser (its options all take a value; everything from the script on is the
    script's)."""
    from paddle.distributed.launch.context.args_envs import parse_args

    argv = ["--nproc_per_node", "2", "--log_level=INFO", "train.py", "--log_dir", "mine", "--nproc_per_node", "0"]
    parsed = parse_args_of(parse_args, argv)
    assert launch.launcher_options(argv) == argv[:3] and parsed.training_script == "train.py"
    assert parsed.training_script_args == argv[4:]
    assert launch._option(argv, ("--log_dir",)) is None and launch._option(argv, ("--nproc_per_node",)) == "2"
    assert launch.count_problem(argv) is None  # the script's "--nproc_per_node 0" is its own
    assert "--log_dir" in launch.launcher_command(argv, False, log_dir="/tmp/logs")  # mtl launch still keeps logs


def parse_args_of(parse_args, argv):
    """Paddle's launcher arguments of ``argv`` (its parser reads sys.argv)."""
    import sys

    saved, sys.argv = sys.argv, ["launch", *argv]
    try:
        return parse_args()[0]
    finally:
        sys.argv = saved


@pytest.mark.subprocess
@pytest.mark.parametrize("script, args, words", [
    ("multimnist_report.py", ["--configurations", "single", "--seeds", "0", "--steps", "0"],
     "schedule.steps: must be >= 1, got 0"),
    ("text_report.py", ["--seeds", "0", "--steps", "0"], "schedule.steps: must be >= 1, got 0"),  # 0 was "unset"
    ("mmoe_synthetic_report.py", ["--runs", "2", "--steps", "0"], "schedule.steps: must be >= 1, got 0"),
    ("faces_report.py", ["--seeds", "0", "--steps", "0", "--no-baselines"], "schedule.steps: must be >= 1, got 0"),
    ("faces_report.py", ["--seeds", "0", "--no-baselines", "--score-only"],  # was exit status 1
     "does not exist: there are no runs to score"),
    ("architectures_report.py", ["--costs", "none.json"], "cannot read the report none.json"),
    ("faces_report.py", ["--threads", "0"], "--jobs and --threads must be at least 1, got 1 and 0"),
    ("faces_report.py", ["--set", "threads=2"], "give a run's thread count as --threads N, not --set threads=N"),
])
def test_the_example_reports_refuse_bad_arguments_in_one_line_and_train_nothing(tmp_path, script, args, words):
    import subprocess
    import sys

    from tests import warm_python

    out = [] if script == "architectures_report.py" else ["--out", str(tmp_path / "out")]
    proc = warm_python.run([sys.executable, os.path.join(ROOT, "examples", script), *args, *out], cwd=str(tmp_path),
                           capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error")]
    assert proc.returncode == 2 and len(lines) == 1 and words in lines[0], proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and not (tmp_path / "out").exists()


@pytest.fixture
def faces(tmp_path):
    """An image folder of two identities (one and two 32x32 PNGs)."""
    import numpy as np
    from PIL import Image

    rng = np.random.RandomState(0)
    for person, count in (("a", 1), ("b", 2)):
        (tmp_path / "faces" / person).mkdir(parents=True)
        for j in range(count):
            Image.fromarray(rng.randint(0, 256, (32, 32, 3)).astype(np.uint8)).save(tmp_path / "faces" / person /
                                                                                     f"{j}.png")
    return tmp_path / "faces"


@pytest.mark.parametrize("args, words", [
    (["--resize", "0"], "--resize: the side of the re-encoded images must be a whole number of pixels, at least 1; "
                        "got 0"),
    (["--resize", "-3"], "--resize: the side of the re-encoded images must be a whole number of pixels, at least 1; "
                         "got -3"),
    (["--resize", "16", "--quality", "500"], "--quality: JPEG quality must be a whole number from 1 to 100; got 500"),
    (["--resize", "16", "--quality", "0"], "--quality: JPEG quality must be a whole number from 1 to 100; got 0")])
def test_pack_refuses_a_side_or_quality_pillow_cannot_use(faces, tmp_path, capsys, args, words):
    """--resize 0 was a ValueError traceback from Pillow; --quality 500 was taken without a word."""
    code, err = cli(["data", "pack", faces, tmp_path / "out" / "train", *args], capsys)
    assert code == 2 and err.strip() == f"error: {words}" and not (tmp_path / "out").exists(), err


def test_pack_names_an_output_path_through_a_file(faces, tmp_path, capsys):
    (tmp_path / "afile").write_text("keep")
    code, err = cli(["data", "pack", faces, tmp_path / "afile" / "x" / "train"], capsys)
    assert code == 2 and err.strip() == (f"error: cannot write into '{tmp_path / 'afile' / 'x'}': "
                                         f"'{tmp_path / 'afile'}' is a file, not a folder"), err
    assert (tmp_path / "afile").read_text() == "keep"


@pytest.mark.parametrize("args, words", [
    (["--samples", "-1"], "--samples: images on the contact sheet must be a whole number, 0 or more; got -1"),
    (["--sheet", "{tmp}/nodir/x.png"], "--sheet: cannot write '{tmp}/nodir/x.png': the folder '{tmp}/nodir' does "
                                       "not exist"),
    (["--sheet", "{tmp}/ds"], "--sheet: '{tmp}/ds' is a folder; name the chart's file (e.g. {tmp}/ds/chart.png)"),
    (["--sheet", "{tmp}/x.txt"], "--sheet: '{tmp}/x.txt' does not end in a chart type")])
def test_inspect_refuses_a_sample_count_or_sheet_path_before_reading(faces, tmp_path, capsys, args, words):
    """These were tracebacks (numpy, matplotlib) after every image was decoded; a folder given as --sheet got a
    'ds.png' written beside it."""
    assert cli(["data", "pack", faces, tmp_path / "ds" / "train"], capsys)[0] == 0
    code, err = cli(["data", "inspect", tmp_path / "ds", *[a.format(tmp=tmp_path) for a in args]], capsys)
    assert code == 2 and err.strip().startswith(f"error: {words.format(tmp=tmp_path)}"), err
    assert "Traceback" not in err and not (tmp_path / "ds.png").exists() and not (tmp_path / "x.txt").exists()


def test_a_warning_of_a_tool_is_printed_once():
    """Without a handler on the 'mtl' logger Python's last-resort handler printed the damaged-checkpoint warning a
    second time (bare) above the 'warning: ...' line. Under pytest the root logger has handlers, so a fresh
    interpreter shows what a user sees."""
    import subprocess
    import sys

    run = subprocess.run([sys.executable, "-c", "from mtl.store.layout import report_damaged; "
                                                "report_damaged(\"checkpoint 'c' is damaged\")"],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and run.stderr.splitlines() == ["warning: checkpoint 'c' is damaged"], run.stderr


@pytest.mark.parametrize("argv, words", [
    (["embed", "{tmp}/export", "{tmp}/x.npy", "-o", "{tmp}/nodir/e.npy"],
     "--output: cannot write '{tmp}/nodir/e.npy': the folder '{tmp}/nodir' does not exist"),
    (["embed", "{tmp}/export", "{tmp}/x.npy", "-o", "{tmp}/e"], "--output: '{tmp}/e' does not end in .npy"),
    (["embed", "{tmp}/export", "{tmp}/x.npy", "-o", "{tmp}/run"], "--output: '{tmp}/run' is a folder"),
    (["embed", "{tmp}/export", "{tmp}/x.npy", "-o", "{tmp}/e.npy", "--batch-size", "0"],
     "--batch-size: must be at least 1, got 0"),
    (["predict", "{tmp}/run", "{tmp}/x.npy", "--json", "{tmp}/run/job.json"],
     "--json: '{tmp}/run/job.json' is a file of the run or export in '{tmp}/run'; write the output elsewhere"),
    (["predict", "{tmp}/run", "{tmp}/x.npy", "--json", "{tmp}/nodir/p.json"],
     "--json: cannot write '{tmp}/nodir/p.json': the folder '{tmp}/nodir' does not exist"),
    (["overlap", "{tmp}/run", "--json", "{tmp}/run/summary.json"], "--json: '{tmp}/run/summary.json' is a file of the "
                                                                   "run or export"),
    (["eval", "{tmp}/run", "--sets", "{tmp}/x.bin", "--batch-size", "-3"], "--batch-size: must be at least 1, got -3"),
    (["eval", "{tmp}/run", "--sets", "{tmp}/x.bin", "--out", "{tmp}/run/job.json"],
     "--out: '{tmp}/run/job.json' is a file; --out names the folder"),
])
def test_an_output_path_is_checked_before_anything_is_read(tmp_path, capsys, argv, words):
    """``--json run/job.json`` replaced the run's config with the predictions (exit 0); -o into a missing folder, a
    batch size below 1, --out naming a file were tracebacks, after the model was loaded. Found by a fuzzing helper.
    The run here is only its records: the check comes first, so nothing else is needed."""
    (tmp_path / "run").mkdir()
    for name in ("job.json", "summary.json"):
        (tmp_path / "run" / name).write_text("{}")
    code, err = cli([a.format(tmp=tmp_path) for a in argv], capsys)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith(f"error: {words.format(tmp=tmp_path)}"), err
    assert (tmp_path / "run" / "job.json").read_text() == "{}" and not (tmp_path / "e.npy").exists()


def test_a_folder_given_for_a_file_is_said_to_be_a_folder(tmp_path, capsys):
    """It was said not to exist (found by a fuzzing helper)."""
    from mtl.data.verification_sets import load_verification_set

    (tmp_path / "job.yaml").mkdir()
    (tmp_path / "set.bin").mkdir()
    code, err = cli(["train", tmp_path / "job.yaml"], capsys)
    assert code == 2 and err.strip() == f"error: {tmp_path / 'job.yaml'}: job config file is a folder, not a file", err
    with pytest.raises(DataError, match=r"verification set '.*set.bin' is a folder, not a file"):
        load_verification_set(str(tmp_path / "set.bin"))


def test_an_earlier_output_beside_a_runs_records_may_be_written_again(tmp_path):
    """The README writes `mtl embed ... -o runs/own_data/two.npy` into the run folder: running it twice must work
    (a review found the first rule refused every existing file there); a file in a run's sub-folders stays
    protected."""
    from mtl.core.errors import ConfigError, require_output_file

    run = tmp_path / "run"
    (run / "checkpoints" / "step_1").mkdir(parents=True)
    for name in ("job.json", "two.npy", "checkpoints/step_1/state.json"):
        (run / name).write_text("{}")
    require_output_file(str(run / "two.npy"), "-o", suffix=".npy")  # the user's own, written before
    require_output_file(str(run / "new.json"), "--json")
    for name in ("job.json", "checkpoints/step_1/state.json"):
        with pytest.raises(ConfigError, match=f"is a file of the run or export in '{run}'"):
            require_output_file(str(run / name), "--json")
