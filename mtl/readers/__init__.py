"""Built-in readers; every module of this package is imported by ``mtl.registry.load_builtin``."""
