"""Job and task configuration: the schema of every key, loading, ``--set`` overrides, validation at load time."""
from mtl.config.loading import apply_overrides, load_job

__all__ = ["apply_overrides", "load_job"]
