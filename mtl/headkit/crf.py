"""Linear-chain conditional random field (Lafferty et al., 2001; the tagging layer of Lample et al., 2016).

For emissions ``E`` [W, C] of a sentence of W words, transitions ``A`` [C, C] (``A[i, j]``: tag i then tag j), start
``s`` and end ``e`` scores, a tag path ``y`` scores ``s[y_1] + sum_t E[t, y_t] + sum_{t>1} A[y_{t-1}, y_t] + e[y_W]``
and ``p(y | x) = exp(score(y)) / Z`` with ``log Z`` from the forward recursion
``alpha_1 = s + E_1``, ``alpha_t[j] = logsumexp_i(alpha_{t-1}[i] + A[i, j]) + E_t[j]``, ``log Z = logsumexp(alpha_W
+ e)``. Batches: a word past a sentence's end (mask 0) keeps alpha as it is. Prediction is the Viterbi path (the
same recursion with max, and back-pointers), not the per-word argmax.
"""
import numpy as np
import paddle


def path_scores(emissions, tags, mask, transitions, start, end):
    """[B] score of the given tag paths (``mask`` [B, W] bool, a prefix of each row; tags padded with any id)."""
    tags = paddle.clip(tags, min=0)
    maskf = paddle.cast(mask, emissions.dtype)
    emitted = paddle.take_along_axis(emissions, tags.unsqueeze(-1), axis=2).squeeze(-1)
    total = (emitted * maskf).sum(axis=1) + paddle.gather(start, tags[:, 0])
    if emissions.shape[1] > 1:
        count = transitions.shape[0]
        pairs = paddle.gather(transitions.reshape([-1]), (tags[:, :-1] * count + tags[:, 1:]).reshape([-1]))
        pairs = pairs.reshape(tags[:, 1:].shape)
        total = total + (pairs * maskf[:, 1:]).sum(axis=1)
    last = paddle.clip(paddle.cast(mask, "int64").sum(axis=1) - 1, min=0)
    last_tags = paddle.take_along_axis(tags, last.unsqueeze(-1), axis=1).squeeze(-1)
    return total + paddle.gather(end, last_tags)


def log_partition(emissions, mask, transitions, start, end):
    """[B] ``log Z`` by the forward recursion."""
    alpha = start.unsqueeze(0) + emissions[:, 0]
    for t in range(1, emissions.shape[1]):
        step = paddle.logsumexp(alpha.unsqueeze(2) + transitions.unsqueeze(0), axis=1) + emissions[:, t]
        alpha = paddle.where(mask[:, t:t + 1], step, alpha)
    return paddle.logsumexp(alpha + end.unsqueeze(0), axis=1)


def viterbi(emissions: np.ndarray, transitions: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """The best tag path [W] of one sentence's emissions [W, C] (numpy)."""
    count = len(emissions)
    if count == 0:
        return np.zeros(0, np.int64)
    score = start + emissions[0]
    back = np.zeros((count, emissions.shape[1]), np.int64)
    for t in range(1, count):
        candidates = score[:, None] + transitions
        back[t] = candidates.argmax(axis=0)
        score = candidates.max(axis=0) + emissions[t]
    path = [int(np.argmax(score + end))]
    for t in range(count - 1, 0, -1):
        path.append(int(back[t, path[-1]]))
    return np.asarray(path[::-1], np.int64)
