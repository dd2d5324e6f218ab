"""Dataset writers: RecordIO packs (``mtl data pack``) and merged datasets (``mtl data merge``), above the readers
whose label files they write."""
