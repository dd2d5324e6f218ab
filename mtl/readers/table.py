"""scikit-learn's bundled tabular data sets (iris, wine, breast cancer, diabetes, linnerud) as a reader."""
from mtl.core.errors import ConfigError
from mtl.core.registry import did_you_mean, register_reader
from mtl.readers._tabular import TableReader

# name -> (sklearn loader, kind): kind "class" gives label/labels, "regression" gives target
DATASETS = {
    "iris": ("load_iris", "class"),                    # 150 rows, 4 features, 3 classes
    "wine": ("load_wine", "class"),                    # 178 rows, 13 features, 3 classes
    "breast_cancer": ("load_breast_cancer", "class"),  # 569 rows, 30 features, 2 classes
    "diabetes": ("load_diabetes", "regression"),       # 442 rows, 10 features, 1 target
    "linnerud": ("load_linnerud", "regression"),       # 20 rows, 3 features (exercises), 3 targets (body)
}


@register_reader("table")
class SklearnTableReader(TableReader):
    """scikit-learn's bundled tables (iris, wine, breast_cancer, diabetes, linnerud): features and class or targets.

    ``dataset`` names the table. A deterministic split holds out ``eval_fraction`` of the rows (stratified by class
    for the classification tables, seeded by ``seed``); features, and regression targets when
    ``standardize_targets``, are standardised with the mean and std of the training split only. ``pad_to`` zero-pads
    the features to a common width, so tables of different widths can share one ``mlp`` backbone
    (``input_shape: [pad_to]``, ``input_field: features``). Nothing is downloaded: the tables ship with scikit-learn.

    Parameters:
        dataset (str): iris, wine, breast_cancer (classes) or diabetes, linnerud (regression)
    """

    def __init__(self, dataset, split="train", eval_fraction=0.25, seed=0, standardize=True,
                 standardize_targets=True, pad_to=None, feature_field="features"):
        if dataset not in DATASETS:
            raise ConfigError(f"unknown dataset {dataset!r}{did_you_mean(dataset, DATASETS)}; bundled tables: "
                              f"{', '.join(DATASETS)}", key="dataset")
        import sklearn.datasets

        loader, kind = DATASETS[dataset]
        bunch = getattr(sklearn.datasets, loader)()
        self.dataset = dataset
        self.feature_names = [str(n) for n in bunch.feature_names]
        classes = bunch.target.astype("int64") if kind == "class" else None
        targets = bunch.target if kind == "regression" else None
        self.target_names = ([str(n) for n in bunch.target_names] if kind == "class" or dataset == "linnerud"
                             else ["target"])
        self.class_names = self.target_names if kind == "class" else None
        self.output_names = self.target_names if kind == "regression" else None
        self._build(bunch.data, classes, targets, split, eval_fraction, seed, standardize, standardize_targets,
                    pad_to, feature_field)
