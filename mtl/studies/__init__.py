"""Studies of jobs and finished runs, the libraries behind ``mtl baseline``, ``mtl compare`` and ``mtl overlap``
(which ``bench/`` and ``examples/`` use too): single-task baselines and the multi-task gain, runs side by side, and
the identities two heads of a run share. They train, load runs and embed data: the application floor, beside
``mtl.train.job``; ``mtl/commands/`` holds the shells that parse the command lines."""
