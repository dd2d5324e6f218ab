"""Single-task baselines and Δm (mtl baseline), runs side by side (mtl compare)."""
import contextlib
import io
import json
import os

import pytest

from mtl.commands.compare import delta_m, single_task_config, sub_batches

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
