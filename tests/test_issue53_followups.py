"""Issue 53, the reviewer's open problems after the first round, each reproduced first.

1. A merged head's ``same_person`` reads a same-person file as cross-head negatives do: people by name (``name_x``)
   and by the dataset's label (``label_x``, as ``mtl overlap --json`` writes them), each task of the pairs mapped to
   the ``concat`` reader's source its offset names, with that source's held-out people; only what is truly
   ambiguous is refused.
2. A training run's verification sets (``eval.sets``) too small for their folds are said so once, at start-up.
3. Every training (``mtl train``, ``mtl compare``'s runs, a Trainer made directly) decodes the evaluation images
   before it starts, once.
4. Counts are declared (``COUNT_METRICS``), not guessed from a whole value: 2.0 of an RMSE is ``2.0000``, a count of
   1 is ``1``.
5. ``mtl/core/registry.py`` split along its seam (finding plug-in files apart), every import path kept.
6. One union-find, one safetensors test, one TSV reading.
"""
import json

import numpy as np
import pytest

from mtl.core.errors import ConfigError
from tests.same_person_jobs import SAME, finished_run, head_ids_by_hand, named_job, pairs_by

# ---- 1. a merged head's same_person reads people by name and by the dataset's label -------------------------------
OFFSETS = {"teamA": 0, "teamB": 3}  # teamA trains on 3 people (ann and cid held out), teamB's come after them


def _merged_job(tmp_path, pairs, offsets=OFFSETS, sources=None, shared=False):
    """One task whose arcface head is merged over a concat reader of teamA's and teamB's lists (each source with its
    own holdout_classes), ``same_person`` the pairs (a file path or the list); the loaded config."""
    from mtl.config.loading import load_job

    named_job(tmp_path)  # writes teamA/ and teamB/ with their lists
    lists = {task: str(tmp_path / task / "list.txt") for task in ("teamA", "teamB")}
    default = [{"type": "image_list", "list": lists["teamA"], "image_size": 8, "holdout_classes": ["ann", "cid"]},
               {"type": "image_list", "list": lists["teamB"], "image_size": 8}]
    reader = {"type": "concat", "readers": sources or default, "shared_labels": shared}
    head = {"type": "arcface", "scale": 8.0, "same_person": {"pairs": pairs, "offsets": offsets}}
    job = {"seed": 0, "device": "cpu", "output_dir": str(tmp_path / "merged"),
           "tasks": [{"name": "merged", "reader": reader, "head": head, "eval": None}],
           "backbone": {"type": "mlp", "input_shape": [3, 8, 8], "hidden": [], "embedding_size": 8},
           "schedule": {"batch_size": 4, "steps": 1}, "log": {"progress": False, "plot": False},
           "data": {"num_workers": 0}}
    (tmp_path / "merged.yaml").write_text(json.dumps(job))
    return load_job(str(tmp_path / "merged.yaml"))


def _masked(tmp_path, pairs, **kw):
    """The merged head's same-person class pairs (both directions), sorted."""
    from mtl.train.job import build_job

    head = build_job(_merged_job(tmp_path, pairs, **kw), announce_plan=False).tasks[0].head
    return sorted(map(tuple, head.filtering.pairs.tolist()))


def _by_hand():
    """The merged head's pairs computed by hand: teamA's people renumbered without ann and cid, teamB's after them."""
    a, b = head_ids_by_hand("teamA"), head_ids_by_hand("teamB")
    one_way = [(OFFSETS["teamA"] + a[x], OFFSETS["teamB"] + b[y]) for x, y in SAME]
    return sorted(one_way + [(j, i) for i, j in one_way])


def test_a_merged_head_masks_the_people_mtl_overlap_json_names(tmp_path):
    from mtl.studies.overlap import report

    run, out = finished_run(tmp_path), str(tmp_path / "overlap.json")
    report(run, centres=True, threshold=0.9, json_path=out)
    written = json.load(open(out))
    assert written and all("name_a" in m and "label_a" in m and "class_a" not in m for m in written)
    assert _by_hand() == [(0, 3), (1, 5), (2, 4), (3, 0), (4, 2), (5, 1)]  # bob-amy, dan-dan, eve-eve
    assert _masked(tmp_path, out) == _by_hand()


@pytest.mark.parametrize("key_a, key_b", [("name", "name"), ("label", "label"), ("name", "label"),
                                          ("class", "label")])
def test_a_merged_head_reads_pairs_by_name_and_by_the_datasets_label_as_cross_negatives_do(tmp_path, key_a, key_b):
    pairs = pairs_by(key_a, key_b)
    path = tmp_path / "pairs.json"
    path.write_text(json.dumps(pairs))
    assert _masked(tmp_path, str(path)) == _by_hand()
    assert _masked(tmp_path, pairs) == _by_hand()  # a list in the config reads alike


@pytest.mark.parametrize("pair, offsets, words", [
    ({"task_a": "teamA", "name_a": "cid", "task_b": "teamB", "name_b": "dan"}, OFFSETS,
     "pairs[0]: the person of task 'teamA' is label 2, a person held out of training"),
    ({"task_a": "teamA", "class_a": 2, "task_b": "teamB", "name_b": "dan"}, OFFSETS,
     "gives only class_a 2, and this head numbers its people otherwise"),
    ({"task_a": "teamA", "name_a": "eve", "task_b": "teamB", "name_b": "eve"}, {"teamA": 0, "teamB": 2},
     "the person of task 'teamB' is given by name or dataset label, but no source of this head's reader starts at "
     "its offset 2 (they start at 0, 3)"),
])
def test_what_names_nobody_of_its_source_is_refused_naming_the_entry(tmp_path, pair, offsets, words):
    from mtl.train.job import build_job

    with pytest.raises(ConfigError) as info:
        build_job(_merged_job(tmp_path, [pair], offsets=offsets), announce_plan=False)
    assert words in str(info.value) and len(str(info.value).splitlines()) == 1, str(info.value)


def test_sources_sharing_one_label_space_are_refused_only_where_they_disagree(tmp_path):
    """shared_labels: both sources start at class 0. teamA's list read twice with ann and cid held out numbers its
    people alike (eve is class 2 in both); held out in one source only, eve is class 2 in one and 4 in the other."""
    from mtl.train.job import build_job

    named_job(tmp_path)
    a_list = str(tmp_path / "teamA" / "list.txt")
    held = {"type": "image_list", "list": a_list, "image_size": 8, "holdout_classes": ["ann", "cid"]}
    pair = [{"task_a": "one", "name_a": "eve", "task_b": "two", "name_b": "bob"}]
    alike = _masked(tmp_path, pair, offsets={"one": 0, "two": 0}, sources=[held, held], shared=True)
    assert alike == [(0, 2), (2, 0)]  # bob is class 0, eve class 2 (ann and cid held out)
    every = {"type": "image_list", "list": a_list, "image_size": 8}
    with pytest.raises(ConfigError) as info:
        build_job(_merged_job(tmp_path, pair, offsets={"one": 0, "two": 0}, sources=[held, every], shared=True),
                  announce_plan=False)
    assert "the person of task 'one' is ambiguous" in str(info.value), str(info.value)
    assert "class 2 of source 0; class 4 of source 1" in str(info.value), str(info.value)


def test_a_head_built_alone_still_reads_class_numbers_and_refuses_names():
    from mtl.core.errors import ParameterError
    from mtl.headkit.filtering import same_person_pairs

    found = same_person_pairs({"pairs": [{"task_a": "a", "class_a": 1, "task_b": "b", "class_b": 2}],
                               "offsets": {"a": 0, "b": 5}}, 10)
    assert found.tolist() == [[1, 7], [7, 1]]
    with pytest.raises(ParameterError, match="built without its reader's people"):
        same_person_pairs({"pairs": [{"task_a": "a", "name_a": "eve", "task_b": "b", "class_b": 2}],
                           "offsets": {"a": 0, "b": 5}}, 10)
    assert np.array_equal(found, np.array([[1, 7], [7, 1]]))


# ---- 3. every training checks the evaluation images before it starts, once ---------------------------------------
def _bad_held_out_image(tmp_path, out="run"):
    """A face job whose held-out person c has an image that cannot be decoded; the loaded config."""
    from mtl.config.loading import load_job
    from tests.face_folders import GARBAGE, face_folder, face_job

    list_path = face_folder(str(tmp_path / "faces"))
    (tmp_path / "faces" / "c" / "1.png").write_bytes(GARBAGE)
    return load_job(data=face_job(tmp_path / out, list_path))


CHECKED = "task 'faces': its evaluation split (checked before training"


def test_a_trainer_made_directly_checks_the_evaluation_images_before_anything_is_written(tmp_path):
    from mtl.core.errors import DataError
    from mtl.train.job import build_job
    from mtl.train.trainer import Trainer

    job = build_job(_bad_held_out_image(tmp_path), announce_plan=False)
    with pytest.raises(DataError) as info:
        Trainer(job, console=lambda *a: None)
    assert info.value.bare_message.startswith(CHECKED) and "line 10 ('c/1.png')" in str(info.value), str(info.value)
    assert not (tmp_path / "run").exists()


def test_mtl_compares_baseline_runs_check_the_evaluation_images_before_training(tmp_path):
    from mtl.core.errors import DataError
    from mtl.studies.comparison import run_baselines

    lines = []
    with pytest.raises(DataError) as info:
        run_baselines(_bad_held_out_image(tmp_path, out="base"), console=lines.append)
    assert info.value.bare_message.startswith(CHECKED), str(info.value)
    assert lines == [f"joint job: training in {tmp_path / 'base'}"] and not list(tmp_path.glob("**/checkpoints"))


def test_mtl_train_decodes_the_evaluation_images_once_before_training(tmp_path, capsys, monkeypatch):
    import yaml

    from mtl.readers._face import FaceImageReader
    from tests.cli_run import cli
    from tests.face_folders import face_folder, face_job

    checks = []
    original = FaceImageReader.check_samples
    monkeypatch.setattr(FaceImageReader, "check_samples", lambda self, count: checks.append(count) or
                        original(self, count))
    config = tmp_path / "job.yaml"
    config.write_text(yaml.safe_dump(face_job(tmp_path / "run", face_folder(str(tmp_path / "faces")), steps=1)))
    code, err = cli(["train", config], capsys)
    assert code == 0, err
    assert checks == [8]  # the 8 images of the held-out people c and d, read once


# ---- 2. a training-time verification set too small for its folds is said so at start-up, once ---------------------
def _pairs_list(path, same, different):
    """A pairs list of ``same`` same-person and ``different`` different-person pairs of face_folder's images."""
    people = "abcd"
    lines = [f"{people[k % 4]}/0.png\t{people[k % 4]}/{1 + k % 3}.png\t1" for k in range(same)]
    lines += [f"{people[k % 4]}/0.png\t{people[(k + 1) % 4]}/{k % 4}.png\t0" for k in range(different)]
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_a_small_verification_set_of_a_training_run_is_warned_about_once_on_the_console_and_in_the_log(tmp_path):
    from mtl.config.loading import load_job
    from mtl.train.job import build_job
    from mtl.train.trainer import Trainer
    from tests.face_folders import face_folder, face_job

    face_folder(str(tmp_path / "faces"))
    small = _pairs_list(tmp_path / "faces" / "small.txt", 2, 3)
    large = _pairs_list(tmp_path / "faces" / "large.txt", 20, 20)
    cfg = face_job(tmp_path / "run", str(tmp_path / "faces" / "list.txt"), steps=2)
    cfg["tasks"][0]["eval"] = {"sets": [small, large]}
    cfg["eval"] = {"every": 1}  # an evaluation after step 1 and the final one: the warning is still said once
    lines = []
    Trainer(build_job(load_job(data=cfg), announce_plan=False), console=lines.append).run()
    expected = (f"task 'faces': verification set '{small}': warning: 2 same-person and 3 different-person pairs: with "
                "fewer than 20 of either kind the 5 folds are too small for the accuracy and its std to mean much; "
                "add pairs")
    assert [line for line in lines if "too small" in line] == [expected], lines
    log_text = (tmp_path / "run" / "logs" / "rank0.log").read_text()
    assert log_text.count("too small") == 1 and expected in log_text, log_text
    evaluated = json.loads((tmp_path / "run" / "summary.json").read_text())["tasks"]["faces"]["eval"]
    assert {"small/accuracy", "large/accuracy"} <= set(evaluated), evaluated  # both sets were scored


# ---- 4. counts are declared, not guessed from the value ----------------------------------------------------------
def test_a_count_prints_whole_whatever_its_value_and_anything_else_keeps_four_digits():
    from mtl.studies.comparison import baseline_table
    from mtl.train.reporting import format_value, metrics_table

    assert format_value(1.0, "verification_pairs") == "1" and format_value(630.0, "identification_probes") == "630"
    assert format_value(2.0, "rmse") == "2.0000" and format_value(2.0, "verification_threshold") == "2.0000"
    assert format_value(2.0, "lfw/threshold") == "2.0000" and format_value(3.0) == "3.0000"
    table = metrics_table({"t": {"head": "regression", "loss_start": 2.0, "loss_end": 1.0, "primary_metric": "rmse",
                                 "higher_is_better": False,
                                 "eval": {"rmse": 2.0, "mae": 1.5, "identification_gallery": 1.0}}})
    rows = {line.split("|")[4].strip(" *↓"): line.split("|")[5].strip() for line in table.splitlines()[2:]}
    assert rows == {"rmse": "2.0000", "mae": "1.5000", "identification_gallery": "1"}, table
    shown = baseline_table({"tasks": {"t": {"metric": "rmse", "higher_is_better": False, "joint": 2.0,
                                            "single": 4.0}}, "delta_m": 100.0})
    assert "| 2.0000 " in shown and "| 4.0000 " in shown, shown


def test_the_declared_counts_are_the_counts_the_evaluations_report():
    """Every count the held-out people's evaluation reports (pairs, gallery people, probes) is declared, and nothing
    else is."""
    from mtl.evaluation.identification import identification_metrics
    from mtl.evaluation.metrics import COUNT_METRICS
    from mtl.evaluation.pairs import open_set_verification

    labels = np.repeat(np.arange(4), 3)
    features = np.random.default_rng(0).standard_normal((len(labels), 4))
    reported = {**open_set_verification(features, labels), **identification_metrics(features, labels)}
    counts = {"verification_pairs": 24, "identification_gallery": 4, "identification_probes": 8}
    assert {name: reported[name] for name in counts} == counts  # 4 x C(3, 2) same-person pairs + as many others
    assert COUNT_METRICS == set(counts)


# ---- 5. the registry split along its seam: finding plug-in files apart from registering and building ----------------
def test_the_registry_is_under_400_lines_and_every_name_others_use_is_still_importable_from_it():
    import ast
    import os

    import mtl.core.plugin_loading as loading
    from mtl.core import registry

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(root, "mtl", "core", "registry.py")) as f:
        assert len(f.read().splitlines()) <= 400
    with open(os.path.join(root, "mtl", "core", "plugin_loading.py")) as f:  # the lower piece: never the registry
        tree = ast.parse(f.read())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)} | \
        {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert "mtl.core.registry" not in imported and "mtl" not in imported, imported
    for name in ("load_builtin", "load_folder", "load_file", "load_all", "load_entry_points", "import_error",
                 "builtin_heads_folder"):
        assert getattr(registry, name) is getattr(loading, name)
    for name in ("register", "register_reader", "register_backbone", "register_head", "register_weighting",
                 "register_architecture", "plugin_class", "did_you_mean", "get", "build", "split_cfg", "entries",
                 "as_component", "origin_of", "first_sentence", "parameters", "documented_parameters", "Parameter",
                 "find", "KINDS", "CONTEXT_KEYS", "CONTEXT_MEANINGS", "ENTRY_POINT_GROUP"):
        assert hasattr(registry, name), name


# ---- 6. one implementation of each: union-find, safetensors detection, reading a TSV file --------------------------
def _components(nodes, joins):
    """The groups of ``nodes`` joined by ``joins``, by brute force: grow each group until nothing changes."""
    groups = [{node} for node in nodes]
    changed = True
    while changed:
        changed = False
        for a, b in joins:
            ga, gb = next(g for g in groups if a in g), next(g for g in groups if b in g)
            if ga is not gb:
                groups.remove(gb)
                ga |= gb
                changed = True
    return groups


def test_union_find_groups_as_a_brute_force_count_and_both_its_users_go_through_it(monkeypatch):
    from mtl.core.union_find import DisjointSets
    from mtl.evaluation.held_out import pool_people
    from mtl.writers.merge import Source, joined_classes

    rng = np.random.default_rng(3)
    nodes = list(range(40))
    joins = [tuple(int(v) for v in rng.choice(40, 2, replace=False)) for _ in range(25)]
    groups = DisjointSets(nodes)
    for a, b in joins:
        groups.union(a, b)
    expected = _components(nodes, joins)
    assert sorted(sorted(g) for g in expected) == sorted(
        sorted(n for n in nodes if groups.find(n) == root) for root in {groups.find(n) for n in nodes})
    assert all(groups.find(n) == min(g) for g in expected for n in g)  # a group's root is its smallest node

    calls = []
    original = DisjointSets.union
    monkeypatch.setattr(DisjointSets, "union", lambda self, a, b: calls.append((a, b)) or original(self, a, b))
    sources = [Source(name, "", np.array(labels), 3, None, None, None) for name, labels in
               (("x", [0, 1, 2]), ("y", [0, 1, 2]))]
    classes = joined_classes(sources, [((0, 1), (1, 2)), ((1, 0), (0, 2))])
    assert [c.tolist() for c in classes] == [[0, 1, 2], [2, 3, 1]] and len(calls) == 2
    features = np.eye(4)
    pooled = pool_people({"a": (features[:2], [0, 1]), "b": (features[2:], [0, 0])},
                         {"a": ["p.png", "q.png"], "b": ["q.png", "r.png"]})  # q.png: a's person 1 is b's 0
    assert pooled.labels.tolist() == [0, 1, 1] and pooled.shared_images == 1 and len(calls) == 3


def test_one_safetensors_test_for_the_reader_and_for_what_a_file_is_instead_of_a_pickle(tmp_path):
    import struct

    from mtl.convert import safetensors_file
    from mtl.core.errors import DataError
    from mtl.core.file_kinds import looks_like_safetensors, not_a_pickle

    assert safetensors_file.looks_like_safetensors is looks_like_safetensors
    header = b'{"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}'
    real = tmp_path / "real.safetensors"
    real.write_bytes(struct.pack("<Q", len(header)) + header + struct.pack("<f", 1.5))
    assert safetensors_file.read_safetensors(str(real))["w"].tolist() == [1.5]
    assert "is a safetensors file" in str(not_a_pickle(str(real)))
    absurd = tmp_path / "absurd.bin"  # a '{' at byte 8 after a length no safetensors file has (2**40 bytes)
    absurd.write_bytes(struct.pack("<Q", 1 << 40) + b"{" + bytes(range(200)))
    with pytest.raises(DataError, match=f"'{absurd}' is not a safetensors file"):
        safetensors_file.read_safetensors(str(absurd))
    assert "safetensors" not in str(not_a_pickle(str(absurd)))


def test_tokenizer_train_reads_a_tsv_file_as_the_tsv_readers_do(tmp_path, capsys):
    from mtl.commands.tokenizer import tsv_texts
    from mtl.readers.text_pairs import read_tsv
    from tests.cli_run import cli

    good = tmp_path / "good.tsv"
    good.write_text("text_a\tlabel\ttext_b\n quiet harbour \tx\tbright lantern\n\nstill\ty\t\n")
    expected = [cell.strip() for _, row in read_tsv(str(good), ["text_a", "text_b"])
                for cell in (row["text_a"], row["text_b"]) if cell.strip()]
    assert tsv_texts(str(good)) == expected == ["quiet harbour", "bright lantern", "still"]
    ragged = tmp_path / "ragged.tsv"  # line 3 has one cell too few: the readers refuse it, so does the tokenizer
    ragged.write_text("text_a\ttext_b\tlabel\nquiet harbour\tbright lantern\tx\nstill water\ty\n")
    code, err = cli(["tokenizer", "train", "--tsv", ragged, "-o", tmp_path / "t.json"], capsys)
    assert code == 2 and f"TSV file '{ragged}' line 3: 2 cells, the header names 3" in err, err
