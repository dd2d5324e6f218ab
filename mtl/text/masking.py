"""Masked-LM corruption (Devlin et al., 2019, "BERT", section 3.1 and appendix A.1).

Of a text's maskable pieces (every piece but ``[CLS]``, ``[SEP]``, ``[PAD]``), ``max(1, round(p n))`` are chosen
uniformly without replacement (p = 0.15); each chosen piece becomes ``[MASK]`` with probability 0.8, a piece drawn
uniformly from the non-special vocabulary with probability 0.1, and stays as it is with probability 0.1. The label
of a chosen piece is its original id, every other piece's is -1 (no loss). The draws come from the generator the
caller passes (seeded by the reader from (seed, sample, epoch)), so a sample is corrupted alike on every process
and anew each epoch.
"""
import numpy as np

from mtl.text.words import IGNORE


def mask_pieces(ids, rng, special_ids, mask_id: int, vocab_size: int, probability: float = 0.15):
    """(corrupted ids, labels) of one text's piece ids."""
    ids = np.asarray(ids, np.int64)
    labels = np.full(len(ids), IGNORE, np.int64)
    candidates = np.flatnonzero(~np.isin(ids, list(special_ids)))
    if not len(candidates):
        return ids.copy(), labels
    count = min(len(candidates), max(1, int(round(probability * len(candidates)))))
    chosen = np.sort(rng.choice(candidates, size=count, replace=False))
    labels[chosen] = ids[chosen]
    out = ids.copy()
    kind = rng.random(count)
    normal = np.setdiff1d(np.arange(vocab_size), list(special_ids))
    out[chosen[kind < 0.8]] = mask_id
    swap = chosen[(kind >= 0.8) & (kind < 0.9)]
    out[swap] = rng.choice(normal, size=len(swap))
    return out, labels
