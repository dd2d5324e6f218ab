"""Well-formed dependency trees from arc scores: the maximum spanning arborescence (Chu & Liu, 1965; Edmonds, 1967)
with exactly one word attached to the root, as UD trees have.

``scores[d, h]`` is the score of word ``d`` taking head ``h`` (node 0 is the root; row 0 is ignored). The tree
maximising ``sum_d scores[d, head(d)]`` is found by greedy heads, contraction of a cycle into one node (entering
arcs re-scored by what they replace), recursion, expansion. With ``single_root`` (the default): if the best tree
has several root children, the best tree is computed again for each word as the only root child and the highest
total kept (Dozat et al., 2017, CoNLL shared task, do the same).
"""
import numpy as np

NEG = -1e18


def _cycle(heads):
    """One cycle of the head graph (a list of nodes), or None."""
    n = len(heads)
    state = np.zeros(n, np.int64)  # 0 unseen, 1 on the current path, 2 done
    for start in range(1, n):
        path, node = [], start
        while node > 0 and state[node] == 0:
            state[node] = 1
            path.append(node)
            node = heads[node]
        if node > 0 and state[node] == 1:
            return path[path.index(node):]
        for p in path:
            state[p] = 2
    return None


def _mst(scores):
    """Heads [n] (heads[0] = -1) of the maximum spanning arborescence rooted at node 0."""
    n = len(scores)
    s = scores.copy()
    np.fill_diagonal(s, NEG)
    s[0, :] = NEG
    heads = s.argmax(axis=1)
    heads[0] = -1
    cycle = _cycle(heads)
    if cycle is None:
        return heads
    inside = set(cycle)
    outside = [v for v in range(n) if v not in inside]
    new = len(outside)
    sub = np.full((new + 1, new + 1), NEG)
    enter_from, enter_into = {}, {}
    for i, u in enumerate(outside):
        sub[i, :new] = s[u, outside]
        best = max(cycle, key=lambda c: s[u, c])
        sub[i, new], enter_from[u] = s[u, best], best
    for j, v in enumerate(outside):
        gains = [s[c, v] - s[c, heads[c]] for c in cycle]
        k = int(np.argmax(gains))
        sub[new, j], enter_into[v] = gains[k], cycle[k]
    sub_heads = _mst(sub)
    result = heads.copy()
    for i, u in enumerate(outside[1:], start=1):
        h = sub_heads[i]
        result[u] = outside[h] if h < new else enter_from[u]
    v = outside[sub_heads[new]]
    result[enter_into[v]] = v
    return result


def tree_score(scores, heads) -> float:
    """``sum_d scores[d, heads[d]]`` over the words 1..n."""
    return float(sum(scores[d, heads[d]] for d in range(1, len(heads))))


def decode_tree(scores, single_root: bool = True) -> np.ndarray:
    """Heads of words 1..n ([n], values 0..n) of the best well-formed tree."""
    scores = np.asarray(scores, np.float64)
    heads = _mst(scores)
    if single_root and (heads[1:] == 0).sum() > 1:
        best, best_score = None, None
        for r in range(1, len(scores)):
            s = scores.copy()
            s[1:, 0] = NEG
            s[r, 0] = scores[r, 0]
            candidate = _mst(s)
            value = tree_score(scores, candidate)
            if best is None or value > best_score:
                best, best_score = candidate, value
        heads = best
    return heads[1:].astype(np.int64)


def is_tree(heads) -> bool:
    """True when ``heads`` (of words 1..n, 0 = root) form one tree: no cycle, every word reaches the root."""
    full = np.concatenate([[-1], np.asarray(heads, np.int64)])
    return bool(((full[1:] >= 0) & (full[1:] < len(full))).all()) and _cycle(full) is None
