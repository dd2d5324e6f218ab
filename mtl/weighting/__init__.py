"""Task-weighting strategies (issue #9): every module of this package is imported by ``mtl.registry.load_builtin``.

``base`` holds the interface; ``loss_based`` the strategies that only see the task losses; ``gradient_based`` and
``min_norm`` the ones that combine per-task gradients through their Gram matrix; ``simplex`` the solvers they share.
"""
