"""The arithmetic of cross-head negatives' online same-person rule (:mod:`mtl.headkit.cross_negatives`): the normal
quantile that sets its cosine threshold, and the same-person pairs it estimates at the end from how often each
other-head class left a sample's softmax."""
import math
from typing import Dict, List


def normal_quantile(q: float) -> float:
    """z_q of the standard normal distribution (Acklam's rational approximation, |error| < 1.2e-9)."""
    a = [-3.969683028665376e+01, 2.209460984245205e+02, -2.759285104469687e+02, 1.383577518672690e+02,
         -3.066479806614716e+01, 2.506628277459239e+00]
    b = [-5.447609879822406e+01, 1.615858368580409e+02, -1.556989798598866e+02, 6.680131188771972e+01,
         -1.328068155288572e+01]
    c = [-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e+00, -2.549732539343734e+00,
         4.374664141464968e+00, 2.938163982698783e+00]
    d = [7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e+00, 3.754408661907416e+00]
    if q < 0.02425:
        r = math.sqrt(-2 * math.log(q))
        return (((((c[0] * r + c[1]) * r + c[2]) * r + c[3]) * r + c[4]) * r + c[5]) / \
            ((((d[0] * r + d[1]) * r + d[2]) * r + d[3]) * r + 1)
    if q > 1 - 0.02425:
        return -normal_quantile(1 - q)
    r = (q - 0.5) ** 2
    return (((((a[0] * r + a[1]) * r + a[2]) * r + a[3]) * r + a[4]) * r + a[5]) * (q - 0.5) / \
        (((((b[0] * r + b[1]) * r + b[2]) * r + b[3]) * r + b[4]) * r + 1)


def estimated_pairs(removed: Dict[str, Dict[str, int]], seen: Dict[str, Dict[int, int]]) -> List[dict]:
    """Same-person pairs in ``mtl overlap --json``'s form from removal counts summed over ranks: a pair removed
    for at least half the samples of its class seen since the warm-up, and each class's most removed partner in
    the other head (mutual)."""
    best = {}
    for task, counts in removed.items():
        for key, count in counts.items():
            label, other, cls = key.split(" ")
            share = count / max(seen.get(task, {}).get(int(label), 0), 1)
            here = (task, int(label), other)
            if share >= 0.5 and share > best.get(here, (0.0, None))[0]:
                best[here] = (share, int(cls))
    pairs = []
    for (task, label, other), (share, cls) in sorted(best.items()):
        back = best.get((other, cls, task))
        if back is not None and back[1] == label and task < other:
            pairs.append({"task_a": task, "class_a": label, "task_b": other, "class_b": cls,
                          "similarity": round(min(share, back[0]), 4)})
    return pairs
