"""Reference of the stratified verification folds, written as plain loops (independent of mtl.evaluation.metrics).

Each kind of pair (same person first, then different people) is sorted by the 64-bit big-endian blake2b digest of
``b"<seed>\\0" + key`` and dealt to the folds in turn, the different pairs continuing where the same pairs stopped.
"""
import hashlib

import numpy as np


def stratified_splits(issame, keys, folds, seed=0):
    """``[(train indices, test indices)]`` per fold, as :func:`mtl.evaluation.metrics.stratified_folds` promises."""
    issame = [bool(v) for v in issame]
    fold_of = [None] * len(issame)
    position = 0
    for kind in (True, False):
        members = [i for i in range(len(issame)) if issame[i] == kind]

        def digest(i):
            key = keys[i] if isinstance(keys[i], bytes) else str(keys[i]).encode()
            return int.from_bytes(hashlib.blake2b(f"{seed}\0".encode() + key, digest_size=8).digest(), "big")

        for i in sorted(members, key=lambda i: (digest(i), i)):
            fold_of[i] = position % folds
            position += 1
    everything = np.arange(len(issame))
    return [(everything[[f != k for f in fold_of]], everything[[f == k for f in fold_of]]) for k in range(folds)]
