"""The job's optimizer: Paddle's dense optimizer with the learning-rate schedule and the row-sparse update of
the rows heads declare (``joint.py``), and the row-sparse update itself (``sparse.py``)."""
