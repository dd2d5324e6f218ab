"""``base:`` in a job config: a variant states only what differs from another config."""
import os

import pytest
import yaml

from mtl.config.loading import load_job
from mtl.core.errors import ConfigError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIX = os.path.join(ROOT, "examples", "configs", "faces_six.yaml")


def test_a_variant_merges_its_keys_over_its_base_and_keeps_the_bases_task_paths(tmp_path):
    variant = tmp_path / "elsewhere" / "variant.yaml"
    variant.parent.mkdir()
    variant.write_text(yaml.safe_dump({"base": os.path.relpath(SIX, variant.parent), "seed": 7,
                                       "schedule": {"steps": 5}, "backbone": {"input_size": 24}}))
    base, ours = load_job(SIX), load_job(str(variant))
    raw = yaml.safe_load(open(SIX))
    assert ours["seed"] == 7 and ours["schedule"]["steps"] == 5
    assert ours["schedule"]["batch_size"] == raw["schedule"]["batch_size"]  # merged key by key
    assert ours["backbone"]["input_size"] == 24 and ours["backbone"]["channels"] == raw["backbone"]["channels"]
    assert [t["source"] for t in ours["tasks"]] == [t["source"] for t in base["tasks"]]  # found from the base's folder
    assert "base" not in ours or ours["base"] is None


def test_a_bad_base_is_one_sentence(tmp_path):
    loop = tmp_path / "a.yaml"
    loop.write_text("base: b.yaml\n")
    (tmp_path / "b.yaml").write_text("base: a.yaml\n")
    with pytest.raises(ConfigError, match="loop"):
        load_job(str(loop))
    missing = tmp_path / "c.yaml"
    missing.write_text("base: nope.yaml\n")
    with pytest.raises(ConfigError, match="base config 'nope.yaml' does not exist") as err:
        load_job(str(missing))
    assert "c.yaml" in str(err.value) and "base" in str(err.value)


def _chain(tmp_path, base_extra, variant_extra):
    """A copy of faces_six.yaml with ``base_extra`` merged in, and a variant of it giving ``variant_extra``."""
    raw = yaml.safe_load(open(SIX))
    raw["tasks"] = [os.path.join(os.path.dirname(SIX), t) for t in raw["tasks"]]
    for section, values in base_extra.items():
        raw.setdefault(section, {}).update(values)
    base, variant = tmp_path / "base.yaml", tmp_path / "variant.yaml"
    base.write_text(yaml.safe_dump(raw))
    variant.write_text(yaml.safe_dump({"base": "base.yaml", **variant_extra}))
    return str(base), str(variant)


def test_an_error_in_a_key_the_base_gave_says_which_base_gave_it(tmp_path):
    base, variant = _chain(tmp_path, {"schedule": {"batch_size": -3}}, {"seed": 3, "schedule": {"mode": "joint"}})
    with pytest.raises(ConfigError) as err:
        load_job(variant)
    assert err.value.source == variant and err.value.key == "schedule.batch_size"  # the job that failed to load
    assert err.value.bare_message == f"must be >= 1, got -3 (the value comes from {base}, which variant.yaml is " \
                                     "based on)"
    further = tmp_path / "further.yaml"  # the base of a base is still the file that gave the key
    further.write_text("base: variant.yaml\nseed: 4\n")
    with pytest.raises(ConfigError) as err:
        load_job(str(further))
    assert err.value.source == str(further) and f"comes from {base}, which further.yaml" in str(err.value)


def test_a_conflict_between_a_variants_key_and_its_bases_names_the_variant_and_where_the_value_came_from(tmp_path):
    base, variant = _chain(tmp_path, {"weighting": {"type": "dwa", "temperature": 2.0}},
                           {"weighting": {"type": "uncertainty"}})
    with pytest.raises(ConfigError, match="temperature") as err:
        load_job(variant)
    assert err.value.source == variant and f"(the value comes from {base}" in str(err.value)


def test_an_error_in_a_key_the_variant_or_set_gave_names_them(tmp_path):
    _, variant = _chain(tmp_path, {"schedule": {"batch_size": -3}}, {"schedule": {"batch_size": -4}})
    with pytest.raises(ConfigError) as err:
        load_job(variant)
    assert err.value.source == variant and err.value.bare_message == "must be >= 1, got -4"
    _, variant = _chain(tmp_path, {}, {"seed": 3})
    with pytest.raises(ConfigError) as err:
        load_job(variant, ["schedule.batch_size=-5"])
    assert err.value.source == f"{variant} (with --set)" and err.value.bare_message == "must be >= 1, got -5"
    _, variant = _chain(tmp_path, {"schedule": {"batch_size": -3}}, {"schedule": 7})  # the variant replaced it all
    with pytest.raises(ConfigError) as err:
        load_job(variant)
    assert err.value.source == variant and err.value.key == "schedule" and "comes from" not in str(err.value)


def test_a_set_replacing_a_mapping_or_a_tasks_key_is_the_sets_not_the_bases(tmp_path):
    _, variant = _chain(tmp_path, {"averaging": {"type": "ema", "decay": 0.9}}, {"seed": 3})
    with pytest.raises(ConfigError) as err:  # the base's decay is gone: the --set gave the whole mapping
        load_job(variant, ["averaging={type: window}"])
    assert err.value.source == f"{variant} (with --set)" and "comes from" not in str(err.value)
    raw = yaml.safe_load(open(SIX))
    inline = {"name": "inl", "reader": {"type": "digits", "classes": [0, 1, 2], "samples": "even"},
              "head": {"type": "softmax"}}
    (tmp_path / "inline.yaml").write_text(yaml.safe_dump({**raw, "tasks": [inline]}))
    (tmp_path / "on_inline.yaml").write_text("base: inline.yaml\nseed: 3\n")
    with pytest.raises(ConfigError) as err:  # a task of the base's, inline, changed by --set tasks.0.*
        load_job(str(tmp_path / "on_inline.yaml"), ["tasks.0.ratio=-1"])
    assert "comes from" not in str(err.value) and "-1" in str(err.value)


def test_the_told_error_keeps_its_kind_and_fields():
    from mtl.config.yaml_files import name_the_base
    from mtl.readers.base import MissingFile

    exc = MissingFile("/nowhere/x.bin", "weights file", key="backbone.weights")
    told = name_the_base(exc, {("backbone",): "/a/base.yaml"}, "/a/variant.yaml")
    assert type(told) is MissingFile and told.path == "/nowhere/x.bin" and told.key == "backbone.weights"
    assert str(told).startswith("backbone.weights: weights file '/nowhere/x.bin' does not exist")
    assert str(told).endswith("(the value comes from /a/base.yaml, which variant.yaml is based on)")
    assert name_the_base(exc, {("backbone",): "--set"}, "/a/variant.yaml") is exc
    assert name_the_base(exc, {("seed",): "/a/base.yaml"}, "/a/variant.yaml") is exc
