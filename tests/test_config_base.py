"""``base:`` in a job config: a variant states only what differs from another config."""
import os

import pytest
import yaml

from mtl.config.loading import load_job
from mtl.errors import ConfigError

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


def test_an_error_in_a_key_the_base_gave_names_the_base_not_the_variant(tmp_path):
    base, variant = _chain(tmp_path, {"schedule": {"batch_size": -3}}, {"seed": 3, "schedule": {"mode": "joint"}})
    with pytest.raises(ConfigError) as err:
        load_job(variant)
    assert err.value.source == f"{base} (base of {variant})" and err.value.key == "schedule.batch_size"
    assert "-3" in str(err.value)
    further = tmp_path / "further.yaml"  # the base of a base is still the file that gave the key
    further.write_text("base: variant.yaml\nseed: 4\n")
    with pytest.raises(ConfigError) as err:
        load_job(str(further))
    assert err.value.source == f"{base} (base of {further})"


def test_an_error_in_a_key_the_variant_or_set_gave_names_them(tmp_path):
    _, variant = _chain(tmp_path, {"schedule": {"batch_size": -3}}, {"schedule": {"batch_size": -4}})
    with pytest.raises(ConfigError) as err:
        load_job(variant)
    assert err.value.source == variant and "-4" in str(err.value)
    _, variant = _chain(tmp_path, {}, {"seed": 3})
    with pytest.raises(ConfigError) as err:
        load_job(variant, ["schedule.batch_size=-5"])
    assert err.value.source == f"{variant} (with --set)" and "-5" in str(err.value)
    _, variant = _chain(tmp_path, {"schedule": {"batch_size": -3}}, {"schedule": 7})  # the variant replaced it all
    with pytest.raises(ConfigError) as err:
        load_job(variant)
    assert err.value.source == variant and err.value.key == "schedule"


def test_the_moved_error_keeps_its_kind_and_fields():
    from mtl.config.loading import blame_base
    from mtl.readers.base import MissingFile

    exc = MissingFile("/nowhere/x.bin", "weights file", key="backbone.weights")
    moved = blame_base(exc, {("backbone",): "/a/base.yaml"}, "/a/variant.yaml")
    assert type(moved) is MissingFile and moved.path == "/nowhere/x.bin" and moved.key == "backbone.weights"
    assert str(moved).startswith("/a/base.yaml (base of /a/variant.yaml): backbone.weights: weights file")
    assert blame_base(exc, {("backbone",): "--set"}, "/a/variant.yaml") is exc
    assert blame_base(exc, {("seed",): "/a/base.yaml"}, "/a/variant.yaml") is exc
