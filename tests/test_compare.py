"""Single-task baselines and Δm (mtl baseline), runs side by side (mtl compare)."""
import contextlib
import io
import json
import os

import pytest

from mtl.studies.comparison import delta_m, single_task_config, sub_batches

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEMO = os.path.join(ROOT, "examples", "configs", "demo.yaml")


def test_delta_m_is_the_literature_formula():
    # Maninis et al. 2019: (1/T) sum_t s_t (M_joint - M_single) / M_single, in percent; s = +1 higher is better
    joint = {"acc": 0.90, "rmse": 0.50, "ap": 0.40}
    single = {"acc": 0.80, "rmse": 0.40, "ap": 0.50}
    higher = {"acc": True, "rmse": False, "ap": True}
    expected = 100.0 / 3 * ((0.90 - 0.80) / 0.80 - (0.50 - 0.40) / 0.40 + (0.40 - 0.50) / 0.50)
    assert delta_m(joint, single, higher) == pytest.approx(expected)
    assert delta_m({"acc": 0.8}, {"acc": 0.8}, {"acc": True}) == 0.0
    assert delta_m({"acc": 0.8}, {}, {"acc": True}) != delta_m({"acc": 0.8}, {}, {"acc": True})  # NaN: nothing


def test_single_task_jobs_keep_the_sub_batch_steps_and_seed():
    from mtl.config.loading import load_job

    cfg = load_job(DEMO, ["schedule.batch_size=50", "weighting={type: rlw}"])
    sizes = sub_batches(cfg)
    assert sum(sizes.values()) == 50 and set(sizes) == {"digits_low", "digits_high", "digits_classify"}
    single = single_task_config(cfg, "digits_high", sizes["digits_high"])
    assert [t["name"] for t in single["tasks"]] == ["digits_high"]
    assert single["schedule"]["batch_size"] == sizes["digits_high"] and single["weighting"] == {"type": "static"}
    assert single["schedule"]["steps"] == cfg["schedule"]["steps"] and single["seed"] == cfg["seed"]
    assert single["optimizer"] == cfg["optimizer"] and single["backbone"] == cfg["backbone"]
    assert single["output_dir"] == os.path.join(cfg["output_dir"], "baselines", "digits_high")


def mtl(*args):
    """``mtl ARGS`` in this process (the command's parser and function; no process start-up); what it printed."""
    from mtl.cli import build_parser

    parsed = build_parser().parse_args([str(a) for a in args])
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        parsed.func(parsed)
    return printed.getvalue()


@pytest.mark.slow  # five short trainings of the demo job (in this process)
def test_baseline_and_compare_on_the_digits_demo(tmp_path):
    quick = ["schedule.steps=8", "log.progress=false", "log.plot=false", "eval.every=0", "checkpoint.every=0",
             "averaging.type=none", "data.num_workers=0"]
    out = mtl("baseline", DEMO, "--set", f"output_dir={tmp_path / 'static'}", *quick)
    assert "Δm =" in out and "| digits_classify" in out
    with open(tmp_path / "static" / "baseline.json") as f:
        result = json.load(f)
    assert set(result["tasks"]) == {"digits_low", "digits_high", "digits_classify"}
    joint = {t: v["joint"] for t, v in result["tasks"].items()}
    single = {t: v["single"] for t, v in result["tasks"].items()}
    higher = {t: v["higher_is_better"] for t, v in result["tasks"].items()}
    assert result["delta_m"] == pytest.approx(delta_m(joint, single, higher))
    # a second run reuses the finished single-task runs
    again = mtl("baseline", DEMO, "--set", f"output_dir={tmp_path / 'static'}", *quick)
    assert again.count("reusing the finished run") == 4
    mtl("train", DEMO, "--set", f"output_dir={tmp_path / 'rlw'}", "weighting={type: rlw}", *quick)
    table = mtl("compare", str(tmp_path / "static"), str(tmp_path / "rlw"), "--plot", str(tmp_path / "bars.png"))
    header = table.splitlines()[0]
    assert "static" in header and "rlw" in header
    assert f"{result['delta_m']:+.2f}" in table
    assert os.path.getsize(tmp_path / "bars.png") > 1000
    _baseline_never_trains_over_another_job(tmp_path, quick)


def _baseline_never_trains_over_another_job(tmp_path, quick):
    """A changed config was 'reused' (only the step count was compared) and a folder of another run was trained over
    without a word; now both are refused before anything trains, naming the key, and --overwrite trains again."""
    from mtl.core.errors import ConfigError

    static = tmp_path / "static"
    stamp = os.path.getmtime(static / "summary.json")
    with pytest.raises(ConfigError, match=r"holds files of another job \(optimizer.lr: .* before, 0.5 now\).*"
                                          "--overwrite"):
        mtl("baseline", DEMO, "--set", f"output_dir={static}", *quick, "optimizer.lr=0.5")
    assert os.path.getmtime(static / "summary.json") == stamp
    other = tmp_path / "other"  # a finished joint run there, made by mtl train with another seed
    mtl("train", DEMO, "--set", f"output_dir={other}", "seed=7", *quick)
    with pytest.raises(ConfigError, match=r"'.*other' holds files of another job \(seed: 7 before, 0 now\)"):
        mtl("baseline", DEMO, "--set", f"output_dir={other}", *quick)
    assert not (other / "baselines").exists()
    blocked = tmp_path / "blocked"  # the last folder checked is a file: refused before the joint job trains
    (blocked / "baselines").mkdir(parents=True)
    (blocked / "baselines" / "digits_classify").write_text("")
    with pytest.raises(ConfigError, match="is a file, not a folder"):
        mtl("baseline", DEMO, "--set", f"output_dir={blocked}", *quick)
    assert sorted(os.listdir(blocked)) == ["baselines"]
    out = mtl("baseline", DEMO, "--set", f"output_dir={static}", *quick, "optimizer.lr=0.5", "--overwrite")
    assert out.count("training in") == 4 and os.path.getmtime(static / "summary.json") != stamp


@pytest.mark.parametrize("content, words", [
    ('{"steps": 4, "tasks": ', "is not valid JSON"),
    ('{"steps": 4}', "has no 'tasks' object"),
    ('[6]', "holds a JSON list, expected an object"),
    ('{"tasks": ["a"]}', "has no 'tasks' object"),
    ('{"tasks": {"a": {"primary_metric": "acc", "eval": {"acc": "big"}}}}', "task 'a' has acc = 'big', not a number"),
])
def test_compare_names_a_summary_that_is_not_a_runs(tmp_path, content, words):
    from mtl.core.errors import DataError

    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "summary.json").write_text(content)
    with pytest.raises(DataError, match=words.replace("(", r"\(")):
        mtl("compare", tmp_path / "run", "--plot", tmp_path / "c.png")
    assert not (tmp_path / "c.png").exists()


@pytest.mark.parametrize("content, words", [("{", "is not valid JSON"), ('{"x": 1}', "no number under 'delta_m'"),
                                            ('{"delta_m": "big"}', "got 'big'")])
def test_compare_names_a_baseline_file_that_is_not_mtl_baselines(tmp_path, content, words):
    from mtl.core.errors import DataError

    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "summary.json").write_text('{"tasks": {"a": {"primary_metric": "acc", "eval": {"acc": 1}}}}')
    (tmp_path / "run" / "baseline.json").write_text(content)
    with pytest.raises(DataError, match=words):
        mtl("compare", tmp_path / "run", "--plot", tmp_path / "c.png")


@pytest.mark.parametrize("plot, words", [("nodir/x.png", "does not exist"), ("keep.txt", "does not end in a chart"),
                                         (".", "is a folder")])
def test_compare_checks_the_chart_path_before_reading_the_runs(tmp_path, plot, words):
    from mtl.core.errors import ConfigError

    with pytest.raises(ConfigError, match=words):  # the run folder does not exist either: the path is checked first
        mtl("compare", tmp_path / "missing", "--plot", tmp_path / plot)


def test_compare_tells_runs_of_one_folder_name_apart_and_refuses_a_run_given_twice(tmp_path):
    """Two runs called run1 (a/run1, b/run1) had two columns both headed 'run1'; a run given twice (run, run/) had
    two columns of the same figures."""
    from mtl.core.errors import ConfigError
    from mtl.studies.comparison import run_names

    for parent, value in (("a", 0.5), ("b", 0.75)):
        (tmp_path / parent / "run1").mkdir(parents=True)
        (tmp_path / parent / "run1" / "summary.json").write_text(
            json.dumps({"tasks": {"t": {"primary_metric": "acc", "higher_is_better": True, "eval": {"acc": value}}}}))
    out = mtl("compare", tmp_path / "a" / "run1", tmp_path / "b" / "run1", "--plot", tmp_path / "c.png")
    header = out.splitlines()[0]
    assert "| a/run1 " in header and "| b/run1 " in header, out
    assert "| 0.5000 " in out and "| 0.7500 " in out and os.path.isfile(tmp_path / "c.png")
    assert run_names(["x/run1", "y/run2"]) == {"x/run1": "run1", "y/run2": "run2"}  # the folder name when it tells
    with pytest.raises(ConfigError, match=r"run folder '.*a/run1/' is given twice \(also as '.*a/run1'\)"):
        mtl("compare", tmp_path / "a" / "run1", str(tmp_path / "a" / "run1") + "/", "--plot", tmp_path / "c.png")
