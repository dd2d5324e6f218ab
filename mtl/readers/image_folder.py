"""Face images in a folder per person (LFW's layout, and most users' own data), keeping a chosen set of people."""
import os

import numpy as np

from mtl.core.errors import ConfigError, DataError
from mtl.core.registry import register_reader
from mtl.readers._face import FaceImageReader
from mtl.readers.base import MissingFile

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".pgm", ".ppm", ".tif", ".tiff", ".webp")


def person_images(folder: str):
    """The image files of one person's folder, sorted by name (other files and sub-folders are ignored)."""
    return sorted(f for f in os.listdir(folder)
                  if f.lower().endswith(IMAGE_EXTENSIONS) and os.path.isfile(os.path.join(folder, f)))


def _set_numbers(value, key, count, people_path):
    """``value`` as a set of 1-based set numbers of a people file of ``count`` sets (a ConfigError otherwise)."""
    items = [value] if isinstance(value, int) and not isinstance(value, bool) else value
    if not isinstance(items, (list, tuple)) or not items or not all(
            isinstance(v, int) and not isinstance(v, bool) for v in items):
        raise ConfigError(f"{key} must be a set number or a list of them (from 1), got {value!r}", None, key)
    bad = [v for v in items if not 1 <= v <= count]
    if bad:
        raise ConfigError(f"{key} names set(s) {bad}, but people file '{people_path}' holds sets 1 to {count}", None,
                          key)
    return set(items)


def chosen_people(people_path, sets=None, exclude_sets=None):
    """The people (``mtl.data.lfw.Person``) of the chosen sets of a people file: ``sets`` (default all) minus
    ``exclude_sets`` ("every set but k")."""
    from mtl.data.lfw import read_people

    all_sets = read_people(people_path)
    keep = set(range(1, len(all_sets) + 1)) if sets is None else _set_numbers(sets, "sets", len(all_sets),
                                                                                   people_path)
    if exclude_sets is not None:
        keep -= _set_numbers(exclude_sets, "exclude_sets", len(all_sets), people_path)
    if not keep:
        raise ConfigError(f"sets and exclude_sets leave no set of people file '{people_path}'", None, "exclude_sets")
    return [person for k in sorted(keep) for person in all_sets[k - 1]]


@register_reader("image_folder")
class ImageFolderReader(FaceImageReader):
    """One sub-folder of ``root`` per person (``root/Name/*.jpg``): the people are labelled 0..K-1 in the order of
    their sorted folder names, and named by them.

    Which people: every folder, or those of a people file (``people``: LFW's format, one set as in
    ``peopleDevTrain.txt`` or ten as in ``people.txt``), of its ``sets`` (numbers from 1; default all) minus
    ``exclude_sets`` (View 2's training people of set k: ``exclude_sets: [k]``); then those with at least
    ``min_images`` images. A person of the people file without a folder, or with fewer images than the file
    says, is an error naming the file's line. The other parameters are those of every face reader
    (``holdout_classes``, ``augment``, ``preprocess``, ...).

    Parameters:
        root (str): the folder of person folders
        people (str): a people file (LFW's format) naming the people to keep (default: every folder)
        sets (list): the sets of the people file to keep, numbered from 1 (default: all)
        exclude_sets (list): sets of the people file to leave out ("every set but k")
        min_images (int): keep only people with at least this many images
    """

    def __init__(self, root, people=None, sets=None, exclude_sets=None, min_images=1, split="train",
                 eval_fraction=0.0, num_classes=None, image_size=112, flip=None, on_bad_sample="error", seed=0,
                 image_field="image", label_field="label", decoder="auto", augment=None, holdout_classes=None,
                 max_positive_pairs=3000, preprocess=None):
        self.source = f"image_folder '{root}'"
        self._check_options(split, eval_fraction, image_size, flip, on_bad_sample, seed, image_field, label_field,
                            decoder, augment, holdout_classes, max_positive_pairs, preprocess)
        self.root = str(root)
        if not os.path.isdir(self.root):
            raise MissingFile(self.root, "image folder", key="root")
        if isinstance(min_images, bool) or not isinstance(min_images, int) or min_images < 1:
            raise ConfigError(f"min_images must be a whole number >= 1, got {min_images!r}", None, "min_images")
        if people is None and (sets is not None or exclude_sets is not None):
            raise ConfigError("sets and exclude_sets choose sets of a people file: name it with people", None,
                              "people")
        if people is not None and not os.path.isfile(str(people)):
            raise MissingFile(str(people), "people file", key="people")
        names, files = self._people(people, sets, exclude_sets, min_images)
        self.people_path = None if people is None else str(people)
        self._names = names
        paths = [f"{name}/{f}" for name, images in zip(names, files) for f in images]
        labels = np.repeat(np.arange(len(names), dtype=np.float64), [len(f) for f in files])
        # one numpy bytes array, not a list of str: forked workers then share it without copy-on-write churn
        self._paths = np.array([p.encode("utf-8") for p in paths], dtype=np.bytes_)
        self._finish(np.arange(len(paths)), labels, {}, num_classes=num_classes)

    def _people(self, people_path, sets, exclude_sets, min_images):
        """``(names, image files per person)`` of the kept people, in sorted name order."""
        if people_path is None:
            names = sorted(d for d in os.listdir(self.root) if os.path.isdir(os.path.join(self.root, d)))
            listed = {name: None for name in names}
        else:
            listed = {}
            for person in chosen_people(str(people_path), sets, exclude_sets):
                listed.setdefault(person.name, person)
        kept_names, kept_files = [], []
        for name in sorted(listed):
            folder = os.path.join(self.root, name)
            person = listed[name]
            if not os.path.isdir(folder):
                raise DataError(f"people file '{people_path}' line {person.line}: '{name}' has no folder under "
                                f"'{self.root}'")
            images = person_images(folder)
            if person is not None and len(images) < person.images:
                raise DataError(f"people file '{people_path}' line {person.line}: '{name}' has {person.images} "
                                f"images listed, but '{folder}' holds {len(images)}")
            if len(images) >= min_images:
                kept_names.append(name)
                kept_files.append(images)
        if not kept_names:
            raise DataError(f"{self.source}: no person with at least {min_images} image(s)"
                            + (f" among the chosen people of '{people_path}'" if people_path else ""))
        return kept_names, kept_files

    def _data_class_names(self):
        """The people's folder names, in label order."""
        return list(self._names)

    def _names_hint(self) -> str:
        return "its folder names"

    def sample_files(self):
        """The absolute path of every sample's image, in sample order (``root/Name/file``)."""
        return [os.path.abspath(os.path.join(self.root, self._relative(int(c)))) for c in self._candidates]

    def _relative(self, candidate: int) -> str:
        """The image's path under ``root`` (``Name/Name_0001.jpg``)."""
        return self._paths[candidate].decode("utf-8")

    def _describe(self, candidate: int) -> str:
        return f"image folder '{self.root}' image '{self._relative(candidate)}'"

    def _load_bytes(self, candidate: int) -> bytes:
        path = os.path.join(self.root, self._relative(candidate))
        try:
            with open(path, "rb") as f:
                return f.read()
        except OSError as exc:
            raise DataError(f"{self._describe(candidate)}: cannot read '{path}': {exc.strerror}") from None
