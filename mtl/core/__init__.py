"""The ground floor: what every layer above may use and which imports nothing of mtl above it.

The plug-in API (``errors``, ``contracts``: the fields a reader gives and a head takes, ``registry``: the decorators
that register readers, backbones, heads, weightings and architectures), arrays and host reads, the console and
progress lines, safe readers of pickled files, UTF-8 text, the runtime (device, threads, process group set-up),
low-precision weights, staging folders and small helpers."""
