"""One text or a pair of texts as BERT's input: ``[CLS] a [SEP]`` or ``[CLS] a [SEP] b [SEP]``, segments 0 then 1.

Too long (more than ``max_length`` pieces), per ``too_long``: ``error`` (a DataError naming the record) or
``truncate`` (longest first: a piece is dropped from the end of the longer text until the pair fits, as BERT's
fine-tuning scripts do; the label belongs to the whole text or pair, so no label is lost).
"""
from typing import Optional, Tuple

import numpy as np

from mtl.core.errors import ConfigError, DataError

TOO_LONG = ("error", "truncate")


def check_policy(policy, key="too_long"):
    """A ConfigError unless ``policy`` is error or truncate."""
    if policy not in TOO_LONG:
        raise ConfigError(f"too_long must be one of {', '.join(TOO_LONG)} for texts, got {policy!r}", key=key)


def encode_pair(tokenizer, a: str, b: Optional[str], max_length: int, policy: str,
                where: str) -> Tuple[np.ndarray, np.ndarray]:
    """(token ids, segment ids) of text ``a`` (and ``b``); truncated or refused when too long."""
    first = tokenizer.encode_text(a)[0]
    second = tokenizer.encode_text(b)[0] if b is not None else None
    specials = 2 if second is None else 3
    total = len(first) + (0 if second is None else len(second)) + specials
    if total > max_length:
        if policy == "error":
            raise DataError(f"{where} has {total} pieces with the special tokens, more than max_length {max_length}; "
                            "raise max_length or set too_long: truncate")
        first, second = _truncate(first, second, max_length - specials)
    ids = [tokenizer.cls_id, *first, tokenizer.sep_id]
    segments = [0] * len(ids)
    if second is not None:
        ids += [*second, tokenizer.sep_id]
        segments += [1] * (len(second) + 1)
    return np.asarray(ids, np.int64), np.asarray(segments, np.int64)


def _truncate(first, second, budget):
    """Longest first: drop the last piece of the longer text until both fit in ``budget``."""
    first, second = list(first), None if second is None else list(second)
    while len(first) + (len(second) if second is not None else 0) > budget:
        if second is not None and len(second) > len(first):
            second.pop()
        else:
            first.pop()
    return first, second
