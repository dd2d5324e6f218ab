"""The ``mtl`` sub-commands, one module each (``mtl/cli.py`` registers them): the top layer of the library."""
