"""The text job of the same_rows tests (tests/test_same_rows.py, tests/test_task_gradients.py): two tasks on one
CoNLL-U file and masked LM over its texts."""


def text_job(tmp_path, ratios=(1, 1, 0.5), batch_size=10):
    """upos and genre over one CoNLL-U file, masked LM over its texts, same_rows, a BiLSTM without dropout."""
    conllu = tmp_path / "s.conllu"
    sentences = ["Hi there", "Paris is big", "We go home now", "It rains", "Dogs bark at night", "Yes",
                 "The cat sleeps", "Call me later today"]
    conllu.write_text("".join(f"# sent_id = {'email' if i % 2 else 'answers'}-{i}\n" + "".join(
        f"{k + 1}\t{w}\t{w.lower()}\t{('NOUN', 'VERB', 'DET')[k % 3]}\tNN\t_\t0\troot\t_\t_\n"
        for k, w in enumerate(text.split())) + "\n"
        for i, text in enumerate(sentences)))
    text = {"type": "conllu", "path": str(conllu), "eval_path": str(conllu), "target": "upos"}
    genre = {**text, "target": {"comment": "sent_id", "pattern": "^([a-z]+)-"}}
    return {"tasks": [{"name": "upos", "reader": text, "head": {"type": "tagger", "dropout": 0.0}, "ratio": ratios[0]},
                      {"name": "genre", "reader": genre, "head": {"type": "text_classify", "dropout": 0.0},
                       "ratio": ratios[1]},
                      {"name": "mlm", "reader": {"type": "masked_lm", "source": text}, "head": {"type": "masked_lm"},
                       "ratio": ratios[2], "loss_weight": 0.5}],
            "backbone": {"type": "text_bilstm", "embedding_size": 8, "hidden_size": 8, "dropout": 0.0,
                         "embedding_dropout": 0.0, "tokenizer": "examples/data/text/ewt_wordpiece_8k.json"},
            "schedule": {"batch_size": batch_size, "steps": 2, "same_rows": True}, "seed": 3}
