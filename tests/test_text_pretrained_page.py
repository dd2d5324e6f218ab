"""docs/text.md's table of the pretrained-encoder arms (issue 54) is what docs/results/text_ewt_pretrained.json holds:
each arm's mean ± standard deviation over its seeds (ddof 0, two decimals), or the value of a single seed ("-" for
a task not run), and MiniLM joint - alone paired on the seeds both ran (mean ± std of the differences); Δm per seed."""
import json
import os
import re

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "docs", "results", "text_ewt_pretrained.json")
PAGE = os.path.join(ROOT, "docs", "text.md")
COLUMNS = ("scratch", "glove", "minilm", "minilm_alone")  # the page's columns 3-6, in order; 7: joint - alone


def expected(values):
    """A cell as the page writes it."""
    if not values:
        return "-"
    if len(values) == 1:
        return f"{values[0]:.2f}"
    return f"{np.mean(values):.2f} ± {np.std(values):.2f}"


def page_rows():
    """``{task: [cells]}`` of the table under the pretrained-encoder heading."""
    text = open(PAGE).read()
    section = text[text.index("### On a pretrained encoder"):]
    section = section[:section.index("\n\n", section.index("| task |"))]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 7 and re.fullmatch(r"[a-z]+", cells[0]) and cells[0] != "task":
            rows[cells[0]] = cells[2:7]
    return rows


def test_the_pages_table_is_the_committed_results():
    results = json.load(open(RESULTS))
    rows = page_rows()
    assert set(rows) == set(results["arms"]["minilm"]) == {"upos", "xpos", "deps", "ner", "genre"}
    for task, cells in rows.items():
        for arm, cell in zip(COLUMNS, cells):
            shown = re.sub(r"\s*\(UAS [0-9.]+\)", "", cell.replace("**", "")).strip()
            assert shown == expected(results["arms"][arm][task]["values"]), (task, arm, cell)
        paired = results["tasks"].get(task)
        assert cells[4] == (gap(paired) if paired else "-"), (task, cells[4])
        if paired:  # each pair is one seed of both arms
            joint, alone = results["arms"]["minilm"][task], results["arms"]["minilm_alone"][task]
            for seed, j, a in zip(paired["seeds"], paired["joint"], paired["alone"]):
                assert j == joint["values"][results["seeds"]["minilm"].index(seed)]
                assert a == alone["values"][alone["seeds"].index(seed)]


def gap(paired):
    """The joint - alone cell: the paired differences, signed (mean ± std over seeds)."""
    differences = [j - a for j, a in zip(paired["joint"], paired["alone"])]
    if len(differences) == 1:
        return f"{differences[0]:+.2f}"
    return f"{np.mean(differences):+.2f} ± {np.std(differences):.2f}"


def test_delta_m_is_the_mean_relative_gain_of_each_complete_seed():
    """Δm (Maninis et al., 2019) of a seed whose five tasks ran alone: the mean over tasks of 100 (joint - alone) /
    alone."""
    results = json.load(open(RESULTS))
    complete = [seed for seed in results["seeds"]["minilm_alone"]
                if all(seed in e["seeds"] for e in results["tasks"].values()) and len(results["tasks"]) == 5]
    assert len(results["delta_m"]) == len(complete) >= 1
    for value, seed in zip(results["delta_m"], complete):
        gains = [100 * (e["joint"][e["seeds"].index(seed)] - e["alone"][e["seeds"].index(seed)])
                 / e["alone"][e["seeds"].index(seed)] for e in results["tasks"].values()]
        assert value == pytest.approx(np.mean(gains), rel=1e-12)
