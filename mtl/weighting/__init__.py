"""Task-weighting strategies (loss-, Gram- and gradient-matrix-based): every module of this package is imported by
``mtl.core.registry.load_builtin``.

``base`` holds the interface; ``loss_based``, ``imtl_l`` and ``stch`` the strategies that only see the task losses;
``gradient_based``, ``min_norm``, ``nash_mtl``, ``fairgrad``, ``imtl_g``, ``aligned_mtl``, ``upgrad`` and
``gradvac`` the ones that combine per-task gradients through their Gram matrix; ``matrix_based``, ``graddrop`` and
``db_mtl`` the ones that need the per-task gradient matrix itself; ``simplex`` and ``allocation`` the solvers they
share.
"""
