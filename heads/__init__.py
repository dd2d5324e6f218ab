"""Head plug-ins: one head per module; every module here is imported by ``mtl.registry.load_builtin``."""
