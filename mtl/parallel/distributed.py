"""Process-group helpers: rank and world size, the balanced class split, and collectives that are no-ops at world 1.

Every helper here works identically whether or not the job runs under ``python -m paddle.distributed.launch``; at
world size 1 nothing communicates.
"""
import itertools
import math
import os
import signal
import threading
import time

import paddle
import paddle.distributed as dist

from mtl.core import activity
from mtl.core.arrays import tensor_from


def world_size() -> int:
    """Number of processes of the job (1 without a launcher)."""
    if dist.is_initialized():
        return dist.get_world_size()
    return int(os.environ.get("PADDLE_TRAINERS_NUM", "1")) if _launched() else 1


def rank() -> int:
    """This process's rank (0 without a launcher)."""
    if dist.is_initialized():
        return dist.get_rank()
    return int(os.environ.get("PADDLE_TRAINER_ID", "0")) if _launched() else 0


def _launched() -> bool:
    return "PADDLE_TRAINER_ENDPOINTS" in os.environ and int(os.environ.get("PADDLE_TRAINERS_NUM", "1")) > 1


def is_distributed() -> bool:
    """True when more than one process takes part and the process group is up."""
    return dist.is_initialized() and dist.get_world_size() > 1


def shard_range(num_classes: int, world: int, k: int):
    """Class range ``[start, start + count)`` owned by rank ``k``: the balanced split.

    ``C_k = C // W + (k < C % W)`` and ``s_k = (C // W) * k + min(k, C % W)``; with C < W some ranks own 0 classes.
    """
    base, extra = divmod(int(num_classes), int(world))
    count = base + (1 if k < extra else 0)
    start = base * k + min(k, extra)
    return start, count


def all_reduce_sum(x: paddle.Tensor) -> paddle.Tensor:
    """Sum of ``x`` over ranks, without gradient (returns a new tensor)."""
    y = x.detach().clone()
    if is_distributed():
        with activity.collective("an all-reduce (sum)"):
            dist.all_reduce(y, op=dist.ReduceOp.SUM)
    return y


def all_reduce_max(x: paddle.Tensor) -> paddle.Tensor:
    """Element-wise max of ``x`` over ranks, without gradient (returns a new tensor)."""
    y = x.detach().clone()
    if is_distributed():
        with activity.collective("an all-reduce (max)"):
            dist.all_reduce(y, op=dist.ReduceOp.MAX)
    return y


def barrier():
    """Wait for every rank (no-op at world 1)."""
    if is_distributed():
        with activity.collective("a barrier"):
            dist.barrier()


_WAITS = itertools.count()  # the waits so far, the same on every rank (the ranks wait in the same order)
# seconds between two looks at the count: the first, then each 1.25x the last, at most the second (a rank that
# comes first sees the others within a quarter of their lateness; a long wait, rank 0 evaluating, asks twice a second)
WAIT_POLL = (0.002, 0.5)
WAIT_GROWTH = 1.25


def wait_for_all(name: str):
    """Wait until every rank gets here, through the job's key-value store (a count, polled) rather than a collective:
    gloo gives up on a collective after 30 s (fixed in Paddle 3.3), so the ranks done early wait here for one that
    has more to do (rank 0 evaluating the verification sets it alone evaluates, writing the larger part of a
    checkpoint). To the watchdog it is a collective called ``name``. A no-op at world 1.

    The store is asked from a thread of its own that blocks every signal: Paddle's store client does not retry a
    socket read a signal interrupts (a pre-emption during the wait raised 'TCP receive error ... Interrupted system
    call'; a loader worker's SIGCHLD can do the same); this thread waits, and a stop request is handled as in any
    collective. A barrier follows, at once since every rank is there: the store lives in rank 0's process, and rank
    0 must not go on (and end the job) while another rank still reads the count."""
    if not is_distributed():
        return
    from paddle.base import core

    store, key, world, done, failed = core.create_or_get_global_tcp_store(), f"mtl/wait/{next(_WAITS)}", \
        world_size(), threading.Event(), []

    def count():
        signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())  # (delivered to the other threads)
        try:
            pause, seen = WAIT_POLL[0], store.add(key, 1)
            while seen < world:
                time.sleep(pause)
                pause, seen = min(WAIT_POLL[1], pause * WAIT_GROWTH), store.add(key, 0)
        except Exception as exc:  # noqa: BLE001 - raised in the waiting thread
            failed.append(exc)
        finally:
            done.set()
    with activity.collective(name):
        threading.Thread(target=count, name="mtl-wait-for-all", daemon=True).start()
        done.wait()
        if failed:
            raise RuntimeError(f"lost contact with the job's key-value store in {name} "
                               f"({str(failed[0]).splitlines()[0]})")
        dist.barrier()


def lowest_rank_text(text, limit: int = 4096):
    """The text of the lowest rank that has one (None when no rank has), equal on every rank.

    One tiny all-reduce per call; the texts are all-gathered only when some rank has one. Used to agree on an error
    (any rank's: without it a bad record in one rank's slice would stop that rank alone and leave the others waiting
    in a collective until gloo's timeout) and to send rank 0's answer (a checkpoint path) to every rank.
    """
    return agree(text, False, limit)[0]


def min_over_ranks(value: float) -> float:
    """The smallest ``value`` of any rank (one all-reduce; ``value`` itself at world 1)."""
    if not is_distributed():
        return float(value)
    return -float(all_reduce_max(tensor_from([-float(value)], dtype="float64"))[0])


def agree(message, stop: bool, limit: int = 4096, counts=()):
    """``(first error message of any rank or None, whether any rank asked to stop, indices of uneven counts)``, equal
    on every rank.

    One all-reduce MAX per call of two flags (an error, a stop request such as SIGTERM) and of ``counts`` and their
    negatives: integers every rank must hold alike (the rows of each task in this step), so that a difference is
    seen *before* a collective whose shapes depend on them (NCCL's all-gather with unequal shapes hangs or writes
    past its buffer, where gloo returns garbage or aborts). The messages are all-gathered only when some rank has one.
    """
    counts = [int(c) for c in counts]
    if not is_distributed():
        return message, bool(stop), []
    flags = tensor_from([1 if message else 0, 1 if stop else 0, *counts, *[-c for c in counts]], dtype="int64")
    with activity.collective("the agreement of the ranks on errors and stops (an all-reduce)"):
        dist.all_reduce(flags, op=dist.ReduceOp.MAX)
    values = flags.numpy()
    has_error, stop, n = bool(values[0]), bool(values[1]), len(counts)
    uneven = [i for i in range(n) if values[2 + i] != -values[2 + n + i]]
    if not has_error:
        return None, stop, uneven
    return _first_text(message, limit), stop, uneven


def gather_texts(text: str) -> list:
    """Every rank's ``text``, in rank order, on every rank (one all-gather of the lengths, one of the bytes)."""
    import numpy as np

    if not is_distributed():
        return [text]
    raw = text.encode()
    sizes = []
    with activity.collective("the all-gather of every rank's text"):
        dist.all_gather(sizes, tensor_from([len(raw)], dtype="int64"))
        longest = max(int(s.numpy()[0]) for s in sizes)
        buf = np.zeros(max(longest, 1), dtype=np.uint8)
        buf[:len(raw)] = np.frombuffer(raw, dtype=np.uint8)
        parts = []
        dist.all_gather(parts, tensor_from(buf))
    return [bytes(part.numpy()[:int(size.numpy()[0])]).decode() for part, size in zip(parts, sizes)]


def _first_text(message, limit):
    """The lowest rank's non-empty ``message`` (one all-gather of ``limit`` bytes per rank)."""
    import numpy as np

    buf = np.zeros(limit, dtype=np.uint8)
    raw = (message or "").encode()[:limit]
    buf[:len(raw)] = np.frombuffer(raw, dtype=np.uint8)
    parts = []
    with activity.collective("the all-gather of an error message"):
        dist.all_gather(parts, tensor_from(buf))
    texts = [bytes(part.numpy()).rstrip(b"\0").decode(errors="replace") for part in parts]
    return next((text for text in texts if text), None)


def backend() -> str:
    """The process group's collective backend in lower case (``gloo``, ``nccl``), or ``""`` at world 1 (or when no
    global group exists)."""
    if not is_distributed():
        return ""
    try:
        return str(dist.get_backend()).lower()
    except RuntimeError:  # "The global group is not initialized."
        return ""


@paddle.no_grad()
def all_reduce_flat(tensors, divisor=None):
    """SUM all-reduce of several tensors in one fused buffer, written back in place (``/ divisor`` if given).

    The buffer is float32, or float64 when any tensor is float64 (a float64 run keeps its precision in the
    gradient sync). No-op at world 1 or for an empty list. One collective whatever the number of tensors.
    """
    tensors = list(tensors)
    if not is_distributed() or not tensors:
        return
    dtype = "float64" if any(t.dtype == paddle.float64 for t in tensors) else "float32"
    flat = paddle.concat([t.reshape([-1]).astype(dtype) for t in tensors])
    with activity.collective("an all-reduce of several tensors"):
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    if divisor is not None:
        flat = flat / divisor
    offset = 0
    for t in tensors:
        n = math.prod(t.shape)  # int(t.numel()) would read a device tensor
        t.set_value(flat[offset:offset + n].reshape(t.shape).astype(t.dtype))
        offset += n
