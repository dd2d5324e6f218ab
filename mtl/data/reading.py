"""Which sample each reading process is reading now, so that a data loader that stops delivering can be named with the
task, the sample and its file (:mod:`mtl.train.watchdog`).

The board is a small array in shared memory, created with the step dataset before the DataLoader starts its worker
processes (they inherit it): one slot per process (slot 0: the training process itself, ``num_workers: 0``; slot
``1 + id``: worker ``id``), each ``[step + 1, task index, sample index, time]`` of the sample it began last (step 0:
idle). Marking a sample costs four stores into the array; the words (and the reader's file list) are made only
when the watchdog asks.
"""
import multiprocessing
import os
import time

SLOTS = 65  # the training process and 64 workers (worker ids past 63 share slots)
FIELDS = 4


class ReadingBoard:
    """The shared slots of the module docstring, for the tasks ``tasks`` (in order) read by ``readers``."""

    def __init__(self, tasks, readers):
        self.tasks = list(tasks)
        self.readers = readers
        self.cells = multiprocessing.RawArray("d", SLOTS * FIELDS)
        self._pid, self._slot = None, 0
        self._files = {}

    def __getstate__(self):  # a spawned worker (not Linux's fork) gets a board of its own: nothing is shared then
        return {"tasks": self.tasks, "readers": self.readers}

    def __setstate__(self, state):
        self.__init__(state["tasks"], state["readers"])

    def _own_slot(self) -> int:
        pid = os.getpid()
        if pid != self._pid:
            import paddle

            info = paddle.io.get_worker_info()
            self._pid, self._slot = pid, 0 if info is None else 1 + info.id % (SLOTS - 1)
        return self._slot

    def mark(self, step: int, task: str, index: int):
        """This process begins sample ``index`` of ``task`` for the 0-based ``step``."""
        base = self._own_slot() * FIELDS
        cells = self.cells
        cells[base + 1], cells[base + 2], cells[base + 3] = self.tasks.index(task), index, time.time()
        cells[base] = step + 1

    def done(self, step: int):
        """This process finished reading the 0-based ``step``."""
        base = self._own_slot() * FIELDS
        if self.cells[base] == step + 1:
            self.cells[base] = 0

    def reading(self, step: int):
        """``(task, sample index, seconds since it began)`` of the sample being read for the 0-based ``step`` by any
        process (the one begun last), or None."""
        found = None
        for slot in range(SLOTS):
            base = slot * FIELDS
            if self.cells[base] == step + 1 and (found is None or self.cells[base + 3] > found[2]):
                found = (self.tasks[int(self.cells[base + 1])], int(self.cells[base + 2]), self.cells[base + 3])
        return None if found is None else (found[0], found[1], max(0.0, time.time() - found[2]))

    def describe(self, step: int):
        """Words for the sample being read for the 0-based ``step``: ``task 'faces', reader 'image_list', sample 17,
        file /data/a.png``; the file when the reader knows its samples' files; None when no process reads it."""
        now = self.reading(step)
        if now is None:
            return None
        task, index, _ = now
        reader = self.readers[task]
        name = reader.registered_name or type(reader).__name__
        words = f"task '{task}', reader '{name}', sample {index}"
        file = self._file(task, index)
        return f"{words}, file {file}" if file else words

    def _file(self, task, index):
        if task not in self._files:
            try:
                self._files[task] = self.readers[task].sample_files()
            except Exception:  # noqa: BLE001 - a report must not fail on the words it adds
                self._files[task] = None
        files = self._files[task]
        return files[index] if files is not None and 0 <= index < len(files) else None
