"""Issue 53, items 3-5: the same person, one name.

3. A same-person pairs file (``cross_negatives: {mask: pairs}``) that names a task the job does not have, or a class
   outside a head, is refused in one sentence; the pairs in use are counted on the console and in the rank's log.
4. People are named as the data names them (a folder name, or the dataset's own label), never by the head's class
   ids that ``holdout_classes`` renumbers: pairs files by name or by label mask the head classes the renumbering done
   by hand gives; a file in the wrong convention is refused; ``mtl overlap`` and ``same_person.json`` name people.
"""
import json
import os

import numpy as np
import pytest

from mtl.core.errors import ConfigError
from tests import equivalence
from tests.same_person_jobs import PEOPLE, SAME, finished_run, head_ids_by_hand, named_job, pairs_by

CROSS = ["cross_negatives.rate=1.0", "cross_negatives.mask=pairs"]


def _write(tmp_path, pairs, name="pairs.json"):
    path = tmp_path / name
    path.write_text(json.dumps(pairs))
    return str(path)


# ---- 3. a pairs file that matches nothing ------------------------------------------------------------------------
def test_a_task_name_typed_wrong_is_refused_naming_the_file_the_entry_and_the_tasks(tmp_path):
    from mtl.config.loading import load_job

    path = _write(tmp_path, [{"task_a": "arc7", "class_a": 1, "task_b": "cos5", "class_b": 4},
                             {"task_a": "arc7", "class_a": 2, "task_b": "Cos_5", "class_b": 0}])
    with pytest.raises(ConfigError) as info:
        load_job(equivalence.JOB, CROSS + [f"cross_negatives.pairs={path}"])
    text = str(info.value)
    assert info.value.key == "cross_negatives.pairs" and path in text and "entry 1" in text, text
    assert "'Cos_5'" in text and "arc7, arc1, cos5, soft3, reg" in text and "did you mean 'cos5'" in text, text
    assert len(text.splitlines()) == 1


@pytest.mark.parametrize("task, cls, classes", [("cos5", 5, 5), ("arc1", 1, 1), ("arc7", 70, 7)])
def test_a_class_outside_its_head_is_refused(tmp_path, task, cls, classes):
    from mtl.config.loading import load_job
    from mtl.train.job import build_job

    other = "arc7" if task != "arc7" else "cos5"
    path = _write(tmp_path, [{"task_a": other, "class_a": 0, "task_b": task, "class_b": cls}])
    cfg = load_job(equivalence.JOB, CROSS + [f"cross_negatives.pairs={path}"])
    with pytest.raises(ConfigError) as info:
        build_job(cfg, announce_plan=False)
    text = str(info.value)
    assert path in text and f"entry 0: the person of task '{task}' is class {cls}" in text, text
    assert f"[0, {classes})" in text and info.value.key == "cross_negatives.pairs", text


def test_the_pairs_in_use_are_counted_on_the_console_and_in_the_log(tmp_path):
    """Listed twice, or either way round, a pair counts once; a pair of one head's classes is not used here."""
    from mtl.config.loading import load_job
    from mtl.train.job import build_job
    from mtl.train.trainer import Trainer

    pairs = [{"task_a": "arc7", "class_a": 1, "task_b": "cos5", "class_b": 4},
             {"task_a": "cos5", "class_a": 4, "task_b": "arc7", "class_b": 1},  # the first, the other way round
             {"task_a": "arc7", "class_a": 2, "task_b": "cos5", "class_b": 0},
             {"task_a": "arc1", "class_a": 0, "task_b": "arc7", "class_b": 5},
             {"task_a": "arc7", "class_a": 3, "task_b": "arc7", "class_b": 6},  # one head's two classes
             {"task_a": "arc7", "class_a": 3, "task_b": "soft3", "class_b": 0}]  # a task of the job not taking part
    path = _write(tmp_path, pairs)
    out = str(tmp_path / "run")
    cfg = load_job(equivalence.JOB, CROSS + [f"cross_negatives.pairs={path}", f"output_dir={out}"])
    lines = []
    trainer = Trainer(build_job(cfg, announce_plan=False), console=lines.append)
    trainer.release()
    # the count by hand: distinct unordered pairs of two heads, per two heads in job order (arc7, arc1, cos5)
    distinct = {frozenset([(p["task_a"], p["class_a"]), (p["task_b"], p["class_b"])]) for p in pairs
                if p["task_a"] != p["task_b"] and "soft3" not in (p["task_a"], p["task_b"])}
    order = ["arc7", "arc1", "cos5"]
    per = {(a, b): sum(1 for d in distinct if {t for t, _ in d} == {a, b}) for i, a in enumerate(order)
           for b in order[i + 1:]}
    assert per == {("arc7", "arc1"): 1, ("arc7", "cos5"): 2, ("arc1", "cos5"): 0}
    expected = (f"cross-head negatives: {len(distinct)} same-person pairs of {path} masked ("
                + ", ".join(f"{a}-{b} {n}" for (a, b), n in per.items()))
    shown = [line for line in lines if line.startswith("cross-head negatives:")]
    assert len(shown) == 1 and shown[0] == expected + ("); pairs not used: 1 of two classes of one head, 1 of task "
                                                       "'soft3', which takes no part"), shown
    assert expected in open(os.path.join(out, "logs", "rank0.log")).read()


# ---- 4. the same person, one name --------------------------------------------------------------------------------
def _masked_table(tmp_path, pairs):
    """The (teamA class, teamB class) pairs the built job masks, sorted."""
    from mtl.train.job import build_job

    path = _write(tmp_path, pairs, f"pairs{len(list(tmp_path.glob('pairs*.json')))}.json")
    job = build_job(named_job(tmp_path, path), announce_plan=False)
    (cross,) = job.model.step_hooks
    return sorted(map(tuple, cross.pairs[("teamA", "teamB")].tolist()))


@pytest.mark.parametrize("key_a, key_b", [("name", "name"), ("label", "label"), ("class", "class"),
                                          ("name", "label"), ("label", "class")])
def test_a_pairs_file_by_name_or_by_the_datasets_labels_masks_the_right_head_classes(tmp_path, key_a, key_b):
    a, b = head_ids_by_hand("teamA"), head_ids_by_hand("teamB")
    expected = sorted((a[x], b[y]) for x, y in SAME)
    assert expected == [(0, 0), (1, 2), (2, 1)]  # bob-amy, dan-dan, eve-eve: the renumbering done by hand
    assert _masked_table(tmp_path, pairs_by(key_a, key_b)) == expected


def test_mtl_overlaps_older_form_head_class_with_its_name_is_read_by_the_name(tmp_path):
    a, b = head_ids_by_hand("teamA"), head_ids_by_hand("teamB")
    pairs = [{"task_a": "teamA", "class_a": a[x], "name_a": x, "task_b": "teamB", "class_b": b[y], "name_b": y}
             for x, y in SAME]
    assert _masked_table(tmp_path, pairs) == sorted((a[x], b[y]) for x, y in SAME)


@pytest.mark.parametrize("end_a, words", [
    ({"class_a": 4}, "gives only class_a 4, and this head numbers its people otherwise"),  # eve by inspect's label
    ({"class_a": 2}, "gives only class_a 2, and this head numbers its people otherwise"),  # eve by head id
    ({"name_a": "eve", "label_a": 3}, "names 'eve', which is label 4 of the data, but label_a says 3"),
    ({"name_a": "cid"}, "is label 2, a person held out of training (holdout_classes)"),
    ({"name_a": "Eve"}, "names 'Eve', which is not a name of the data (did you mean 'eve'?)"),
    ({"label_a": 0}, "is label 0, a person held out"),
    ({"label_a": 9}, "is label 9, not a person the head trains on"),
    ({"name_a": "eve", "class_a": 3}, "is label 4 (class 2 of the head), but class_a says 3"),
])
def test_a_file_in_the_wrong_convention_is_refused_naming_the_entry(tmp_path, end_a, words):
    from mtl.train.job import build_job

    pairs = [{"task_a": "teamA", "name_a": "dan", "task_b": "teamB", "name_b": "dan"},
             {"task_a": "teamA", **end_a, "task_b": "teamB", "class_b": 1}]  # teamB holds nobody out: 1 is eve
    path = _write(tmp_path, pairs)
    with pytest.raises(ConfigError) as info:
        build_job(named_job(tmp_path, path), announce_plan=False)
    text = str(info.value)
    assert f"'{path}' entry 1: the person of task 'teamA' {words}" in text, text
    assert info.value.key == "cross_negatives.pairs" and len(text.splitlines()) == 1


@pytest.mark.parametrize("pair", [{"task_a": "a", "name_a": "eve", "task_b": "b", "label_b": 1},
                                  {"task_a": "a", "class_a": "eve", "task_b": "b", "class_b": 1}])
def test_a_merged_heads_same_person_refuses_people_by_name_or_label(pair):
    """A head built outside a job (no reader's people given) cannot know which people a source held out: a pair by
    name or label is refused, not read as a class id (built by a job it is resolved:
    tests/test_issue53_followups.py)."""
    from mtl.core.errors import ParameterError
    from mtl.headkit.filtering import same_person_pairs

    with pytest.raises(ParameterError, match="built without its reader's people"):
        same_person_pairs({"pairs": [pair], "offsets": {"a": 0, "b": 5}}, 10)


def test_mtl_overlap_gives_names_and_the_datasets_labels_and_its_json_masks_those_people(tmp_path, capsys):
    from mtl.studies.overlap import report

    run, out = finished_run(tmp_path), str(tmp_path / "overlap.json")
    report(run, centres=True, threshold=0.9, json_path=out)
    printed = capsys.readouterr().out
    found = json.load(open(out))
    label = {task: {name: i for i, name in enumerate(people)} for task, people in PEOPLE.items()}
    assert {(m["name_a"], m["label_a"], m["name_b"], m["label_b"]) for m in found} == \
        {(x, label["teamA"][x], y, label["teamB"][y]) for x, y in SAME}
    assert all(set(m) == {"task_a", "name_a", "label_a", "task_b", "name_b", "label_b", "similarity"} for m in found)
    assert "| teamA    | 4 (eve)" in printed and "| teamA    | 2 (eve)" not in printed, printed
    from mtl.commands.data import inspect  # mtl data inspect lists the same label for the same name

    listed = {task: inspect(str(tmp_path / task / "list.txt"), None, check="sample")["labels"] for task in PEOPLE}
    assert all(listed[m["task_a"]][m["label_a"]] == m["name_a"] and listed[m["task_b"]][m["label_b"]] == m["name_b"]
               for m in found)
    a, b = head_ids_by_hand("teamA"), head_ids_by_hand("teamB")
    assert _masked_table(tmp_path, found) == sorted((a[x], b[y]) for x, y in SAME)


def test_the_online_rules_same_person_json_names_the_people(tmp_path):
    from mtl.headkit.cross_negatives import CrossNegatives

    cfg = named_job(tmp_path)
    from mtl.train.job import build_job

    job = build_job(cfg, announce_plan=False)
    heads = {t.name: t.head for t in job.tasks}
    people = {t.name: t.reader.class_people() for t in job.tasks}
    cross = CrossNegatives(CFG_ONLINE, heads, seed=0, people=people)
    a, b = head_ids_by_hand("teamA"), head_ids_by_hand("teamB")
    # teamA's eve (head class 2) removed teamB's eve (class 1) for 9 of 10 samples, and back
    cross.state["seen"] = {"teamA": {a["eve"]: 10}, "teamB": {b["eve"]: 10}}
    removed = {"teamA": {f"{a['eve']} teamB {b['eve']}": 9}, "teamB": {f"{b['eve']} teamA {a['eve']}": 8}}
    path = str(tmp_path / "same_person.json")
    cross.write_estimate(path, [removed])
    assert json.load(open(path)) == [{"task_a": "teamA", "name_a": "eve", "label_a": 4, "task_b": "teamB",
                                      "name_b": "eve", "label_b": 1, "similarity": 0.8}]


CFG_ONLINE = {"rate": 1.0, "tasks": "all", "mask": "online", "pairs": None, "update": "own", "warmup": 0,
              "quantile": 0.05, "momentum": 0.9, "floor": 0.2, "rows": "drawn"}


# ---- 5. the two-stage workflow and mtl data merge ----------------------------------------------------------------
def test_mtl_overlap_ends_with_the_next_command_and_that_command_masks_the_pairs(tmp_path, capsys):
    import shlex

    from mtl.config.loading import load_job
    from mtl.studies.overlap import report
    from mtl.train.job import build_job

    run, out = finished_run(tmp_path), str(tmp_path / "overlap.json")
    report(run, centres=True, threshold=0.9)
    assert capsys.readouterr().out.rstrip().splitlines()[-1].startswith("next: write them with --json PAIRS.json; "
                                                                        "then train the heads masked")
    report(run, centres=True, threshold=0.9, json_path=out)
    last = capsys.readouterr().out.rstrip().splitlines()[-1]
    prefix = "next: train the heads masked with these pairs: "
    assert last.startswith(prefix + "mtl train "), last
    words = shlex.split(last[len(prefix):])
    assert words[:2] == ["mtl", "train"] and words[3] == "--set", words
    assert os.path.abspath(words[2]) == str(tmp_path / "job.yaml")  # the config the run was trained from
    cfg = load_job(words[2], words[4:])
    assert cfg["output_dir"] == run + "_masked" and cfg["cross_negatives"]["pairs"] == out
    a, b = head_ids_by_hand("teamA"), head_ids_by_hand("teamB")
    (cross,) = build_job(cfg, announce_plan=False).model.step_hooks
    masked = cross.pairs[("teamA", "teamB")]
    assert sorted(map(tuple, masked.tolist())) == sorted((a[x], b[y]) for x, y in SAME)


def _image(path, seed, size=8):
    from PIL import Image

    os.makedirs(os.path.dirname(path), exist_ok=True)
    rng = np.random.RandomState(seed)
    Image.fromarray(rng.randint(0, 255, (size, size, 3)).astype(np.uint8)).save(path)


LFW = {"Ann_Lee": 2, "Bob_Ray": 1, "Cid_Moe": 3, "Dee_Fox": 1, "Eva_Orr": 2}
LIST = {"p1": 0, "p3": 1, "p2": 2, "p0": 3}  # folder -> the list's own label
GLINT = 4  # a pack of numbered people without names


def _three_sources(tmp_path):
    """An LFW-layout folder (``Name/Name_0001.jpg``), a label list named by its folders and a pack without
    labels.json; ``{(source, label): [absolute image paths]}`` as written (labels counted here, by hand)."""
    from mtl.writers.pack import pack

    written, seed = {}, 0
    for label, person in enumerate(sorted(LFW)):  # folder names in sorted order number LFW's people
        os.makedirs(tmp_path / "lfw" / person, exist_ok=True)
        for k in range(LFW[person]):
            path = str(tmp_path / "lfw" / person / f"{person}_{k + 1:04d}.jpg")
            _image(path, seed := seed + 1)
            written.setdefault(("lfw", label), []).append(path)
    lines = []
    for person, label in LIST.items():
        for k in range(2):
            path = str(tmp_path / "lst" / person / f"{k}.png")
            _image(path, seed := seed + 1)
            written.setdefault(("lst", label), []).append(path)
            lines.append(f"{person}/{k}.png\t{label}\n")
    (tmp_path / "lst" / "list.txt").write_text("".join(lines))
    for label in range(GLINT):
        for k in range(2):
            path = str(tmp_path / "glint_images" / f"{label:03d}" / f"{k}.png")
            _image(path, seed := seed + 1)
            written.setdefault(("glint", label), []).append(path)
    pack(str(tmp_path / "glint_images"), str(tmp_path / "glint" / "train"))
    os.remove(tmp_path / "glint" / "labels.json")  # Glint360K's people have numbers, not names
    return written


def brute_force_classes(nodes, edges):
    """{node: merged class}: components by repeated relaxation to the smallest node (not union-find), numbered in the
    order of their smallest node."""
    comp = {n: n for n in nodes}
    changed = True
    while changed:
        changed = False
        for u, v in edges:
            low = min(comp[u], comp[v])
            for n in nodes:
                if comp[n] in (comp[u], comp[v]) and comp[n] != low:
                    comp[n], changed = low, True
    roots = sorted(set(comp.values()))
    return {n: roots.index(comp[n]) for n in nodes}


def expected_merge(written, sources, edges):
    """(class of each (source, label), names of the classes) by :func:`brute_force_classes`; sources in order."""
    nodes = sorted(((sources.index(s), label) for s, label in written if s in sources))
    cls = brute_force_classes(nodes, [((sources.index(a[0]), a[1]), (sources.index(b[0]), b[1])) for a, b in edges])
    person = {"lfw": sorted(LFW), "lst": {v: k for k, v in LIST.items()}, "glint": {i: str(i) for i in range(GLINT)}}
    names = ["+".join(f"{sources[s]}/{person[sources[s]][label]}" for s, label in nodes if cls[(s, label)] == c)
             for c in range(len(set(cls.values())))]
    return {(sources[s], label): c for (s, label), c in cls.items()}, names


def test_merge_of_an_lfw_folder_and_a_label_list_writes_a_list_against_brute_force_components(tmp_path):
    from mtl.readers.image_list import parse_label_list
    from mtl.writers.merge import merge

    written = _three_sources(tmp_path)
    pairs = [{"task_a": "lfw", "name_a": "Ann_Lee", "task_b": "lst", "name_b": "p1"},
             {"task_a": "lfw", "name_a": "Bob_Ray", "task_b": "lfw", "class_b": "Cid_Moe"},  # one source's two
             {"task_a": "lst", "label_a": 2, "task_b": "lfw", "label_b": 4},  # p2 = Eva_Orr, by labels
             {"task_a": "lfw", "name_a": "Eva_Orr", "task_b": "lfw", "name_b": "Cid_Moe"}]  # a chain
    edges = [(("lfw", 0), ("lst", 0)), (("lfw", 1), ("lfw", 2)), (("lst", 2), ("lfw", 4)), (("lfw", 4), ("lfw", 2))]
    specs = [f"lfw={tmp_path / 'lfw'}", f"lst={tmp_path / 'lst' / 'list.txt'}"]
    summary = merge(str(tmp_path / "out" / "train"), specs, _write(tmp_path, pairs))
    expected, names = expected_merge(written, ["lfw", "lst"], edges)
    assert summary["classes"] == len(names) == 5 and summary["people"] == 9
    entries, problems = parse_label_list(str(tmp_path / "out" / "train.txt"))
    assert not problems and len(entries) == sum(len(v) for k, v in written.items() if k[0] != "glint")
    source_of = {path: key for key, paths in written.items() for path in paths}
    for _, rel, label in entries:
        assert int(label) == expected[source_of[os.path.normpath(str(tmp_path / "out" / rel))]], rel
    assert json.load(open(tmp_path / "out" / "labels.json")) == {"label": names}
    assert names[1] == "lfw/Bob_Ray+lfw/Cid_Moe+lfw/Eva_Orr+lst/p2", names


def test_merge_with_a_pack_writes_a_pack_against_brute_force_components(tmp_path):
    from mtl.core import registry
    from mtl.data.recordio import RecordIOReader, unpack
    from mtl.readers.recordio_reader import image_rows
    from mtl.writers.merge import merge

    written = _three_sources(tmp_path)
    pairs = [{"task_a": "lfw", "name_a": "Ann_Lee", "task_b": "lst", "name_b": "p1"},
             {"task_a": "lst", "label_a": 0, "task_b": "glint", "label_b": 2},  # p1 = glint 2: Ann's chain
             {"task_a": "glint", "class_a": 2, "task_b": "lfw", "name_b": "Dee_Fox"},
             {"task_a": "lst", "class_a": "p3", "task_b": "glint", "class_b": 0},
             {"task_a": "lst", "name_a": "p1", "task_b": "lfw", "name_b": "Ann_Lee"}]  # the first, again
    edges = [(("lfw", 0), ("lst", 0)), (("lst", 0), ("glint", 2)), (("glint", 2), ("lfw", 3)),
             (("lst", 1), ("glint", 0))]
    sources = ["lfw", "lst", "glint"]
    specs = [f"lfw={tmp_path / 'lfw'}", f"lst={tmp_path / 'lst' / 'list.txt'}", f"glint={tmp_path / 'glint'}"]
    with pytest.raises(ConfigError, match=r"source 'glint' is a RecordIO pack: .*\(add --pack\)"):
        merge(str(tmp_path / "out" / "train"), specs, _write(tmp_path, pairs))
    merge(str(tmp_path / "out" / "train"), specs, _write(tmp_path, pairs), as_pack=True)
    expected, names = expected_merge(written, sources, edges)
    by_bytes = {open(p, "rb").read(): key for key, paths in written.items() for p in paths}
    records = RecordIOReader(str(tmp_path / "out" / "train.rec"), str(tmp_path / "out" / "train.idx"))
    rows, stated = image_rows(records)
    labels = [unpack(records.read_row(int(r))) for r in rows]
    assert stated == len(names) and len(labels) == len(by_bytes)
    assert [int(h.label) for h, data in labels] == [expected[by_bytes[data]] for h, data in labels]
    assert [int(h.label) for h, _ in labels] == sorted(int(h.label) for h, _ in labels)  # grouped by class
    registry.load_builtin()
    reader = registry.build("reader", {"type": "recordio", "path": str(tmp_path / "out"), "image_size": 8})
    assert reader.num_classes == len(names) and reader.label_names() == {"label": names}
    assert names[0] == "lfw/Ann_Lee+lfw/Dee_Fox+lst/p1+glint/2" and "lst/p3+glint/0" in names


@pytest.mark.parametrize("pairs, words", [
    ([{"task_a": "lfw", "name_a": "Ann_Lee", "task_b": "list", "name_b": "p1"}],
     "entry 0: task_b 'list' is not a task of this merge (NAME=SOURCE) (its tasks: lfw, lst) (did you mean 'lst'?)"),
    ([{"task_a": "lfw", "name_a": "Ann_lee", "task_b": "lst", "name_b": "p1"}],
     "entry 0: the person of task 'lfw' names 'Ann_lee', which is not a name of the data (did you mean 'Ann_Lee'?)"),
    ([{"task_a": "lfw", "name_a": "Ann_Lee", "task_b": "lst", "name_b": "p4"}],  # named by labels.json, no image
     "entry 0: the person of 'lst' (lst/p4, label 4) has no image in"),
    ([{"task_a": "lfw", "label_a": 5, "task_b": "lst", "name_b": "p1"}],
     "entry 0: the person of task 'lfw' is label 5, outside the head's classes [0, 5)"),
])
def test_merge_refuses_a_pair_that_names_nobody_and_writes_nothing(tmp_path, pairs, words):
    from mtl.core.errors import DataError
    from mtl.writers.merge import merge

    _three_sources(tmp_path)
    _image(str(tmp_path / "lst" / "p5" / "0.png"), 98)  # label 5 has an image, label 4 (p4) none
    with open(tmp_path / "lst" / "list.txt", "a") as f:
        f.write("p5/0.png\t5\n")
    (tmp_path / "lst" / "labels.json").write_text(json.dumps({"label": ["p1", "p3", "p2", "p0", "p4", "p5"]}))
    path = _write(tmp_path, pairs)
    with pytest.raises(DataError) as info:
        merge(str(tmp_path / "out" / "train"), [f"lfw={tmp_path / 'lfw'}", f"lst={tmp_path / 'lst' / 'list.txt'}"],
              path)
    assert path in str(info.value) and words in str(info.value), str(info.value)
    assert not (tmp_path / "out").exists()


def test_merge_overwrites_nothing_and_a_failed_pack_leaves_nothing(tmp_path):
    from mtl.core.errors import DataError
    from mtl.writers.merge import merge

    _three_sources(tmp_path)
    specs = [f"lfw={tmp_path / 'lfw'}", f"lst={tmp_path / 'lst' / 'list.txt'}"]
    os.makedirs(tmp_path / "out")
    (tmp_path / "out" / "labels.json").write_text('{"label": ["mine"]}')
    with pytest.raises(DataError, match="labels.json' exists: merge writes a new dataset and overwrites nothing"):
        merge(str(tmp_path / "out" / "train"), specs)
    assert (tmp_path / "out" / "labels.json").read_text() == '{"label": ["mine"]}' and os.listdir(tmp_path / "out") \
        == ["labels.json"]
    _image(str(tmp_path / "lst" / "p0" / "1.png"), 99, size=9)  # one image of another size
    with open(tmp_path / "lst" / "list.txt", "a") as f:
        f.write("p0/1.png\t3\n")
    with pytest.raises(DataError, match=r"is 9x9 but .* is 8x8: a pack holds images of one size"):
        merge(str(tmp_path / "new" / "train"), specs, as_pack=True)
    assert not (tmp_path / "new").exists()


def test_mtl_data_merge_on_the_command_line(tmp_path, capsys):
    from mtl.cli import build_parser

    _three_sources(tmp_path)
    args = build_parser().parse_args(["data", "merge", str(tmp_path / "m" / "train"), f"lfw={tmp_path / 'lfw'}",
                                      str(tmp_path / "lst" / "list.txt")])  # the second named by its file: list
    assert args.func(args) == 0
    out = capsys.readouterr().out
    assert "wrote 17 images of 9 classes" in out and "the 9 people of 2 sources, 0 of them joined" in out, out
    assert json.load(open(tmp_path / "m" / "labels.json"))["label"][-1] == "list/p0"
