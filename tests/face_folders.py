"""A small face folder with held-out people and its job (tests/test_user_reports_failures.py,
tests/test_issue53_followups.py): random 8 px images per person, a label list, and an undecodable image to plant."""
import os

import numpy as np

GARBAGE = b"\x89PNG\r\n\x1a\n not an image at all"


def write_png(path, seed):
    from PIL import Image

    pixels = np.random.RandomState(seed).randint(0, 255, (8, 8, 3)).astype(np.uint8)
    Image.fromarray(pixels).save(path)


def face_folder(folder, people="abcd", per=4):
    """``per`` random 8 px PNG images of each of ``people`` under ``folder/<person>/``, and ``folder/list.txt``."""
    lines = []
    for label, person in enumerate(people):
        os.makedirs(os.path.join(folder, person), exist_ok=True)
        for i in range(per):
            write_png(os.path.join(folder, person, f"{i}.png"), 10 * label + i)
            lines.append(f"{person}/{i}.png\t{label}")
    with open(os.path.join(folder, "list.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    return os.path.join(folder, "list.txt")


def face_job(out, list_path, steps=4):
    """A face task whose people c and d (labels 2, 3) are held out and verified on at the end."""
    return {"seed": 0, "device": "cpu", "output_dir": str(out),
            "tasks": [{"name": "faces", "reader": {"type": "image_list", "list": list_path, "decoder": "pillow",
                                                   "holdout_classes": [2, 3]},
                       "head": {"type": "arcface", "scale": 8.0}}],
            "backbone": {"type": "mlp", "input_shape": [3, 8, 8], "hidden": [16], "embedding_size": 8},
            "schedule": {"batch_size": 4, "steps": steps}, "log": {"progress": False, "plot": False},
            "averaging": {"type": "none"}, "data": {"num_workers": 0}}
