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
