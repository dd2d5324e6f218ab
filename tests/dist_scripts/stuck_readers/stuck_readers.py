"""Readers that stop delivering, or deliver slowly, on purpose (for the watchdog and disk-fault tests): reading one
sample blocks forever, as a read from a dead network filesystem does; or every sample takes a while."""
import os
import threading
import time

from mtl.core.registry import register_reader
from mtl.readers.synthetic import SyntheticReader


@register_reader("blocking_synthetic")
class BlockingReader(SyntheticReader):
    """Synthetic samples, each named as a file ``/data/faces/NNNN.png``; sample ``bad_index`` never returns while
    the file ``block_while`` exists (a test removes it to let a resumed run read on)."""

    def __init__(self, bad_index=5, block_while="", **kwargs):
        super().__init__(**kwargs)
        self.bad_index, self.block_while = int(bad_index), str(block_while)

    def sample_files(self):
        return [f"/data/faces/{i:04d}.png" for i in range(len(self))]

    def __getitem__(self, index):
        if index == self.bad_index and os.path.exists(self.block_while):
            threading.Event().wait()  # forever
        return super().__getitem__(index)


@register_reader("slow_synthetic")
class SlowReader(SyntheticReader):
    """Synthetic samples that take ``delay`` seconds each to read (a test changes the disk between two steps); with
    ``slow_rank`` only on that rank (the others then wait for it in every step's collectives); ``busy``: computing
    for ``delay`` seconds of the thread's CPU time instead of sleeping (a decoder's work, which takes longer when the
    process gets less CPU)."""

    def __init__(self, delay=0.02, slow_rank=None, busy=False, **kwargs):
        super().__init__(**kwargs)
        here = int(os.environ.get("PADDLE_TRAINER_ID", "0"))
        self.delay = float(delay) if slow_rank is None or int(slow_rank) == here else 0.0
        self.busy = bool(busy)

    def __getitem__(self, index):
        if self.busy:
            end = time.thread_time() + self.delay
            while time.thread_time() < end:
                pass
        else:
            time.sleep(self.delay)
        return super().__getitem__(index)
