"""``mtl embed`` of a text export: each line of the input files is a text, tokenised with the export's own
``tokenizer.json`` (the run's: the export tokenises exactly as training did), ``[CLS] text [SEP]``, then the exported
encoder's pooled vector."""
import os

import numpy as np

from mtl.core.errors import DataError, require_input_file
from mtl.core.utf8 import open_utf8
from mtl.data.padding import pad_stack
from mtl.text.tokenizer import TextTokenizer


def read_texts(paths):
    """Every non-empty line of the text files ``paths``."""
    texts = []
    for path in paths:
        require_input_file(path)
        with open_utf8(path, "input") as f:
            texts += [line.rstrip("\n") for line in f if line.strip()]
    if not texts:
        raise DataError(f"the inputs {list(paths)} hold no text (one text per line)")
    return texts


def text_batches(tokenizer, texts, batch_size, max_length=512):
    """(token ids, segment ids) padded per batch of ``batch_size`` texts (a text beyond ``max_length`` pieces keeps
    its first ones: an embedding has no labels to lose)."""
    for start in range(0, len(texts), batch_size):
        ids = []
        for text in texts[start:start + batch_size]:
            pieces = tokenizer.encode_text(text)[0][:max_length - 2]
            ids.append(np.concatenate([[tokenizer.cls_id], pieces, [tokenizer.sep_id]]).astype(np.int64))
        tokens = pad_stack(ids, tokenizer.pad_id)
        yield tokens, np.zeros_like(tokens)


def embed_texts(model, export_dir, paths, batch_size=64) -> np.ndarray:
    """[N, D] pooled vectors of the texts of ``paths`` with the exported text encoder ``model``."""
    import paddle

    tokenizer = TextTokenizer.from_file(os.path.join(export_dir, "tokenizer.json"))
    out = []
    with paddle.no_grad():
        for tokens, segments in text_batches(tokenizer, read_texts(paths), batch_size):
            out.append(model(paddle.to_tensor(tokens), paddle.to_tensor(segments)).numpy())
    return np.concatenate(out)
