"""docs/text.md's table of the pretrained-encoder arms (issue 54) is what docs/results/text_ewt_pretrained.json holds:
each arm's mean ± standard deviation over its seeds (ddof 0, two decimals), or the value of a single seed ("-" for
a task not run), and MiniLM joint - alone paired on the seed both ran."""
import json
import os
import re

import numpy as np

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
        gap = f"{paired['joint'][0] - paired['alone'][0]:+.2f}" if paired else "-"
        assert cells[4] == gap, (task, cells[4])
        if paired:  # the pairs are seed 0 of both arms
            assert paired["joint"][0] == results["arms"]["minilm"][task]["values"][0]
            assert paired["alone"][0] == results["arms"]["minilm_alone"][task]["values"][0]
