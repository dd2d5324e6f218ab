"""Built-in readers; every module of this package is imported by ``mtl.core.registry.load_builtin``."""
