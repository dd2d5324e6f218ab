"""Data machinery: the step schedule, step batches, record formats, image transforms and the ``mtl data`` tools.

Reader plug-ins live in :mod:`mtl.readers`.
"""
