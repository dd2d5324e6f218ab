"""The ground floor: what every layer above may use and which imports nothing of mtl above it (the plug-in API,
``mtl.errors``, ``mtl.contracts`` and ``mtl.registry``, stays at the top of the package for plug-in files):
arrays and host reads, the console and progress lines, safe readers of pickled files, UTF-8 text, the runtime
(device, threads, process group set-up), low-precision weights, staging folders and small helpers."""
