"""Data machinery: the step schedule, step batches, record formats (RecordIO, verification sets), image transforms
and preprocessing.

Reader plug-ins live in :mod:`mtl.readers`; the ``mtl data`` command in :mod:`mtl.commands.data`.
"""
