"""Copy the six face datasets into ``examples/data/`` (pixels unchanged) and write their label lists.

Run once by a maintainer, from the repository root, with the shared data folder at hand:

    python tools/vendor_faces.py [--source ../shared/data]

For ORL (already vendored as PNG in ``examples/data/orl/``) only the list is written. Every other dataset's
``sN/K.png`` files are copied byte for byte into ``examples/data/faces/<name>/`` and ``<name>.txt`` lists every
image once as ``sN/K.png<TAB>N-1`` (label = person number - 1), in person then image order. Extended Yale B's
``index.tsv`` (light azimuth and elevation of every image) is copied as well.
"""
import argparse
import os
import re
import shutil

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATASETS = ("gt", "imm", "umist", "yale", "yaleb")


def _number(name: str) -> int:
    """The integer of ``s12`` or ``12.png``."""
    return int(re.sub(r"\D", "", name))


def images_of(folder: str):
    """``[(relative path, label)]`` of every ``sN/K.png`` under ``folder``, sorted by person then image."""
    out = []
    for person in sorted((d for d in os.listdir(folder) if re.fullmatch(r"s\d+", d)), key=_number):
        files = sorted((f for f in os.listdir(os.path.join(folder, person)) if f.endswith(".png")), key=_number)
        out += [(f"{person}/{f}", _number(person) - 1) for f in files]
    return out


def write_list(folder: str, name: str, header: str):
    """Write ``folder/name.txt`` listing every image of ``folder``; return the number of images."""
    entries = images_of(folder)
    with open(os.path.join(folder, f"{name}.txt"), "w") as f:
        f.write(f"# {header}\n# path<TAB>label (label = person number - 1)\n")
        f.writelines(f"{path}\t{label}\n" for path, label in entries)
    return len(entries)


def main(argv=None):
    """Copy the datasets and write the lists."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--source", default=os.path.join(ROOT, "..", "shared", "data"))
    args = parser.parse_args(argv)
    for name in DATASETS:
        src, dst = os.path.join(args.source, "faces", name), os.path.join(ROOT, "examples", "data", "faces", name)
        for path, _ in images_of(src):
            os.makedirs(os.path.dirname(os.path.join(dst, path)), exist_ok=True)
            shutil.copyfile(os.path.join(src, path), os.path.join(dst, path))
        if os.path.isfile(os.path.join(src, "index.tsv")):
            shutil.copyfile(os.path.join(src, "index.tsv"), os.path.join(dst, "index.tsv"))
        print(name, write_list(dst, name, f"{name}: every image of the people vendored here, once"))
    orl = os.path.join(ROOT, "examples", "data", "orl")
    print("orl", write_list(orl, "orl", "orl: every image of people 1-30, once"))


if __name__ == "__main__":
    main()
