"""The LFW report's filter stage: with a split's ``lfw_alone`` model, find the outside classes that are test people of
the split, remove them, and estimate the same-person pairs (:mod:`mtl.evaluation.contamination`).

Writes into the unit's filter folder: ``removed.json`` (each removed class, the test person it matched, the score),
``pairs.json`` (the same-person pairs in ``mtl overlap --json``'s form, outside against LFW's training people and
inside the outside data: what ``cross`` masks and ``dedup`` merges), ``decision.json`` (all of it, with the
threshold), ``kept.txt`` (the outside classes kept, a people file of LFW's format) and ``merged/`` (the label lists
of ``naive``, every person distinct, and of ``dedup``, merged by the pairs).
"""
import json
import os
import shutil

import numpy as np
from lfw_arms import LFW, OUTSIDE

from mtl.core.errors import DataError


def build_reader(root, people, image_size, task, **more):
    """An ``image_folder`` reader of ``root``'s people (a people-file option mapping), prepared as ``task``'s images
    (its crop and lighting), augmentation off."""
    from mtl.readers.image_folder import ImageFolderReader

    options = {k: v for k, v in task["reader"].items() if k in ("preprocess", "decoder")}
    return ImageFolderReader(root, image_size=image_size, split="train", flip=False, **people, **options, **more)


def identities(name, model, field, reader, per_class):
    """The templates of ``reader``'s classes by the run's model (``model`` a Paddle layer, ``field`` its input)."""
    from mtl.evaluation.contamination import Identities

    return Identities.of_reader(name, model, [field], reader, per_class)


def matcher_identities(matcher, readers, per_class):
    """``{name: Identities}`` of several readers by the independent matcher. Its descriptors are not centred (two
    strangers' cosine is about 0.84), so they are centred on the mean of every descriptor used here, then compared
    by cosine as the toolkit's embeddings are."""
    from mtl.evaluation.contamination import Identities
    from mtl.evaluation.identities import chosen_images

    found = {}
    for name, reader in readers.items():
        picked = chosen_images(reader.labels(), per_class)
        files = reader.sample_files()
        features = matcher.features([files[i] for i in picked], progress=lambda line: print(line, flush=True))
        found[name] = (features, reader.labels()[picked], reader)
    centre = np.concatenate([f for f, _, _ in found.values()]).mean(axis=0)
    return {name: Identities.of_features(name, f - centre, labels, reader)
            for name, (f, labels, reader) in found.items()}


def screening_model(run_dir, out):
    """``(model, input field, image size)``: the run's (its export if it has one), or, with ``run_dir`` "dlib",
    the independent matcher whose descriptors are cached beside the unit's filter folder."""
    from mtl.serving.inference import load_model

    if run_dir == "dlib":
        from lfw_matcher import DlibMatcher

        return DlibMatcher(os.path.join(os.path.dirname(os.path.abspath(out)), "embeddings_dlib.npz")), None, 112
    export = os.path.join(run_dir, "export")
    loaded = load_model(export if os.path.isdir(export) else run_dir)
    loaded.model.eval()
    return loaded.model, loaded.input_field, int(loaded.input_shape[-1])


def write_people_file(path, reader, keep):
    """A people file (LFW's one-set format) of the classes of ``reader`` whose names are in ``keep``."""
    import numpy as np

    names = reader.label_names()[reader.label_field]
    counts = np.bincount(reader.labels(), minlength=len(names))
    kept = [(n, int(c)) for n, c in zip(names, counts) if n in keep]
    with open(path, "w") as f:
        f.write(f"{len(kept)}\n")
        f.writelines(f"{n}\t{c}\n" for n, c in kept)


def write_list(path, reader):
    """A label list of ``reader``'s images with absolute paths (its folder names name the people)."""
    with open(path, "w") as f:
        f.writelines(f"{image}\t{int(label)}\n" for image, label in zip(reader.sample_files(), reader.labels()))


def lfw_repeat(tasks, lfw_images_count, outside_images_count) -> int:
    """How many times the merged list holds each LFW image so that LFW's share of it is about its share of the
    separate heads' batch (``ratio``): round(ratio_lfw / ratio_outside * outside images / LFW images), at least 1."""
    ratio = float(tasks[LFW].get("ratio", 1.0)) / float(tasks[OUTSIDE].get("ratio", 1.0))
    return max(1, int(round(ratio * outside_images_count / max(lfw_images_count, 1))))


def balance(list_path, out_path, lfw_images, repeat):
    """``out_path``: the merged label list with each LFW line (an image under ``lfw_images``) ``repeat`` times, so
    that the merged head's batches mix the datasets as the separate heads' do (the arms then differ in their heads,
    not in what they read)."""
    folder = os.path.dirname(os.path.abspath(list_path))
    root = os.path.abspath(lfw_images) + os.sep
    with open(list_path) as f, open(out_path, "w") as out:
        for line in f:
            if not line.strip() or line.startswith("#"):
                out.write(line)
                continue
            image = os.path.abspath(os.path.join(folder, line.rsplit("\t", 1)[0]))
            out.write(line * (repeat if image.startswith(root) else 1))


def run_filter(run_dir, split, lfw_dir, lfw_images, outside_images, tasks, out, percentile=5.0, per_class=20,
               threshold=None):
    """The filter of one split (module docstring); returns the decision."""
    from mtl.evaluation.contamination import decide
    from mtl.writers.merge import merge

    os.makedirs(out, exist_ok=True)
    model, field, size = screening_model(run_dir, out)
    lfw_task, outside_task = tasks[LFW], tasks[OUTSIDE]
    minimum = {"min_images": lfw_task["reader"].get("min_images", 1)}
    training = build_reader(lfw_images, split.train_people(lfw_dir), size, lfw_task, **minimum)
    test = build_reader(lfw_images, split.test_people(lfw_dir), size, lfw_task)
    outside = build_reader(outside_images, {}, size, outside_task)
    readers = {OUTSIDE: outside, "test": test, LFW: training}
    if field is None:
        found = matcher_identities(model, readers, per_class)
    else:
        found = {name: identities(name, model, field, reader, per_class) for name, reader in readers.items()}
    decision = decide(found[OUTSIDE], found["test"], found[LFW], percentile, threshold)
    removed = set(decision.removed_names())
    names = outside.label_names()[outside.label_field]
    if len(removed) == len(names):
        raise DataError(f"the filter of {split.name} found every one of the {len(names)} outside classes to be a test "
                        f"person (threshold {decision.threshold:.3f}, {decision.how}): nothing of the outside data is "
                        f"left to train on. A model trained this briefly cannot tell people apart: train longer, "
                        "or give a fixed --filter-threshold")
    write_people_file(os.path.join(out, "kept.txt"), outside, [n for n in names if n not in removed])
    pairs = decision.pairs + decision.within[OUTSIDE]
    for name, content in (("removed.json", decision.removed), ("pairs.json", pairs),
                          ("decision.json", {"threshold": decision.threshold, "sure": decision.sure,
                                             "how": decision.how,
                                             "removed": decision.removed, "pairs": decision.pairs,
                                             "within": decision.within})):
        with open(os.path.join(out, name), "w") as f:
            json.dump(content, f, indent=1)
    kept = build_reader(outside_images, {"people": os.path.join(out, "kept.txt")}, size, outside_task)
    merged = os.path.join(out, "merged")
    os.makedirs(merged, exist_ok=True)
    write_list(os.path.join(merged, "lfw.txt"), training)
    write_list(os.path.join(merged, "glint.txt"), kept)
    sources = [f"{LFW}={os.path.join(merged, 'lfw.txt')}", f"{OUTSIDE}={os.path.join(merged, 'glint.txt')}"]
    repeat = lfw_repeat(tasks, len(training), len(kept))
    for name, pairs_path in (("naive", None), ("dedup", os.path.join(out, "pairs.json"))):
        shutil.rmtree(os.path.join(merged, name), ignore_errors=True)  # a filter run again writes them anew
        merge(os.path.join(merged, name, "train"), sources, pairs_path)
        balance(os.path.join(merged, name, "train.txt"), os.path.join(merged, name, "balanced.txt"), lfw_images,
                repeat)
    print(f"filter {split.name}: {len(decision.removed)} outside classes removed as test people, "
          f"{len(decision.pairs)} outside-LFW and {len(decision.within[OUTSIDE])} within-outside same-person pairs "
          f"({decision.how})", flush=True)
    return decision
