"""Fine-tuning a pretrained encoder on text tasks (issue 54 items 2 and 3), on a small random BERT in
all-MiniLM-L6-v2's layout (tests/minilm_shaped.py): the checkpoint's own tokenizer (a tokenizer.json's fixed
truncation and padding switched off; kept with the run), first-piece pooling against a loop over the words,
warm-up + linear decay against BERT's formula, the encoder's lower rate and layer-wise decay against a hand table
and Adam's first step, and the loss of a length-bucketed joint batch against every sentence run alone."""
import json
import os

import numpy as np
import paddle
import pytest

from mtl.config.loading import load_job
from mtl.core.errors import ConfigError
from mtl.train.job import build_job
from tests.minilm_shaped import write_checkpoint

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JOB = os.path.join(ROOT, "tests", "dist_scripts", "text_minilm_job.yaml")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_checkpoint(str(tmp_path_factory.mktemp("minilm_shaped") / "ckpt"))


def job_config(checkpoint, out, *sets):
    return load_job(JOB, [f"backbone.pretrained={checkpoint}", f"output_dir={out}", *sets])


def test_a_tokenizer_json_with_truncation_and_padding_keeps_every_piece(tmp_path):
    import tokenizers

    from mtl.text.tokenizer import TextTokenizer, read_vocab

    vocab = read_vocab(os.path.join(ROOT, "tests", "fixtures", "bert_tiny", "vocab.txt"))
    model = tokenizers.Tokenizer(tokenizers.models.WordPiece({p: i for i, p in enumerate(vocab)}, unk_token="[UNK]"))
    model.normalizer = tokenizers.normalizers.BertNormalizer(lowercase=True)
    model.pre_tokenizer = tokenizers.pre_tokenizers.BertPreTokenizer()
    model.enable_truncation(8)  # as sentence-transformers' MiniLM saves it (128)
    model.enable_padding(length=8, pad_id=0, pad_token="[PAD]")
    path = tmp_path / "tokenizer.json"
    model.save(str(path))
    words = ["The", "cat", "sat", "on", "the", "unbelievable", "mat", "."]
    ids, starts = TextTokenizer.from_file(str(path)).encode_words(words)
    # the reference: each word alone, pieces by vocab.txt's WordPiece with lowercasing, concatenated
    alone = TextTokenizer.from_file(os.path.join(ROOT, "tests", "fixtures", "bert_tiny", "vocab.txt"), True)
    pieces = [alone.encode_words([w])[0].tolist() for w in words]
    assert ids.tolist() == sum(pieces, []) and len(ids) > 8
    assert starts.tolist() == np.cumsum([0] + [len(p) for p in pieces[:-1]]).tolist()


def test_first_piece_pooling_equals_a_loop_over_the_words(checkpoint, tmp_path):
    from mtl.headkit.text import gather_words

    job = build_job(job_config(checkpoint, tmp_path), announce_plan=False)
    reader, tokenizer = job.task("upos").reader, job.backbone.tokenizer
    samples = [reader[i] for i in range(6)]
    width = max(len(s["token_ids"]) for s in samples)
    words = max(len(s["word_index"]) for s in samples)
    sequence = np.random.RandomState(0).randn(len(samples), width, 5).astype(np.float32)
    index = np.zeros((len(samples), words), np.int64)
    for i, s in enumerate(samples):
        index[i, :len(s["word_index"])] = s["word_index"]
    pooled = gather_words(paddle.to_tensor(sequence), paddle.to_tensor(index)).numpy()
    from mtl.text.conllu import read_conllu

    for i, sentence in enumerate(read_conllu(os.path.join(ROOT, "tests", "fixtures", "text", "ewt_sample.conllu"))[:6]):
        position = 1  # after [CLS]: walk the words, each tokenised alone
        for k, word in enumerate(sentence.words):
            pieces = tokenizer.encode_words([word])[0]
            assert samples[i]["token_ids"][position:position + len(pieces)].tolist() == pieces.tolist()
            np.testing.assert_array_equal(pooled[i, k], sequence[i, position])
            position += len(pieces)
        assert samples[i]["token_ids"][position] == tokenizer.sep_id


def test_warmup_then_linear_decay_is_berts_schedule():
    from mtl.config.keys import OPTIMIZER
    from mtl.config.schema import validate
    from mtl.optimizer.joint import build_lr

    cfg = validate(OPTIMIZER, {"lr": 1e-3, "warmup_steps": 4, "decay": "linear"}, "<test>")
    sched, got = build_lr(cfg, 20), []
    for _ in range(22):
        got.append(sched.get_lr())
        sched.step()
    # transformers' get_linear_schedule_with_warmup: lr * s / w before w, lr * (T - s) / (T - w) after, 0 past T
    expected = [1e-3 * (s / 4 if s < 4 else max(0.0, (20 - s) / 16)) for s in range(22)]
    np.testing.assert_allclose(got, expected, rtol=1e-9, atol=1e-12)


def test_encoder_rate_and_layer_decay_scale_each_parameter(checkpoint, tmp_path):
    job = build_job(job_config(checkpoint, tmp_path), announce_plan=False)
    rates = {n: p.optimize_attr["learning_rate"] for n, p in job.model.named_parameters()}
    # lr_mult backbone 0.5, layer_decay 0.8, 2 layers: embeddings 0.8^3, layer 0 0.8^2, layer 1 0.8, pooler 1
    for name, rate in rates.items():
        if name.startswith("backbone.embeddings."):
            assert rate == pytest.approx(0.5 * 0.8 ** 3), name
        elif name.startswith("backbone.layers.0."):
            assert rate == pytest.approx(0.5 * 0.8 ** 2), name
        elif name.startswith("backbone.layers.1."):
            assert rate == pytest.approx(0.5 * 0.8), name
        elif name.startswith("backbone.pooler."):
            assert rate == pytest.approx(0.5), name
        else:
            assert name.startswith("heads.") and rate == 1.0, name
    # Adam's first step moves a weight by lr_t * rate * g / (|g| + eps) (weight decay off here)
    cfg = job_config(checkpoint, tmp_path / "b", "optimizer.weight_decay=0.0", "optimizer.warmup_steps=0",
                     "optimizer.clip_norm=null")
    from mtl.train.trainer import Trainer

    job = build_job(cfg, announce_plan=False)
    trainer = Trainer(job, console=lambda *a: None)
    from mtl.data.steps import StepDataset

    batch = StepDataset(job.schedule, {t.name: t.reader for t in job.tasks}, cfg["seed"], 0, 1, bucket_batches=3)[0]
    names = ["backbone.embeddings.layer_norm.weight", "backbone.layers.0.query.weight", "backbone.layers.1.output.bias",
             "heads.upos.scorer.0.weight"]
    params = dict(job.model.named_parameters())
    before = {n: params[n].numpy().copy() for n in names}
    job.model.backward(job.model(trainer.as_tensors(batch), 0))
    grads = {n: params[n].grad.numpy().copy() for n in names}
    job.model.clear_gradients()
    trainer.train_step(batch, 0)
    for n in names:
        step = 1e-3 * rates[n] * grads[n] / (np.abs(grads[n]) + 1e-8)
        np.testing.assert_allclose(before[n] - params[n].numpy(), step, rtol=2e-3, atol=1e-9, err_msg=n)


def test_layer_decay_is_refused_for_a_backbone_without_layers(tmp_path):
    cfg = load_job(os.path.join(ROOT, "tests", "dist_scripts", "text_job.yaml"),
                   [f"output_dir={tmp_path}", "optimizer.layer_decay=0.9"])
    with pytest.raises(ConfigError, match="optimizer.layer_decay: backbone 'text_bilstm' has no layers to decay"):
        build_job(cfg, announce_plan=False)


def test_a_bucketed_joint_batch_has_the_loss_of_every_sentence_alone(checkpoint, tmp_path):
    from mtl.data.steps import StepDataset

    cfg = job_config(checkpoint, tmp_path)
    job = build_job(cfg, announce_plan=False)
    job.model.eval()
    data = StepDataset(job.schedule, {t.name: t.reader for t in job.tasks}, cfg["seed"], 0, 3, bucket_batches=3)
    batch = data[1]
    lengths = {t: (sub["token_ids"] != 0).sum(1) for t, sub in batch.items()}
    assert len({int(v.max()) for v in lengths.values()}) > 1  # the tasks' sub-batches differ in length
    with paddle.no_grad():
        outputs = job.model({t: {k: paddle.to_tensor(v) for k, v in s.items()} for t, s in batch.items()}).outputs
        for task, sub in batch.items():
            head = job.model.heads[task]
            losses, counts = [], []
            for i in range(len(sub["token_ids"])):  # each sentence alone, cut to its own length: no padding at all
                n = int(lengths[task][i])
                one = {k: v[i:i + 1, :n] if k in ("token_ids", "segment_ids") else v[i:i + 1] for k, v in sub.items()}
                count = int((one[head.label_field] >= 0).sum()) if task != "genre" else 1
                alone = job.model({task: {k: paddle.to_tensor(v) for k, v in one.items()}}).outputs
                losses.append(float(alone[task].loss) * count)
                counts.append(count)
            if task == "deps":  # the arc and relation losses are each means over the words
                counts = [int((s >= 0).sum()) for s in sub["heads"]]
            np.testing.assert_allclose(float(outputs[task].loss), sum(losses) / sum(counts), rtol=2e-5, err_msg=task)


@pytest.mark.slow
def test_the_run_keeps_the_checkpoints_tokenizer(checkpoint, tmp_path):
    from mtl.text.tokenizer import TextTokenizer
    from tests.shared_runs import train_here

    out = tmp_path / "run"
    train_here(JOB, "--set", f"backbone.pretrained={checkpoint}", f"output_dir={out}", "schedule.steps=2")
    kept = TextTokenizer.from_file(str(out / "tokenizer.json"))
    original = TextTokenizer.from_file(os.path.join(checkpoint, "vocab.txt"), True)  # do_lower_case
    words = ["Hello", "WORLD", "unbelievable", "Café"]
    assert kept.encode_words(words)[0].tolist() == original.encode_words(words)[0].tolist()
    assert kept.vocabulary() == original.vocabulary()
    sizes = json.load(open(out / "encoder.json"))
    assert (sizes["hidden_size"], sizes["num_layers"], sizes["num_heads"]) == (32, 2, 4)


@pytest.mark.subprocess
def test_the_finetuning_benchmark_runs_and_both_sides_agree(checkpoint, tmp_path):
    import re
    import subprocess
    import sys

    done = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "bench_text_finetune.py"), "--steps", "2",
                           "--batch", "8", "--checkpoint", checkpoint, "--path",
                           os.path.join(ROOT, "tests", "fixtures", "text", "ewt_sample.conllu")],
                          capture_output=True, text=True, timeout=300, cwd=str(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
    m = re.search(r"first-step loss: toolkit ([0-9.]+), hand-written ([0-9.]+)", done.stdout)
    assert m, done.stdout
    assert abs(float(m.group(1)) - float(m.group(2))) <= 1e-5 * abs(float(m.group(2)))
    assert re.search(r"overhead ratio [0-9.]+ \(target <= 1.05\)", done.stdout)
