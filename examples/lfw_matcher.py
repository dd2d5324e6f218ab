"""An independent face matcher for the LFW report's filter (``--filter-model dlib``): dlib's ResNet face descriptor
(128-d, trained by dlib's author on about 3 million faces; 99.38 % on LFW by his report), aligned by dlib's 5-point
landmark predictor, both from the ``face_recognition_models`` package (pinned with its sha256 in
requirements-lfw.txt, installed at set-up; nothing is downloaded at run time).

Why: the filter must find, from the faces alone, which outside people are test people of a split, among the
thousands of LFW people. The toolkit's CPU-scale models (a 32 x 32 CNN, about 0.86 on View 1) tell two photographs
of one person apart from two people's well enough for verification, but not well enough to pick one person out of
thousands across two datasets (docs/lfw.md gives the figures). The matcher only decides what is removed and which
classes are one person; no arm's model ever sees it.

Each image is a face crop already (LFW deep-funneled, Glint360K aligned): it is upsampled to 224 x 224, the
landmarks are found inside a fixed box, and the descriptor is computed on dlib's 150 x 150 chip. Descriptors are
cached per image file (``embeddings_dlib.npz`` in the report's filter folder), so View 2's ten splits embed every
image once.
"""
import os

import numpy as np

from mtl.core.errors import ConfigError

INSTALL = "pip install -r requirements-lfw.txt"
BOX = (30, 30, 194, 194)  # the face's box in the 224 x 224 upsampled crop, where the landmark search starts


class DlibMatcher:
    """Descriptors of image files by dlib's face recognition ResNet, cached on disk."""

    def __init__(self, cache_path):
        try:
            import dlib
            import face_recognition_models as models
        except ImportError:
            raise ConfigError(f"--filter-model dlib needs dlib and its face models: {INSTALL}") from None
        self.dlib = dlib
        self.shape = dlib.shape_predictor(models.pose_predictor_five_point_model_location())
        self.net = dlib.face_recognition_model_v1(models.face_recognition_model_location())
        self.cache_path = cache_path
        self.cache = {}
        if os.path.isfile(cache_path):
            with np.load(cache_path, allow_pickle=False) as saved:
                self.cache = dict(zip(saved["paths"].tolist(), saved["features"]))

    def describe(self, path):
        """The 128-d descriptor of one face crop."""
        from PIL import Image

        with Image.open(path) as image:
            rgb = np.asarray(image.convert("RGB").resize((224, 224), Image.BICUBIC))
        landmarks = self.shape(rgb, self.dlib.rectangle(*BOX))
        return np.array(self.net.compute_face_descriptor(rgb, landmarks, 0), dtype=np.float64)

    def features(self, paths, progress=None):
        """``[N, 128]`` descriptors of ``paths`` (from the cache where it has them; the cache is saved after)."""
        missing = [p for p in paths if p not in self.cache]
        for i, path in enumerate(missing):
            self.cache[path] = self.describe(path)
            if progress and (i + 1) % 500 == 0:
                progress(f"dlib descriptors: {i + 1} of {len(missing)} images")
        if missing:
            self.save()
        return np.stack([self.cache[p] for p in paths])

    def save(self):
        """Write the cache (under a temporary name, then renamed)."""
        temporary = self.cache_path + ".tmp.npz"
        paths = sorted(self.cache)
        np.savez(temporary, paths=np.array(paths), features=np.stack([self.cache[p] for p in paths]))
        os.replace(temporary, self.cache_path)
