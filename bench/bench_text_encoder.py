"""Tokens per second of the text encoder's training step: the toolkit's step against a hand-written Paddle loop of
the same encoder and head on the same batches.

Both sides: the EWT recipe's BiLSTM encoder (``text_bilstm``, piece embeddings, 2 BiLSTM layers), a softmax tagger
on each word's first piece (UPOS), mean cross-entropy over the words, one backward, AdamW with gradient clipping.
The toolkit side goes through ``Trainer.train_step`` (joint model with its padding/length plumbing, the tagger head,
two-phase backward, gradient-sync hook, global-norm clipping); the hand-written side calls the same layers directly.
Batches: length-bucketed steps of the training file, the same for both, interleaved to share the machine's noise.
Printed: tokens per second of each (real pieces, padding not counted) and the ratio (target: at most 1.05).

    python bench/bench_text_encoder.py [--steps 20] [--batch 64] [--hidden 128]
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
from mtl.train.job import build_job  # noqa: E402
from mtl.train.trainer import Trainer  # noqa: E402

DATA = os.path.join(ROOT, "examples", "data", "text")


def job(batch, hidden, out, path):
    return load_job(data={
        "seed": 0, "output_dir": out, "device": "cpu",
        "tasks": [{"name": "upos", "reader": {"type": "conllu", "target": "upos", "path": path},
                   "head": {"type": "tagger", "dropout": 0.0}, "eval": None}],
        "backbone": {"type": "text_bilstm", "tokenizer": os.path.join(DATA, "ewt_wordpiece_8k.json"),
                     "hidden_size": hidden, "dropout": 0.0, "embedding_dropout": 0.0},
        "schedule": {"batch_size": batch, "steps": 1000},
        "optimizer": {"type": "adamw", "lr": 0.002, "weight_decay": 0.0, "decay": "none", "clip_norm": 5.0},
        "log": {"progress": False, "plot": False}, "data": {"num_workers": 0}})


def reference_step(model, batch, opt):
    """The same math by hand: encoder, first pieces, linear, mean cross-entropy, backward, clip, AdamW."""
    sub = batch["upos"]
    sequence = model.backbone({"token_ids": sub["token_ids"], "segment_ids": sub["segment_ids"]})["sequence"]
    logits = model.heads["upos"].scorer(gather_words(sequence, sub["word_index"]))
    tags = sub["tags"]
    loss = F.cross_entropy(logits.reshape([-1, logits.shape[-1]]), tags.reshape([-1, 1]), ignore_index=-1,
                           reduction="sum") / paddle.clip((tags >= 0).sum().astype("float32"), min=1.0)
    loss.backward()
    opt.step()
    opt.clear_grad(set_to_zero=False)
    return loss


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--path", default=os.path.join(DATA, "en_ewt-ud-train.conllu"))
    args = parser.parse_args()
    out = tempfile.mkdtemp(prefix="mtl_bench_text_")
    toolkit = build_job(job(args.batch, args.hidden, out, args.path), announce_plan=False)
    reference = build_job(job(args.batch, args.hidden, out, args.path), announce_plan=False)
    reference.model.set_state_dict(toolkit.model.state_dict())
    trainer = Trainer(toolkit, console=lambda *a: None)
    opt = paddle.optimizer.AdamW(0.002, parameters=reference.model.parameters(), weight_decay=0.0,
                                 grad_clip=paddle.nn.ClipGradByGlobalNorm(5.0))
    data = StepDataset(toolkit.schedule, {"upos": toolkit.task("upos").reader}, 0, 0, 50, bucket_batches=20)
    batches = [trainer.as_tensors(data[i]) for i in range(10)]
    tokens = [int((b["upos"]["token_ids"] != 0).sum()) for b in batches]
    toolkit.model.train()
    reference.model.train()
    first_toolkit = float(trainer.train_step(batches[0], 0).outputs["upos"].loss)
    first_reference = float(reference_step(reference.model, batches[0], opt))
    tk, rf, counted = [], [], 0
    for i in range(args.steps):  # interleaved, the same batch on both sides
        b = batches[(i + 1) % len(batches)]
        t = time.perf_counter()
        trainer.train_step(b, i + 1)
        tk.append(time.perf_counter() - t)
        t = time.perf_counter()
        reference_step(reference.model, b, opt)
        rf.append(time.perf_counter() - t)
        counted += tokens[(i + 1) % len(batches)]
    rate_tk, rate_rf = counted / sum(tk), counted / sum(rf)
    print(tabulate([["hand-written Paddle loop", f"{rate_rf:.0f}", "1.000"],
                    ["mtl Trainer.train_step", f"{rate_tk:.0f}", f"{rate_rf / rate_tk:.3f}"]],
                   headers=[f"BiLSTM tagger step (batch {args.batch}, hidden {args.hidden})", "tokens/s",
                            "time ratio"], tablefmt="github"))
    print(f"first-step loss: toolkit {first_toolkit:.6f}, hand-written {first_reference:.6f}")
    print(f"overhead ratio {rate_rf / rate_tk:.3f} (target <= 1.05)")


if __name__ == "__main__":
    main()
