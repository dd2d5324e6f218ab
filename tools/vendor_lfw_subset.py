"""Copy a small subset of LFW into ``examples/data/lfw_subset/`` (images byte for byte) with protocol files of LFW's
own formats, for the tests of the LFW reader and protocol (a fresh clone has no ``../shared``).

Run once by a maintainer, from the repository root, with the shared data folder at hand:

    python tools/vendor_lfw_subset.py [--source ../shared/data/lfw]

People: from each of the ten sets of View 2's ``people.txt``, the first four people (in the file's order) with 2 to
4 images, and the first person with one image: 50 people. ``people.txt`` keeps their sets, ``peopleDevTrain.txt``
and ``peopleDevTest.txt`` those of them that View 1 puts in each. Pairs, in LFW's format, written here from those
people (LFW's own pairs mostly name other people): per View 2 set, the same pairs ``(1, 2)`` of its first three
people with two images or more and three different pairs between its people; View 1's two files likewise over each
file's people. They are not LFW's pairs: the tests check the protocol's arithmetic on them, not LFW's figures.
"""
import argparse
import os
import shutil
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from mtl.data.lfw import read_people  # noqa: E402

OUT = os.path.join(ROOT, "examples", "data", "lfw_subset")
PER_SET, PAIRS = 4, 3
README = """# A small subset of Labeled Faces in the Wild (for the tests)

50 people of LFW (five from each of View 2's ten sets), 116 images: `images/Name/Name_NNNN.jpg`, LFW's
deep-funneled photographs with the centre 150 x 150 kept and resized to 112 x 112, copied byte for byte from the
project's full copy. `people.txt`, `peopleDevTrain.txt` and `peopleDevTest.txt` are LFW's own files restricted to
these people (same sets, same counts). The pairs files are in LFW's format but written by
`tools/vendor_lfw_subset.py` from these people (LFW's own pairs mostly name other people): they test the
protocol's arithmetic, and their figures are not LFW's. A user's full LFW lives on their own disk and is given to
`mtl eval --lfw DIR` and `examples/lfw_report.py --lfw DIR`.

Credit (keep with any copy): G. B. Huang, M. Ramesh, T. Berg, E. Learned-Miller, "Labeled Faces in the Wild: A
Database for Studying Face Recognition in Unconstrained Environments", University of Massachusetts, Amherst,
Technical Report 07-49, 2007. Deep funneling: G. B. Huang, M. Mattar, H. Lee, E. Learned-Miller, "Learning to Align
from Scratch", NIPS 2012. The people are public figures photographed by the press: use for research on face
recognition only.
"""


def chosen(sets):
    """Per set: its first PER_SET people with 2-4 images and its first person with one image."""
    picked = []
    for people in sets:
        several = [p for p in people if 2 <= p.images <= 4][:PER_SET]
        single = [p for p in people if p.images == 1][:1]
        picked.append(several + single)
    return picked


def pairs_lines(people):
    """PAIRS same-person lines then PAIRS different-person lines over ``people`` (LFW's pairs format)."""
    several = [p for p in people if p.images >= 2]
    same = [f"{p.name}\t1\t2" for p in several[:PAIRS]]
    different = [f"{people[i].name}\t1\t{people[(i + 1) % len(people)].name}\t1" for i in range(PAIRS)]
    return same + different


def write_people(path, sets):
    with open(path, "w") as f:
        if len(sets) > 1:
            f.write(f"{len(sets)}\n")
        for people in sets:
            f.write(f"{len(people)}\n")
            f.writelines(f"{p.name}\t{p.images}\n" for p in people)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", default=os.path.join(ROOT, "..", "shared", "data", "lfw"))
    args = parser.parse_args()
    sets = chosen(read_people(os.path.join(args.source, "people.txt")))
    if os.path.isdir(OUT):
        shutil.rmtree(OUT)
    os.makedirs(os.path.join(OUT, "images"))
    for people in sets:
        for p in people:
            shutil.copytree(os.path.join(args.source, "images", p.name), os.path.join(OUT, "images", p.name))
    write_people(os.path.join(OUT, "people.txt"), sets)
    with open(os.path.join(OUT, "pairs.txt"), "w") as f:
        f.write(f"{len(sets)}\t{PAIRS}\n")
        for people in sets:
            f.writelines(line + "\n" for line in pairs_lines(people))
    everyone = {p.name: p for people in sets for p in people}
    for split in ("Train", "Test"):
        view1 = [everyone[p.name] for p in read_people(os.path.join(args.source, f"people Dev{split}.txt".replace(
            " ", "")))[0] if p.name in everyone]
        write_people(os.path.join(OUT, f"peopleDev{split}.txt"), [view1])
        with open(os.path.join(OUT, f"pairsDev{split}.txt"), "w") as f:
            f.write(f"{PAIRS}\n")
            f.writelines(line + "\n" for line in pairs_lines(view1))
    with open(os.path.join(OUT, "README.md"), "w") as f:
        f.write(README)
    print(f"{len(everyone)} people, {sum(p.images for p in everyone.values())} images -> {OUT}")


if __name__ == "__main__":
    main()
