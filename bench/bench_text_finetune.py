"""Fine-tuning step of a pretrained encoder: the toolkit's step against a hand-written Paddle loop of the same math.

Both sides: all-MiniLM-L6-v2 (``backbone.pretrained: minilm``; ``--checkpoint FOLDER`` for another BERT folder, e.g.
the tests' MiniLM-shaped random one), a softmax tagger on each word's first piece (UPOS), mean cross-entropy over
the words, one backward, global-norm clipping at 1, AdamW (weight decay 0.01) with warm-up and linear decay, the
heads at lr and the encoder at lr x 0.1 x 0.9^(levels below the top) (``lr_mult``, ``layer_decay``: each parameter's
rate, which both sides' AdamW read). The toolkit side is ``Trainer.train_step`` (joint model, padding plumbing, head,
two-phase backward, gradient-sync hook, clipping); the hand-written side calls the same layers directly. Batches:
length-bucketed steps of the training file, the same for both, interleaved to share the machine's noise (each side
first every other step); dropout 0.1 on both. Printed: tokens per second of each (real pieces, padding not
counted), the ratio (target: at most 1.05) and the first step's loss of each (dropout off for that step).

    python bench/bench_text_finetune.py [--steps 20] [--batch 32] [--checkpoint FOLDER]
"""
import argparse
import os
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import paddle  # noqa: E402
import paddle.nn.functional as F  # noqa: E402
from tabulate import tabulate  # noqa: E402

from mtl.config.loading import load_job  # noqa: E402
from mtl.data.steps import StepDataset  # noqa: E402
from mtl.headkit.text import gather_words  # noqa: E402
from mtl.optimizer.joint import build_lr  # noqa: E402
from mtl.train.job import build_job  # noqa: E402
from mtl.train.trainer import Trainer  # noqa: E402

DATA = os.path.join(ROOT, "examples", "data", "text")
OPTIMIZER = {"type": "adamw", "lr": 0.001, "betas": [0.9, 0.999], "weight_decay": 0.01, "warmup_steps": 10,
             "decay": "linear", "clip_norm": 1.0, "lr_mult": {"backbone": 0.1}, "layer_decay": 0.9}


def job(batch, out, path, checkpoint, steps):
    return load_job(data={
        "seed": 0, "output_dir": out, "device": "cpu",
        "tasks": [{"name": "upos", "reader": {"type": "conllu", "target": "upos", "path": path},
                   "head": {"type": "tagger", "dropout": 0.1}, "eval": None}],
        "backbone": {"type": "bert", "pretrained": checkpoint, "dropout": 0.1, "attention_dropout": 0.1},
        "schedule": {"batch_size": batch, "steps": steps}, "optimizer": OPTIMIZER,
        "log": {"progress": False, "plot": False}, "data": {"num_workers": 0}})


def reference_step(model, batch, opt, sched):
    """The same math by hand: encoder, first pieces, linear, mean cross-entropy, backward, clip, AdamW, schedule."""
    sub = batch["upos"]
    sequence = model.backbone({"token_ids": sub["token_ids"], "segment_ids": sub["segment_ids"]})["sequence"]
    logits = model.heads["upos"].scorer(gather_words(sequence, sub["word_index"]))
    tags = sub["tags"]
    loss = F.cross_entropy(logits.reshape([-1, logits.shape[-1]]), tags.reshape([-1, 1]), ignore_index=-1,
                           reduction="sum") / paddle.clip((tags >= 0).sum().astype("float32"), min=1.0)
    loss.backward()
    opt.step()
    opt.clear_grad(set_to_zero=False)
    sched.step()
    return loss


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--checkpoint", default="minilm", help="a pretrained model name or BERT checkpoint folder")
    parser.add_argument("--path", default=os.path.join(DATA, "en_ewt-ud-train.conllu"))
    args = parser.parse_args()
    out = tempfile.mkdtemp(prefix="mtl_bench_finetune_")
    cfg = job(args.batch, out, args.path, args.checkpoint, args.steps + 1)
    toolkit, reference = build_job(cfg, announce_plan=False), build_job(cfg, announce_plan=False)
    reference.model.set_state_dict(toolkit.model.state_dict())
    trainer = Trainer(toolkit, console=lambda *a: None)
    sched = build_lr(cfg["optimizer"], args.steps + 1)
    opt = paddle.optimizer.AdamW(sched, beta1=0.9, beta2=0.999, parameters=reference.model.parameters(),
                                 weight_decay=0.01, grad_clip=paddle.nn.ClipGradByGlobalNorm(1.0))
    data = StepDataset(toolkit.schedule, {"upos": toolkit.task("upos").reader}, 0, 0, 50, bucket_batches=20)
    batches = [trainer.as_tensors(data[i]) for i in range(10)]
    tokens = [int((b["upos"]["token_ids"] != toolkit.backbone.tokenizer.pad_id).sum()) for b in batches]
    toolkit.model.eval()  # the first step without dropout: both sides' losses comparable
    reference.model.eval()
    first_toolkit = float(trainer.train_step(batches[0], 0).outputs["upos"].loss)
    first_reference = float(reference_step(reference.model, batches[0], opt, sched))
    toolkit.model.train()
    reference.model.train()
    tk, rf, counted = [], [], 0
    sides = [(tk, lambda b, i: trainer.train_step(b, i + 1)),
             (rf, lambda b, i: reference_step(reference.model, b, opt, sched))]
    for i in range(args.steps):  # interleaved, the same batch on both sides, each side first every other step
        b = batches[(i + 1) % len(batches)]
        for times, run in sides if i % 2 == 0 else sides[::-1]:
            t = time.perf_counter()
            run(b, i)
            times.append(time.perf_counter() - t)
        counted += tokens[(i + 1) % len(batches)]
    rate_tk, rate_rf = counted / sum(tk), counted / sum(rf)
    name = f"{args.checkpoint} fine-tuning step (UPOS tagger, batch {args.batch})"
    ratio = rate_rf / rate_tk
    print(tabulate([["hand-written Paddle loop", f"{rate_rf:.0f}", f"{sum(rf) / len(rf):.3f}", "1.000"],
                    ["mtl Trainer.train_step", f"{rate_tk:.0f}", f"{sum(tk) / len(tk):.3f}", f"{ratio:.3f}"]],
                   headers=[name, "tokens/s", "s/step", "time ratio"], tablefmt="github"))
    print(f"first-step loss: toolkit {first_toolkit:.6f}, hand-written {first_reference:.6f}")
    print(f"overhead ratio {ratio:.3f} (target <= 1.05)")


if __name__ == "__main__":
    main()
