"""Classic face-verification baselines without training a network: raw pixels, PCA (eigenfaces), Fisherfaces.

Each baseline maps flattened images ``[N, P]`` to embeddings that the open-set protocol compares (unit vectors,
squared L2 distance, 10 folds). PCA and Fisherfaces are fitted on the training people only and then embed people
they never saw, like the networks they are compared with.

* **Pixels**: the image itself, ``x``.
* **PCA** (Turk and Pentland, "Eigenfaces for recognition", J. Cognitive Neuroscience 3(1), 1991): ``W^T (x - mu)``
  with ``W`` the leading principal directions of the training images that explain ``variance`` (default 95 %) of
  their variance.
* **Fisherfaces** (Belhumeur, Hespanha and Kriegman, "Eigenfaces vs. Fisherfaces", IEEE PAMI 19(7), 1997):
  ``W_fld^T W_pca^T (x - mu)``. ``W_pca`` keeps at most ``N - c`` principal directions of the N training images of
  c people (so that the within-class scatter ``S_w`` is not singular): all ``N - c`` as in the paper
  (``variance=None``), or those that explain ``variance`` of the training variance (directions of no variance are
  dropped either way). The paper's ``N - c`` fits the training people's noise and verifies unseen people badly
  (0.56-0.83 on the six datasets' validation people, against 0.81-0.93 at 90 %); then ``W_fld`` holds the ``c - 1``
  directions that maximise ``|W^T S_b W| / |W^T S_w W|``: the generalised eigenvectors ``S_b w = lambda S_w w``,
  scaled so that the within-class scatter is the identity (scikit-learn's ``LinearDiscriminantAnalysis``, solver
  ``svd``, which also copes with a nearly singular ``S_w``). The PCA step centres by the training mean, so the
  embedding is centred too.
"""
import numpy as np


def flatten(images) -> np.ndarray:
    """``[N, ...]`` images as float64 rows ``[N, P]``."""
    images = np.asarray(images)
    return images.reshape(len(images), -1).astype(np.float64)


class PixelBaseline:
    """The pixels themselves (nothing to fit)."""

    name = "pixels"

    def fit(self, images, labels):
        """Nothing to learn; returns self."""
        return self

    def transform(self, images) -> np.ndarray:
        """``[N, P]`` rows of the images."""
        return flatten(images)


class PCABaseline:
    """Eigenfaces: projection on the principal directions of the training images that explain ``variance``."""

    name = "pca"

    def __init__(self, variance: float = 0.95):
        if not 0.0 < float(variance) <= 1.0:
            raise ValueError(f"variance must be in (0, 1], got {variance!r}")
        self.variance = float(variance)

    def fit(self, images, labels=None):
        """Fit the mean and the principal directions on the training images."""
        from sklearn.decomposition import PCA

        x = flatten(images)
        self.pca = PCA(n_components=self.variance if self.variance < 1.0 else None, svd_solver="full").fit(x)
        return self

    def transform(self, images) -> np.ndarray:
        """``W^T (x - mu)``."""
        return self.pca.transform(flatten(images))


class FisherfacesBaseline:
    """Fisherfaces: PCA to at most N - c dimensions, then Fisher's linear discriminant to c - 1 dimensions.

    ``variance`` 0.9 by default: of the paper's N - c and 0.8, 0.9, 0.95, 0.99, the best mean verification over the
    six face datasets' validation people (0.863, against 0.718, 0.819, 0.857 and 0.841), so that the baseline the
    networks are compared with is as strong as it honestly gets."""

    name = "fisherfaces"

    def __init__(self, variance=0.9):
        if variance is not None and not 0.0 < float(variance) < 1.0:
            raise ValueError(f"variance must be None (N - c directions) or in (0, 1), got {variance!r}")
        self.variance = variance

    def fit(self, images, labels):
        """Fit PCA (at most N - c directions) and the discriminant directions on the training images of c people."""
        from sklearn.decomposition import PCA
        from sklearn.discriminant_analysis import LinearDiscriminantAnalysis

        x, labels = flatten(images), np.asarray(labels).reshape(-1)
        people = len(np.unique(labels))
        if people < 2 or len(x) <= people:
            raise ValueError(f"Fisherfaces needs at least two people and more images than people; got {len(x)} "
                             f"images of {people} people")
        components = min(len(x) - people, x.shape[1])
        self.pca = PCA(n_components=components, svd_solver="full").fit(x)
        # directions of no variance (per-image standardisation removes some) would make S_w singular
        self.kept = int(min(components, np.sum(self.pca.explained_variance_ratio_ > 1e-10)))
        if self.variance is not None:  # the leading directions that explain ``variance``, at most N - c
            cumulative = np.cumsum(self.pca.explained_variance_ratio_)
            self.kept = min(int(np.searchsorted(cumulative, self.variance)) + 1, self.kept)
        self.lda = LinearDiscriminantAnalysis(solver="svd").fit(self._project(x), labels)
        self.dimensions = people - 1
        return self

    def _project(self, x):
        return self.pca.transform(x)[:, :self.kept]

    def transform(self, images) -> np.ndarray:
        """``W_fld^T W_pca^T (x - mu)`` (the c - 1 discriminant coordinates)."""
        return self.lda.transform(self._project(flatten(images)))[:, :self.dimensions]


BASELINES = {"pixels": PixelBaseline, "pca": PCABaseline, "fisherfaces": FisherfacesBaseline}
