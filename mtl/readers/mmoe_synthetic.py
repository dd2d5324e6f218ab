"""The synthetic benchmark of Ma et al. ("Modeling Task Relationships in Multi-task Learning with Multi-gate
Mixture-of-Experts", KDD 2018, section 4): two regression tasks whose relatedness is set by the cosine of their weight
vectors.

The generator as the paper writes it:
  1. two orthogonal unit vectors u1, u2 in R^d;
  2. for a scale c and a correlation score -1 <= p <= 1: w1 = c u1, w2 = c (p u1 + sqrt(1 - p^2) u2), so that
     cos(w1, w2) = p;
  3. inputs x in R^d with every element drawn from N(0, 1);
  4. labels y_k = w_k^T x + sum_{i=1..m} sin(alpha_i w_k^T x + beta_i) + eps_k, eps_k ~ N(0, 0.01) (the paper's
     variance 0.01: ``noise`` is its standard deviation, 0.1).
The constants the paper leaves open, as chosen here: d = 100 (``dimension``); c = 1 (``scale``: w_k^T x ~ N(0, 1),
so the sines' arguments stay of the order of alpha); m = 10 sines (``sines``) with alpha_i, beta_i ~ N(0, 1) drawn
once from ``shape_seed`` (the same "given parameters" for every run and both tasks, so that only the data and the
initialisation differ between runs, as in the paper's repeated runs); ten sines of unit frequency give the labels a
nonlinear part (label variance about 8 with these constants, 1 of it linear) that a model must learn. The Pearson
correlation of the labels is then below p (0.27 at p = 0.5, 0.77 at 0.9, 0.999 at 1: noise): "it's not
straightforward to generate tasks with a given Pearson correlation" (the paper) and the cosine is the knob.
``seed`` draws u1, u2, the inputs and the noise; the readers of both tasks with the same seed read the same inputs
(sample i is the same x) and differ in the label (``task``: 0 or 1). ``split: train`` gives ``num_samples`` inputs,
the evaluation split ``eval_samples`` other ones.
"""
import numpy as np

from mtl.core.contracts import Field
from mtl.core.errors import ConfigError
from mtl.core.registry import register_reader
from mtl.readers.base import Reader


def orthonormal_pair(rng, dimension):
    """Two orthogonal unit vectors of R^d (Gram-Schmidt of two Gaussian vectors)."""
    u1 = rng.randn(dimension)
    u1 /= np.linalg.norm(u1)
    u2 = rng.randn(dimension)
    u2 -= (u2 @ u1) * u1
    return u1, u2 / np.linalg.norm(u2)


def task_weights(u1, u2, correlation, scale):
    """[2, d]: w1 = c u1, w2 = c (p u1 + sqrt(1 - p^2) u2)."""
    return scale * np.stack([u1, correlation * u1 + np.sqrt(1.0 - correlation ** 2) * u2])


def labels(inputs, weights, alpha, beta, noise):
    """[N, 2]: y_k = w_k^T x + sum_i sin(alpha_i w_k^T x + beta_i) + noise_k (float64)."""
    s = inputs @ weights.T  # [N, 2]
    return s + np.sin(s[..., None] * alpha + beta).sum(axis=-1) + noise


@register_reader("mmoe_synthetic")
class MMoESyntheticReader(Reader):
    """Ma et al.'s two regression tasks with correlation score ``correlation`` (the cosine of their weights).

    Parameters:
        correlation (float): p, the correlation score in [-1, 1]: the cosine of the two tasks' weight vectors w1 and
            w2 (the labels' Pearson correlation is lower: 0.27 at p = 0.5, 0.77 at 0.9)
        task (int): the task whose label y_k the reader gives as target: 0 (y_1, weights w1 = c u1) or 1 (y_2)
        seed (int): seed of u1, u2, the inputs and the noise: the readers of both tasks with the same seed read the
            same inputs (sample i is the same x)
        num_samples (int): inputs of split train
        eval_samples (int): inputs of the evaluation split (other ones than the training split's)
        dimension (int): d, the dimension of the inputs x and of the weights w_k (at least 2)
        scale (float): c, the norm of both weight vectors (w_k^T x ~ N(0, c^2))
        sines (int): m, the sine terms sin(alpha_i w_k^T x + beta_i) added to each label
        noise (float): standard deviation of the label noise eps_k (the paper's variance 0.01: 0.1); 0: none
        shape_seed (int): seed of the sines' alpha_i, beta_i ~ N(0, 1), the same for both tasks (the paper's "given
            parameters": keep it across repeated runs, vary seed)
        input_field (str): name of the input field x, float32 [dimension] (the label is field target, [1])
    """

    num_outputs = 1

    def __init__(self, correlation: float, task: int = 0, seed: int = 0, num_samples: int = 10000,
                 eval_samples: int = 2000, split: str = "train", dimension: int = 100, scale: float = 1.0,
                 sines: int = 10, noise: float = 0.1, shape_seed: int = 0, input_field: str = "features"):
        if isinstance(correlation, bool) or not isinstance(correlation, (int, float)) or not -1 <= correlation <= 1:
            raise ConfigError(f"correlation must be a number in [-1, 1], got {correlation!r}", key="correlation")
        if task not in (0, 1):
            raise ConfigError(f"task must be 0 or 1 (the first or the second regression task), got {task!r}",
                              key="task")
        for key, value in (("num_samples", num_samples), ("eval_samples", eval_samples), ("dimension", dimension),
                           ("sines", sines)):
            if isinstance(value, bool) or not isinstance(value, int) or value < (2 if key == "dimension" else 1):
                raise ConfigError(f"must be a positive integer{' >= 2' if key == 'dimension' else ''}, got {value!r}",
                                  key=key)
        shape = np.random.RandomState(shape_seed)
        self.alpha, self.beta = shape.randn(sines), shape.randn(sines)
        rng = np.random.RandomState(seed)
        u1, u2 = orthonormal_pair(rng, dimension)
        self.weights = task_weights(u1, u2, float(correlation), float(scale))
        count = num_samples if split == "train" else eval_samples
        stream = np.random.RandomState([seed, 0 if split == "train" else 1])
        inputs = stream.randn(count, dimension)
        y = labels(inputs, self.weights, self.alpha, self.beta, float(noise) * stream.randn(count, 2))
        self.inputs = inputs.astype(np.float32)
        self.targets = y[:, task:task + 1].astype(np.float32)
        self.input_field = input_field

    def fields(self):
        return [Field(self.input_field, (self.inputs.shape[1],), "float32"), Field("target", (1,), "float32")]

    def __len__(self):
        return len(self.inputs)

    def labels(self):
        """The task's labels [N, 1] (float32)."""
        return self.targets

    def __getitem__(self, index):
        return {self.input_field: self.inputs[index], "target": self.targets[index]}
