"""The MiniLM text recipes of examples/configs/ (text_ewt_minilm.yaml and its masked-LM variant) load as written,
with a random MiniLM-shaped checkpoint in place of the cache that `mtl pretrained fetch minilm` fills (make test
downloads nothing), and give the sub-batches their comments state: 32 sentences for each of the five main tasks on
one encoder pass (schedule.same_rows), and for the variant 8 for masked LM on rows and a pass of its own."""
import os

from mtl.config.checks import own_rows
from mtl.config.loading import load_job
from mtl.data.scheduler import build_schedule
from tests.dist_util import ROOT
from tests.minilm_shaped import write_checkpoint

CONFIGS = os.path.join(ROOT, "examples", "configs")
MAIN = ["upos", "xpos", "deps", "ner", "genre"]


def schedule_of(name, checkpoint):
    cfg = load_job(os.path.join(CONFIGS, name), [f"backbone.pretrained={checkpoint}"])
    return cfg, build_schedule(cfg["schedule"], cfg["tasks"], [12544] * len(cfg["tasks"]), cfg["seed"],
                               cfg["source"], own_rows(cfg["tasks"]))


def test_the_minilm_recipes_load_and_split_their_step_as_stated(tmp_path):
    checkpoint = write_checkpoint(str(tmp_path / "ckpt"))
    cfg, schedule = schedule_of("text_ewt_minilm.yaml", checkpoint)
    assert schedule.sizes == dict.fromkeys(MAIN, 32) and schedule.row_sharing() == MAIN
    assert cfg["schedule"]["steps"] == 2000 and cfg["backbone"]["type"] == "bert"
    cfg, schedule = schedule_of("text_ewt_minilm_mlm.yaml", checkpoint)
    assert schedule.sizes == {**dict.fromkeys(MAIN, 32), "mlm": 8}
    assert schedule.row_sharing() == MAIN and schedule.own_rows == ["mlm"] and schedule.order_key("mlm") == "mlm"
    mlm = cfg["tasks"][-1]
    assert os.path.isfile(mlm["reader"]["source"]["path"]) and mlm["loss_weight"] == 0.1
