"""Job and task configuration: the schema of every key, loading, ``--set`` overrides, validation at load time."""
from mtl.config.loading import load_job
from mtl.config.overrides import apply_overrides

__all__ = ["apply_overrides", "load_job"]
