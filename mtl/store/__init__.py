"""A run's files: checkpoints (``checkpoint.py``: what a step writes and reads back, ``layout.py``: where, and
``integrity.py``: fsync and checksums), re-sharding a checkpoint to another process count (``reshard.py``), the
output folder (``rundir.py``) and its hold (``run_lock.py``)."""
