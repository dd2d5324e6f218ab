"""``mtl predict`` for text tasks: new text in, the same file out with every task's predictions filled in.

A run's (or an export's) encoder reads the inputs as its tasks' readers read their files (:meth:`Reader.input_spec`,
recorded in the run's ``data.json``): sentences of words (``word_index`` at each word's first piece), one text or
a pair of texts (``[CLS] a [SEP] b [SEP]``), or SQuAD questions in windows. Each task's head, rebuilt from the run's
config and weights, makes its predictions (:meth:`Head.predict_text`): a class and its softmax probability, a tag per
word (argmax, or the CRF's Viterbi path), a tree (heads and relations), a span of the context; the label names come
from the run (:meth:`Reader.label_names`). The input formats and where each prediction goes:
:mod:`mtl.text.documents`.

Too long for the task's ``max_length``: a sentence of tags is cut between words and its parts predicted one after the
other (every word keeps a tag); a sentence or text with one label keeps its first pieces (counted and said); a tree
cannot be cut and is refused, naming the sentence. An export keeps the pooled vector only: heads that read the
sequence (tags, trees, spans) predict from the run folder, unless the export holds its text program too
(``text_encoder``, written by ``mtl export`` for a text encoder: the sequence and the pooled vector).
"""
import json
import os
import sys
from dataclasses import dataclass, field
from typing import Dict, List

import numpy as np

from mtl.core.errors import ConfigError, DataError, require_input_file
from mtl.text.documents import SquadDocument, input_format, read_document
from mtl.text.iob2 import entities
from mtl.text.pairs import encode_pair
from mtl.text.words import encode_words, word_parts

# what a task's samples are made of -> the input formats that hold them
READS = {"words": ("conllu", "iob2", "text"), "text": ("conllu", "iob2", "tsv", "text"), "pair": ("tsv",),
         "pairwise": ("tsv",), "question": ("squad",)}
WHAT = {"words": "sentences of words", "text": "texts", "pair": "pairs of texts (text_a, text_b)",
        "pairwise": "pairs of texts (text_a, text_b)", "question": "SQuAD questions"}
PADS = {"segment_ids": 0, "word_index": 0, "context_mask": 0, "piece_chars": -1}
NOT_INPUTS = ("start", "end")  # the squad reader's answer fields: labels, not inputs
BATCH = 32


@dataclass
class TextTask:
    """One task of the model as predictions need it: its name, its reader's input spec, its head (weights loaded,
    eval mode) and the names of its labels (``{field: names}``)."""

    name: str
    spec: dict
    head: object
    names: Dict[str, List[str]] = field(default_factory=dict)

    @property
    def units(self) -> str:
        """What one sample is made of: ``words``, ``text``, ``pair``, ``pairwise`` or ``question``."""
        return self.spec["units"]


def text_tasks(model) -> List[str]:
    """The tasks of a run or export whose reader reads text (its recorded input spec says ``kind: text``)."""
    inputs = model.data.get("inputs") or {}
    return [t for t in model.tasks if (inputs.get(t) or {}).get("kind") == "text"]


class Encoder:
    """The text encoder of a run (its backbone: ``sequence`` and ``pooled``) or of an export (its inference program:
    ``pooled`` only), with its tokenizer."""

    def __init__(self, model, path: str):
        from mtl.text.tokenizer import TextTokenizer

        self.tasks: Dict[str, "TextTask"] = {}  # the heads built so far, for the next input file
        self.export = bool(model.loaded.meta)
        if self.export:
            self.program = model.loaded.model.inner  # the inference program: (token_ids, segment_ids) -> pooled
            self.tokenizer = TextTokenizer.from_file(os.path.join(path, "tokenizer.json"))
            self.feature_size = int(model.loaded.meta["feature_size"])
            self.text_program = _text_program(path)
        else:
            self.backbone = model.loaded.model
            self.tokenizer, self.feature_size = self.backbone.tokenizer, int(self.backbone.feature_size)

    @property
    def has_sequence(self) -> bool:
        """Whether the encoder gives the sequence (a run's backbone, or an export with its text program)."""
        return not self.export or self.text_program is not None

    def __call__(self, tokens, segments) -> dict:
        if self.export and self.text_program is not None:
            sequence, pooled = self.text_program(tokens, segments)
            return {"sequence": sequence, "pooled": pooled}
        if self.export:
            return {"pooled": self.program(tokens, segments)}
        return self.backbone({"token_ids": tokens, "segment_ids": segments})


def _text_program(folder: str):
    """The export's text program (:data:`mtl.serving.export.TEXT_PROGRAM`), loaded, or None when it has none (an export
    written before it existed, or of an encoder without a sequence)."""
    import paddle

    from mtl.serving.export import TEXT_PROGRAM

    if not os.path.isfile(os.path.join(folder, f"{TEXT_PROGRAM}.json")):
        return None
    try:
        program = paddle.jit.load(os.path.join(folder, TEXT_PROGRAM))
    except Exception as exc:  # noqa: BLE001 - Paddle reports a damaged program as RuntimeError, KeyError, ...
        raise DataError(f"export '{folder}': its text program ({TEXT_PROGRAM}.json) cannot be loaded "
                        f"({type(exc).__name__}); export the run again") from None
    program.eval()
    return program


def build_task(model, name: str, encoder: Encoder) -> TextTask:
    """Task ``name``'s head rebuilt from the run's config with its sizes and weights (once per encoder); a ConfigError
    when the head makes no text predictions (an auxiliary masked LM)."""
    if name not in encoder.tasks:
        encoder.tasks[name] = _build(model, name, encoder)
    return encoder.tasks[name]


def _build(model, name: str, encoder: Encoder) -> TextTask:
    from mtl.core import registry
    from mtl.core.low_precision import state_for

    cfg, spec = model.head_configs[name], model.data["inputs"][name]
    entry = registry.get("head", cfg["type"], "<run>", f"{name}.head")
    if not entry.cls.predicts_text:
        raise ConfigError(f"task '{name}' has a '{cfg['type']}' head, which makes no predictions for new text (an "
                          "auxiliary task)")
    sizes = {param: spec["sizes"][size] for param, size in entry.cls.reader_sizes.items() if size in spec["sizes"]}
    head = registry.build("head", cfg, "<run>", f"{name}.head", feature_size=encoder.feature_size, **sizes)
    head.set_state_dict(state_for(head, model.head_state(name)))
    head.eval()
    return TextTask(name, spec, head, (model.data.get("label_names") or {}).get(name) or {})


def chosen(model, encoder, fmt: str, task=None) -> List[TextTask]:
    """``[task]`` when named (checked against the input's format), else every text task whose head predicts and
    that reads this format; a ConfigError naming what each task reads when none does."""
    from mtl.core import registry

    names = text_tasks(model)
    if task is not None:
        if task not in names:
            raise ConfigError(f"the model has no text task '{task}' (its text tasks: {', '.join(names) or 'none'})")
        units = model.data["inputs"][task]["units"]
        if fmt not in READS[units]:
            raise ConfigError(f"task '{task}' reads {WHAT[units]}, which a {fmt} input does not hold; give "
                              f"{' or '.join(READS[units])}")
        built = build_task(model, task, encoder)
        if not readable(built, encoder):
            raise ConfigError(f"task '{task}' ('{model.head_configs[task]['type']}' head) reads the encoder's "
                              "sequence, which an export does not keep (only the pooled vector): predict with the run "
                              "folder")
        return [built]
    found = [build_task(model, t, encoder) for t in names if fmt in READS[model.data["inputs"][t]["units"]]
             and registry.get("head", model.head_configs[t]["type"]).cls.predicts_text]
    left_out = [t.name for t in found if not readable(t, encoder)]
    if left_out:
        print(f"note: task(s) {', '.join(left_out)} read the encoder's sequence, which an export does not keep: "
              "predict with the run folder for them", file=sys.stderr, flush=True)
    found = [t for t in found if t.name not in left_out]
    if not found:
        what = "; ".join(f"{t}: {WHAT[model.data['inputs'][t]['units']]}" for t in names)
        raise ConfigError(f"no task of the model predicts from a {fmt} input here ({what})")
    return found


def readable(task: TextTask, encoder: Encoder) -> bool:
    """Whether the encoder gives what the task's head reads (an export without its text program keeps the pooled
    vector only)."""
    return encoder.has_sequence or task.head.reads != "sequence"


def samples(task: TextTask, doc, tokenizer, counts: dict) -> tuple:
    """(samples, owner of each: ``(unit, first word)``) of the input ``doc`` as ``task``'s reader makes them;
    ``counts["cut"]`` counts the units that kept only their first pieces."""
    limit = int(task.spec["max_length"])
    if task.units == "question":
        from mtl.readers.squad_reader import SquadReader

        reader = SquadReader(doc.path, tokenizer=tokenizer, max_length=limit, doc_stride=task.spec["doc_stride"],
                             max_query_length=task.spec["max_query_length"])
        return ([{k: v for k, v in s.items() if k not in NOT_INPUTS} for s in reader],
                [(int(s["example_index"]), 0) for s in reader])
    if task.units != "words":
        rows = [[t] for t in doc.texts()] if task.units == "text" else doc.pairs(["text_a", "text_b"])
        out = []
        for row in rows:
            pieces = sum(len(tokenizer.encode_text(t)[0]) for t in row) + len(row) + 1
            counts["cut"] += pieces > limit
            ids, segments = encode_pair(tokenizer, row[0], row[1] if len(row) > 1 else None, limit, "truncate", "")
            out.append({"token_ids": ids, "segment_ids": segments})
        return out, [(k, 0) for k in range(len(rows))]
    return _word_samples(task, doc, tokenizer, limit, counts)


def _word_samples(task, doc, tokenizer, limit, counts):
    """Sentences of words as samples; a sentence too long is cut between words (tags), keeps its first part (a
    sentence label) or is refused (a tree)."""
    out, owners = [], []
    for unit, words in enumerate(doc.words()):
        ids, _ = encode_words(tokenizer, words)  # [CLS] pieces [SEP]
        parts = [(0, len(words))]
        if len(ids) > limit:
            if task.spec.get("labels") == "tree":
                raise DataError(f"input '{doc.path}': sentence {unit + 1} has {len(ids)} pieces with [CLS] and [SEP], "
                                f"more than the {limit} task '{task.name}' reads (its reader's max_length), and a "
                                "tree cannot be cut")
            parts = word_parts(tokenizer, words, limit)
            if task.spec.get("labels") == "sentence":
                parts, counts["cut"] = parts[:1], counts["cut"] + 1
        for a, b in parts:
            ids, word_index = encode_words(tokenizer, words[a:b])
            out.append({"token_ids": ids, "segment_ids": np.zeros_like(ids), "word_index": word_index})
            owners.append((unit, a))
    return out, owners


def run(task: TextTask, encoder: Encoder, items: list) -> list:
    """The head's record of every sample, in batches of ``BATCH`` padded to their longest."""
    import paddle

    from mtl.backbones.rows import select
    from mtl.data.padding import pad_stack

    pads = dict(PADS, token_ids=encoder.tokenizer.pad_id)
    records = []
    with paddle.no_grad():
        for start in range(0, len(items), BATCH):
            chunk = items[start:start + BATCH]
            batch = {k: paddle.to_tensor(pad_stack([s[k] for s in chunk], pads.get(k), k)) for k in chunk[0]}
            outputs = encoder(batch["token_ids"], batch["segment_ids"])
            features = select(outputs, task.head.reads, "pooled")
            records += task.head.predict_text(paddle.cast(features, "float32"), batch)
    return records


def merged(records: list, owners: list, units: int) -> list:
    """One record per unit: the records of a sentence's parts joined (their per-word lists one after the other)."""
    out = [None] * units
    for record, (unit, _) in zip(records, owners):
        if out[unit] is None:
            out[unit] = {k: list(v) if isinstance(v, list) else v for k, v in record.items()}
            continue
        for key, value in record.items():
            if isinstance(value, list):
                out[unit][key] += value
    return out


def _name(names, value):
    """The name of id ``value`` (the number itself when the run has no names for the field, e.g. a word's head)."""
    return (names[value] if 0 <= value < len(names) else str(value)) if names else int(value)


RESERVED = ("probability", "probabilities", "score", "question", "start", "end")


def fill(doc, task: TextTask, records: list) -> list:
    """Write ``task``'s per-unit records into ``doc`` (names for ids); its JSON entries, one per unit."""
    if task.units == "question":
        return _fill_answers(doc, records)
    fields = [k for k in records[0] if k not in RESERVED]
    per_word = {f: [[_name(task.names.get(f), v) for v in r[f]] for r in records]
                for f in fields if isinstance(records[0][f], list)}
    if per_word:
        doc.set_words(task.name, task.spec, {f: [[str(v) for v in unit] for unit in values]
                                             for f, values in per_word.items()})
    sentence = [f for f in fields if f not in per_word]
    if sentence:
        doc.set_units(task.name, [str(_name(task.names.get(sentence[0]), r[sentence[0]])) for r in records],
                      [r["probability"] for r in records] if "probability" in records[0] else None)
    elif "score" in records[0]:
        doc.set_units(task.name, [f"{r['score']:.4f}" for r in records])
    return [_entry(task, r, per_word, u) for u, r in enumerate(records)]


def _entry(task, record, per_word, unit) -> dict:
    """A unit's JSON entry: the names, the numbers the head gave, and the entities of IOB2 tags."""
    entry = {k: v for k, v in record.items() if k not in per_word}
    for f in [k for k in entry if k not in RESERVED]:
        entry[f] = _name(task.names.get(f), entry[f])
    for f, values in per_word.items():
        entry[f] = values[unit]
        if task.names.get(f) and all(t == "O" or t[:2] in ("B-", "I-") for t in values[unit]):
            entry["entities"] = [{"type": kind, "first": a, "last": b} for kind, a, b in sorted(
                entities(values[unit]), key=lambda e: e[1])]
    return entry


def _fill_answers(doc: SquadDocument, records: list) -> list:
    """Each question's answer: the span of its best-scoring window (empty when no window holds one)."""
    best = {}
    for r in records:
        if r["score"] is not None and (r["question"] not in best or r["score"] > best[r["question"]]["score"]):
            best[r["question"]] = r
    answers = [q.context[best[k]["start"]:best[k]["end"]] if k in best else "" for k, q in enumerate(doc.questions)]
    doc.set_answers(answers)
    return [{"id": q.qid, "answer": a, "score": best[k]["score"] if k in best else None}
            for k, (q, a) in enumerate(zip(doc.questions, answers))]


def predict_file(model, encoder, path: str, fmt=None, task=None):
    """(filled document, JSON record) of one input file: every chosen task's predictions written into it."""
    require_input_file(path)
    fmt = input_format(path, fmt)
    tasks = chosen(model, encoder, fmt, task)
    iob2 = next((t.spec["iob2"] for t in tasks if "iob2" in t.spec), None)
    doc = read_document(path, fmt, any(t.units == "words" for t in tasks), encoder.tokenizer.split_words,
                        (iob2["word_column"], iob2["tag_column"]) if iob2 else None)
    record = {"input": path, "format": fmt, "written_as": doc.format, "tasks": {}}
    for t in tasks:
        counts = {"cut": 0}
        items, owners = samples(t, doc, encoder.tokenizer, counts)
        records = run(t, encoder, items)
        if t.units != "question":
            records = merged(records, owners, max(u for u, _ in owners) + 1)
        record["tasks"][t.name] = fill(doc, t, records)
        if counts["cut"]:
            print(f"note: task '{t.name}': {counts['cut']} unit(s) of '{path}' are longer than the "
                  f"{t.spec['max_length']} pieces the task reads and were predicted from their first pieces",
                  file=sys.stderr, flush=True)
    return doc, record


def outputs_for(inputs: List[str], output) -> List[str]:
    """Where each input's filled file goes: ``output`` itself for one input, ``output/<name>`` for several (a
    folder), None (printed) without ``output``; a ConfigError for several inputs without a folder."""
    if output is None:
        if len(inputs) > 1:
            raise ConfigError("several text inputs need -o FOLDER (each filled file is written there under its own "
                              "name)", key="--output")
        return [None]
    if len(inputs) > 1:
        if not os.path.isdir(output):
            raise ConfigError(f"-o '{output}' must be an existing folder for several inputs", key="--output")
        return [os.path.join(output, os.path.basename(p)) for p in inputs]
    return [output]


def predict_text(model, path: str, inputs: List[str], task=None, output=None, fmt=None, json_path=None) -> list:
    """Predict every input file with the text tasks of the opened run or export ``model`` (at ``path``); write each
    filled file to its output (or print it), and the JSON records to ``json_path``; return the records."""
    from mtl.core.errors import require_output_file

    targets = outputs_for(list(inputs), output)
    for target in [t for t in targets if t is not None] + ([json_path] if json_path else []):
        require_output_file(target, "--output" if target != json_path else "--json")
    encoder = Encoder(model, path)
    records = []
    for source, target in zip(inputs, targets):
        doc, record = predict_file(model, encoder, source, fmt, task)
        text = doc.render()
        if target is None:
            sys.stdout.write(text)
        else:
            with open(target, "w", encoding="utf-8") as f:
                f.write(text)
            print(f"{source}: {', '.join(record['tasks'])} -> {target} ({doc.format})")
        records.append(record)
    if json_path:
        with open(json_path, "w", encoding="utf-8") as f:
            json.dump(records, f, indent=1, ensure_ascii=False)
    return records
