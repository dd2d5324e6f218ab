"""Studies of jobs and finished runs, the libraries behind ``mtl baseline``, ``mtl compare``, ``mtl overlap`` and
``mtl eval --all-people`` (which ``bench/`` and ``examples/`` use too): single-task baselines and the multi-task
gain, runs side by side, the identities two heads of a run share, and every held-out person of a run scored
together. They train, load runs and embed data: the floor above ``mtl.train``; ``mtl/commands/`` holds the shells
that parse the command lines."""
