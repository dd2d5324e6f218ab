"""Base class of task-weighting strategies and the small numeric helpers they share.

A strategy sees, once per training step, the global task losses (equal on every rank) and, if it declares
``needs_gradients``, the T x T Gram matrix of the per-task gradients of the shared parameters (already summed over
the processes), or, if it also declares ``needs_gradient_matrix``, the [T, P] matrix of those gradients itself.
Everything here is float64 numpy and deterministic, so that every rank computes bit-identical weights from the same
numbers; random draws come from ``np.random.default_rng([seed, step, constant])``.
"""
import numpy as np

from mtl.core.errors import ConfigError, ParameterError


def check_representation(value) -> bool:
    """The ``representation`` parameter of a Gram-based strategy: true takes the Gram matrix of the gradients with
    respect to the shared representation (the backbone's output: one T x T all-reduce and one backbone backward a
    step, as Sener and Koltun's MGDA-UB and Liu et al.'s IMTL-G compute it) instead of the shared parameters."""
    if not isinstance(value, bool):
        raise ParameterError(f"parameter 'representation' must be true or false, got {value!r}")
    return value


class Weighting:
    """Base class of task-weighting strategies. T tasks in job order; arrays are float64 numpy.

    Capabilities the trainer reads (class attributes, overridden by subclasses):

    * ``needs_gradients``: True when :meth:`combine` must be called with the Gram matrix of per-task gradients.
    * ``needs_gradient_matrix``: True (with ``needs_gradients``) when the strategy needs the [T, P] per-task
      gradient matrix itself: the trainer then calls :meth:`combine_matrix`, which returns the shared gradient.
    * ``sample_mode``: False when the strategy makes no sense with one task per step (``schedule.mode: sample``);
      the job loader then refuses the combination.
    * ``uses_representation``: True when the Gram matrix must be taken over the gradients with respect to the shared
      representation (the backbone's output) instead of the shared parameters (MGDA-UB; IMTL-G's own variant:
      :func:`check_representation`).
    * ``uses_losses``: False when :meth:`weights` depends neither on the losses it is given nor changes the state
      with them (static, RLW): with gradient accumulation the weights of a step are then taken before its
      micro-batches and applied in each micro-batch's backward; otherwise they are taken after the last one from the
      step's losses, and each task's gradient is accumulated apart (``mtl.train.balancing.AccumulatedStep``).
    * ``description``: one line for ``mtl plugins``.

    Subclasses keep all their mutable numbers in ``self.state`` (a dict of numpy arrays and python scalars), which
    makes :meth:`state_dict` and :meth:`set_state_dict` generic.
    """

    needs_gradients = False
    needs_gradient_matrix = False
    uses_losses = True
    sample_mode = True
    uses_representation = False
    description = ""
    registered_name = ""  # set by the registration decorator

    def __init__(self, tasks, loss_weights, seed=0):
        self.tasks = [str(t) for t in tasks]
        if not self.tasks:
            raise ParameterError("tasks must name at least one task")
        self.loss_weights = np.array(loss_weights, dtype=np.float64).reshape(-1)
        if self.loss_weights.shape != (len(self.tasks),):
            raise ParameterError(
                f"loss_weights must hold one value per task ({len(self.tasks)}), got {self.loss_weights.shape[0]}"
            )
        if not np.all(np.isfinite(self.loss_weights)) or np.any(self.loss_weights < 0):
            raise ParameterError(f"loss_weights must be finite and >= 0, got {self.loss_weights.tolist()}")
        self.seed = int(seed)
        self.state = {}

    @property
    def num_tasks(self) -> int:
        """T, the number of tasks of the job."""
        return len(self.tasks)

    @property
    def name(self) -> str:
        """The registered name (the class name for an unregistered subclass)."""
        return self.registered_name or type(self).__name__

    def weights(self, losses, present, step) -> np.ndarray:
        """Return [T] multipliers of each task's loss for this step (0 for absent tasks); may update the state."""
        raise NotImplementedError

    def combine(self, gram, losses, present, step) -> np.ndarray:
        """Return alpha [T]: the shared gradient applied is sum_t alpha_t g_t (only when ``needs_gradients``)."""
        raise NotImplementedError(f"weighting '{self.name}' does not combine gradients (needs_gradients is False)")

    def combine_matrix(self, matrix, losses, present, step) -> np.ndarray:
        """Return the shared gradient [P] from the [T, P] per-task gradients (only when ``needs_gradient_matrix``)."""
        raise NotImplementedError(f"weighting '{self.name}' does not take the gradient matrix "
                                  "(needs_gradient_matrix is False)")

    def state_dict(self) -> dict:
        """A copy of the strategy's state (numpy arrays and python scalars); restoring it is exact."""
        return {key: np.array(value, copy=True) if isinstance(value, np.ndarray) else value
                for key, value in self.state.items()}

    def set_state_dict(self, state):
        """Restore a state saved by :meth:`state_dict` of the same strategy over the same tasks."""
        if set(state) != set(self.state):
            raise ConfigError(
                f"weighting '{self.name}': the saved state holds {sorted(state)}, expected {sorted(self.state)} "
                "(was the checkpoint written by another strategy?)", key="weighting")
        for key, value in state.items():
            if isinstance(self.state[key], np.ndarray):
                value = np.array(value, dtype=self.state[key].dtype, copy=True)
                if value.shape != self.state[key].shape:
                    raise ConfigError(
                        f"weighting '{self.name}': saved state '{key}' has shape {value.shape}, expected "
                        f"{self.state[key].shape} (one value per task: were tasks added or removed?)",
                        key="weighting")
            self.state[key] = value

    # ---- helpers for subclasses -------------------------------------------------------------------------------
    def _present_loss_weights(self, losses, present):
        """loss_weight_t for the present tasks, 0 for the absent ones (the inputs validated): the weights of the
        strategies that leave the losses alone (static, and those that act on the gradients instead)."""
        _, present = self._inputs(losses, present)
        return np.where(present, self.loss_weights, 0.0)

    def _inputs(self, losses, present):
        """Validate and convert (losses, present) to float64 [T] and bool [T]; present losses must be finite."""
        losses = np.asarray(losses, dtype=np.float64).reshape(-1)
        present = np.asarray(present, dtype=bool).reshape(-1)
        if losses.shape != (self.num_tasks,) or present.shape != (self.num_tasks,):
            raise ValueError(
                f"weighting '{self.name}': expected losses and present of length {self.num_tasks}, "
                f"got {losses.shape[0]} and {present.shape[0]}")
        bad = present & ~np.isfinite(losses)
        if bad.any():
            task = self.tasks[int(np.argmax(bad))]
            raise ValueError(f"weighting '{self.name}': the loss of task '{task}' is not finite ({losses[bad][0]})")
        return losses, present

    def _combine_inputs(self, gram, losses, present):
        """``(losses, present, gram, index of the present tasks)``, validated, for a gradient combination."""
        losses, present = self._inputs(losses, present)
        return losses, present, self._gram(gram, present), np.flatnonzero(present)

    def _gram(self, gram, present):
        """Validate the [T, T] Gram matrix; rows and columns of absent tasks are set to 0."""
        gram = np.array(gram, dtype=np.float64)
        if gram.shape != (self.num_tasks, self.num_tasks) or not np.all(np.isfinite(gram)):
            raise ValueError(
                f"weighting '{self.name}': expected a finite {self.num_tasks} x {self.num_tasks} Gram matrix, "
                f"got shape {gram.shape}")
        mask = np.outer(present, present)
        return np.where(mask, 0.5 * (gram + gram.T), 0.0)

    def _rng(self, step, constant):
        """The generator of this strategy's random draws at ``step``: a pure function of (seed, step, constant)."""
        return np.random.default_rng([self.seed, int(step), int(constant)])


def unit_gram(gram, unit_diagonal=True):
    """``(norms, usable, C)`` of a Gram matrix K of task gradients: n_t = ||g_t|| = sqrt(K_tt) (0 where rounding
    made K_tt negative), the indices of the tasks with a non-zero gradient, and the Gram matrix of their unit
    gradients C = K_uu / (n_u n_u^T), whose diagonal is set to exactly 1 with ``unit_diagonal``. The strategies
    that solve on C (IMTL-G, UPGrad, the fair allocations) see angles, not norms."""
    norms = np.sqrt(np.maximum(np.diag(gram), 0.0))
    usable = np.flatnonzero(norms > 0.0)
    n = norms[usable]
    correlation = gram[np.ix_(usable, usable)] / np.outer(n, n)
    if unit_diagonal:
        np.fill_diagonal(correlation, 1.0)
    return norms, usable, correlation


def on_present(solve, gram, index):
    """``solve`` (a function of the Gram matrix of some tasks, returning one weight per task) applied to the rows
    and columns ``index`` of ``gram``: its weights at ``index``, 0 for every other task."""
    alpha = np.zeros(gram.shape[0])
    alpha[index] = solve(gram[np.ix_(index, index)])
    return alpha


def within_norm(alpha, gram, max_norm):
    """``alpha`` scaled down so that the update sum_t alpha_t g_t has norm sqrt(alpha^T K alpha) at most
    ``max_norm`` (0: no limit)."""
    norm = np.sqrt(max(float(alpha @ gram @ alpha), 0.0))
    if max_norm > 0.0 and norm > max_norm:
        alpha = alpha * (max_norm / norm)
    return alpha


def per_task(name, value, num_tasks, low=None, high=None):
    """A parameter given as one number for every task or a list of one number per task, as float64 [T], each
    checked by :func:`check_range`; a list of another length is a ValueError sentence naming ``name``."""
    values = np.atleast_1d(np.asarray(value, dtype=object)).reshape(-1)
    if values.size == 1:
        values = np.repeat(values, num_tasks)
    if values.size != num_tasks:
        raise ParameterError(f"parameter '{name}' must be a number or a list of {num_tasks} numbers "
                             f"(one per task), got {value!r}")
    return np.array([check_range(name, v, low, high) for v in values], dtype=np.float64)


def masked_softmax(logits, present):
    """softmax over the present entries (stable: the maximum is subtracted first); absent entries get 0."""
    out = np.zeros_like(logits, dtype=np.float64)
    if present.any():
        z = logits[present] - np.max(logits[present])
        e = np.exp(z)
        out[present] = e / e.sum()
    return out


def check_range(name, value, low=None, high=None, low_open=False):
    """Return ``float(value)``; raise a ValueError sentence naming ``name`` when it is outside [low, high]."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = float("nan")
    too_low = low is not None and (number <= low if low_open else number < low)
    too_high = high is not None and number > high
    if not np.isfinite(number) or too_low or too_high:
        lower = "" if low is None else f"{'>' if low_open else '>='} {low}"
        upper = "" if high is None else f"<= {high}"
        expected = " and ".join(part for part in (lower, upper) if part) or "a finite number"
        raise ParameterError(f"parameter '{name}' must be a number {expected}, got {value!r}")
    return number


def check_integer(name, value, low):
    """Return ``int(value)``; raise a ValueError sentence naming ``name`` unless it is an integer >= ``low``."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise ParameterError(f"parameter '{name}' must be an integer >= {low}, got {value!r}")
    return int(value)
