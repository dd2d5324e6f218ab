"""Pretrained word vectors (GloVe: ``mtl pretrained fetch glove``) as the initial piece embeddings of a text encoder.

A word-vectors folder holds ``vectors.npy`` [N, D] float32 and ``words.txt`` (N lines, word k is row k; GloVe's
are lowercased and sorted by frequency, so the first ``max_words`` are the most frequent). A piece that is one of
the words starts from its vector; ``[PAD]`` from zeros; every other piece (special tokens, pieces the vectors lack)
from a normal draw with the vectors' own standard deviation, seeded.
"""
import os
from typing import List, Optional, Tuple

import numpy as np

from mtl.core.errors import ConfigError, DataError
from mtl.core.utf8 import open_utf8

VECTORS, WORDS = "vectors.npy", "words.txt"


def read_word_vectors(folder: str, max_words: Optional[int] = None) -> Tuple[List[str], np.ndarray]:
    """(words, vectors [len(words), D]) of a word-vectors folder, the first ``max_words`` rows only when given; a
    ConfigError naming the missing file, a DataError when the two files disagree."""
    paths = [os.path.join(folder, name) for name in (VECTORS, WORDS)]
    for path in paths:
        if not os.path.isfile(path):
            raise ConfigError(f"word vectors '{folder}' lack '{os.path.basename(path)}' (a folder of vectors.npy and "
                              "words.txt, as mtl pretrained fetch glove writes)", key="word_vectors")
    vectors = np.load(paths[0], mmap_mode="r", allow_pickle=False)
    with open_utf8(paths[1], "word list") as f:
        words = f.read().split("\n")
    if words and words[-1] == "":
        words.pop()
    if vectors.ndim != 2 or len(words) != vectors.shape[0]:
        raise DataError(f"word vectors '{folder}': words.txt has {len(words)} words for vectors of shape "
                        f"{list(vectors.shape)} (one row per word expected)")
    keep = len(words) if max_words is None else min(int(max_words), len(words))
    return words[:keep], np.asarray(vectors[:keep], np.float32)


def initial_embeddings(vocabulary: List[str], words: List[str], vectors: np.ndarray, pad_id: int,
                       seed: int = 0) -> Tuple[np.ndarray, int]:
    """([V, D] initial embeddings of ``vocabulary``, how many pieces got a vector): a piece found among ``words``
    its vector, ``[PAD]`` zeros, any other piece a normal draw of the vectors' standard deviation."""
    row = {word: k for k, word in enumerate(words)}
    table = np.random.RandomState(seed).normal(0.0, float(vectors.std()) or 1.0,
                                               (len(vocabulary), vectors.shape[1])).astype(np.float32)
    found = 0
    for i, piece in enumerate(vocabulary):
        k = row.get(piece)
        if k is not None:
            table[i] = vectors[k]
            found += 1
    table[pad_id] = 0.0
    return table, found
