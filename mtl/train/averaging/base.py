"""What every averager shares: which tensors it tracks (by structured name), apply/restore, and state checks.

A subclass says how to accumulate (``_accumulate``), how to read an average (``_average``) and what its state is;
this base owns the live weights' backup and the guards Paddle's ``ModelAverage`` lacks (nested apply, step during
apply, apply before any step).
"""
from collections.abc import Mapping

import paddle

from mtl.parallel.sync_bn import is_running_statistic
from mtl.train.averaging.storage import DeviceStore, HostStore, is_floating, nbytes


class InvalidOption(ValueError):
    """A constructor argument is out of range; ``key`` names it so a config loader can point at ``averaging.<key>``."""

    def __init__(self, key, message):
        self.key = key
        super().__init__(f"{key}: {message}")


def make_store(offload):
    """The store for ``offload``: None keeps sums next to the parameters, "cpu" keeps them in host memory."""
    if offload is None:
        return DeviceStore()
    if offload == "cpu":
        return HostStore()
    raise InvalidOption("offload", f"expected none or 'cpu', got {offload!r}")


def _named_items(source, what):
    if isinstance(source, Mapping):
        items = list(source.items())
    else:
        items = list(source)
    for item in items:
        if not (isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str)
                and isinstance(item[1], paddle.Tensor)):
            raise TypeError(
                f"{what} must be a Layer, layer.named_parameters() or a dict name -> tensor; got an item of type "
                f"{type(item).__name__} (plain tensors carry auto-generated names that do not survive a restart)")
    return items


def collect_tensors(parameters, buffers=None, average_statistics=False):
    """Split ``parameters`` (and ``buffers``) into (tracked, kept) lists of ``(structured name, tensor)``.

    Tracked: every trainable floating parameter, plus the running statistics when ``average_statistics``.
    Running statistics are BatchNorm's ``_mean``/``_variance`` (non-trainable parameters named so) and every
    floating tensor of ``buffers`` (a Layer's ``named_buffers()`` when ``parameters`` is a Layer and ``buffers`` is
    None). Kept: the other statistics and frozen parameters; ``apply()`` leaves them at their live value (a frozen
    parameter does not move, so its average is its value, and no sums are spent on it). The split is made once,
    here: a parameter frozen at construction stays untracked. Empty tensors (a head shard of 0 classes) are skipped.
    """
    if isinstance(parameters, paddle.nn.Layer):
        if buffers is None:
            buffers = parameters.named_buffers()
        parameters = parameters.named_parameters()
    params = _named_items(parameters, "parameters")
    extra = _named_items(buffers, "buffers") if buffers is not None else []
    tracked, kept, seen_names, seen_ids = [], [], set(), set()
    for index, (name, tensor) in enumerate(params + extra):
        if name in seen_names:
            raise ValueError(f"two tensors share the name {name!r}; averager state is keyed by name")
        if id(tensor) in seen_ids or not is_floating(tensor):
            continue
        if int(tensor.numel()) == 0:  # an empty head shard (fewer classes than ranks): nothing to average, and
            continue                  # copy_ into a 0-size tensor on Paddle 3.3 leaves it without storage
        seen_names.add(name)
        seen_ids.add(id(tensor))
        is_buffer = index >= len(params)
        statistic = is_buffer or is_running_statistic(name, tensor)
        if statistic:
            (tracked if average_statistics else kept).append((name, tensor))
        elif not tensor.stop_gradient:
            tracked.append((name, tensor))
        else:
            kept.append((name, tensor))
    return tracked, kept


class Slot:
    """One tracked tensor and the arrays the averager keeps for it (named by the subclass)."""

    __slots__ = ("name", "param", "arrays")

    def __init__(self, name, param):
        self.name = name
        self.param = param
        self.arrays = {}


class _Applied:
    """Returned by ``apply()``: the averages are already in the weights; leaving the ``with`` block restores."""

    def __init__(self, averager, need_restore):
        self._averager = averager
        self._need_restore = need_restore

    def __enter__(self):
        return self._averager

    def __exit__(self, *exc):
        if self._need_restore:
            self._averager.restore()
        return False


class Averager:
    """Base of the weight averagers: tracked tensors, ``apply()``/``restore()``, state checks.

    Every tracked tensor is accumulated on every ``step()``, whether or not it got a gradient in that step: a
    parameter of a task absent from the step keeps its value, and accumulating that value keeps its average right.
    Nothing is communicated: on a model-parallel head each rank averages its own shard, which is exactly the shard of
    the averaged full weight (averaging is element-wise), so never all-reduce averager state.
    """

    kind = None  # "window" or "ema": written into the state so the other kind refuses it
    peak_copies = 1  # float copies of every tracked tensor at most (sums + the restore copy), for the memory plan
    steady_copies = 1  # the copies held between evaluations once the averager runs (the plan's note)

    @classmethod
    def copies_note(cls) -> str:
        """What the memory plan adds to the averager's line: the plan reserves the peak, the steady state is less."""
        def copies(n):
            return f"{n} cop{'y' if n == 1 else 'ies'}"

        return f"at the peak; {copies(cls.steady_copies)} per parameter in steady state"

    def __init__(self, parameters, offload=None, average_batchnorm=False, buffers=None):
        self._store = make_store(offload)
        self.offload = offload
        self.average_batchnorm = bool(average_batchnorm)
        tracked, kept = collect_tensors(parameters, buffers, self.average_batchnorm)
        self._slots = [Slot(name, tensor) for name, tensor in tracked]
        self.kept_names = [name for name, _ in kept]
        self._backups = None  # name -> live value saved by apply(); None when the live weights are in place

    @property
    def tracked_names(self):
        """Structured names of the tensors this averager averages (the keys of its state)."""
        return [slot.name for slot in self._slots]

    @property
    def applied(self) -> bool:
        """True between ``apply()`` and ``restore()``: the model holds averaged weights."""
        return self._backups is not None

    # -- what a subclass provides -------------------------------------------------------------------------------
    def _accumulate(self):
        raise NotImplementedError

    def _average(self, slot):
        """The average of ``slot`` as a stored array, or None when nothing was accumulated (keep the live value)."""
        raise NotImplementedError

    def _counters(self) -> dict:
        raise NotImplementedError

    def _set_counters(self, state):
        raise NotImplementedError

    # -- public API ---------------------------------------------------------------------------------------------
    def step(self):
        """Accumulate the current value of every tracked tensor (call once after each optimizer step)."""
        if self.applied:
            raise RuntimeError(f"{type(self).__name__}.step() called while averaged weights are applied; "
                               "call restore() first, or the averages would be accumulated into themselves")
        with paddle.no_grad():
            self._accumulate()

    def apply(self, need_restore=True):
        """Write the averages into the tracked tensors now; use as ``with averager.apply(): evaluate()``.

        The live values are saved first (on the device, or in host memory with ``offload="cpu"``) and written back
        by ``restore()``, which leaving the ``with`` block calls unless ``need_restore`` is False. A tensor with
        nothing accumulated yet (before the first step) keeps its live value. A second ``apply()`` before
        ``restore()`` raises RuntimeError instead of overwriting the saved live weights.
        """
        if self.applied:
            raise RuntimeError(f"{type(self).__name__}.apply() called while averaged weights are already applied "
                               "(nested apply or a missing restore()); call restore() first")
        self._backups = {}
        try:
            with paddle.no_grad():
                for slot in self._slots:
                    average = self._average(slot)
                    if average is None:
                        continue
                    self._backups[slot.name] = self._store.backup(slot.param)
                    self._store.write_(slot.param, average)
        except BaseException:
            self.restore()
            raise
        return _Applied(self, need_restore)

    def restore(self):
        """Write the live values saved by ``apply()`` back; a no-op when nothing is applied."""
        if self._backups is None:
            return
        with paddle.no_grad():
            for slot in self._slots:
                saved = self._backups.pop(slot.name, None)
                if saved is not None:
                    self._store.restore_(slot.param, saved)
        self._backups = None

    def nbytes(self) -> dict:
        """Bytes held by the averager's arrays now: ``{"device": n, "host": n}`` (sums and any restore copies)."""
        total = sum(nbytes(a) for slot in self._slots for a in slot.arrays.values())
        total += sum(nbytes(a) for a in (self._backups or {}).values())
        return {"device": 0, "host": total} if self._store.host else {"device": total, "host": 0}

    def state_dict(self) -> dict:
        """Counters and arrays keyed by structured name: ``{"type", <counters>, <array kind>: {name: array}}``.

        Arrays are returned as stored (Paddle tensors, or numpy arrays with offload), without copying; the dict can
        be given to ``paddle.save`` and loaded by another process, into another averager, with or without offload.
        Under model parallelism each rank saves its own shards.
        """
        state = {"type": self.kind, **self._counters()}
        for key in self._array_keys():
            state[key] = {slot.name: slot.arrays[key] for slot in self._slots if slot.arrays.get(key) is not None}
        return state

    def set_state_dict(self, state):
        """Load a ``state_dict()`` (from this or another process); names must match the tracked tensors exactly."""
        if self.applied:
            raise RuntimeError(f"{type(self).__name__}.set_state_dict() called while averaged weights are applied; "
                               "call restore() first")
        if state.get("type") != self.kind:
            raise ValueError(f"averager state of type {state.get('type')!r} cannot be loaded into a "
                             f"{self.kind!r} averager")
        names = set(self.tracked_names)
        for key in self._array_keys():
            present = set(state.get(key, {}))
            if present and present != names:
                missing, unexpected = sorted(names - present), sorted(present - names)
                raise ValueError(f"averager state '{key}' does not match the tracked tensors: missing {missing}, "
                                 f"unexpected {unexpected}")
        for slot in self._slots:
            for key in self._array_keys():
                value = state.get(key, {}).get(slot.name)
                if value is not None and tuple(value.shape) != tuple(slot.param.shape):
                    raise ValueError(f"averager state '{key}' of {slot.name!r} has shape {list(value.shape)}, "
                                     f"the tensor has {list(slot.param.shape)}")
        self._set_counters(state)
        for slot in self._slots:
            slot.arrays = {key: self._store.load(state[key][slot.name], slot.param)
                           for key in self._array_keys() if slot.name in state.get(key, {})}

    def _array_keys(self):
        raise NotImplementedError
