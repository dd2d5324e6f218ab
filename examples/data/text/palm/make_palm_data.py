"""Make the TSV files of the PaddlePALM-shaped examples from the English Web Treebank (its train and dev files only).

    python examples/data/text/palm/make_palm_data.py

* ``genre_{train,dev}.tsv`` (``text_a``, ``label``): a sentence's text (its ``# text`` comment) and its web genre
  (the ``sent_id`` prefix) -- PALM's text classification shape (ChnSentiCorp);
* ``match_{train,dev}.tsv`` (``text_a``, ``text_b``, ``label``): a sentence and either the next sentence of its
  document (1) or a sentence of another document of the same split (0), half and half -- pointwise matching (Quora);
* ``rank_{train,dev}.tsv`` (``text_a``, ``text_b``, ``text_c``): a sentence, the next sentence of its document and
  a sentence of another document -- pairwise matching.

Sentences are drawn with ``RandomState(0)``: 4000 records per training file and 1000 per dev file; a tab or newline
inside a text becomes a space. Derived from UD_English-EWT (CC BY-SA 4.0, see ../LICENSE.txt and ../README.ewt.md):
the files carry the same licence and credit.
"""
import os

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.dirname(HERE)


def sentences(path):
    """(document id, sentence id, text) of every sentence, in file order."""
    out, doc, sid = [], None, None
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.startswith("# newdoc id = "):
                doc = line.split("= ", 1)[1].strip()
            elif line.startswith("# sent_id = "):
                sid = line.split("= ", 1)[1].strip()
            elif line.startswith("# text = "):
                out.append((doc, sid, " ".join(line.split("= ", 1)[1].split())))
    return out


def write(path, header, rows):
    with open(path, "w", encoding="utf-8") as f:
        f.write("\t".join(header) + "\n")
        for row in rows:
            f.write("\t".join(row) + "\n")


def make(split, count, rng):
    items = sentences(os.path.join(SOURCE, f"en_ewt-ud-{split}.conllu"))
    picks = rng.choice(len(items), size=min(count, len(items)), replace=False)
    write(os.path.join(HERE, f"genre_{split}.tsv"), ["text_a", "label"],
          [(items[i][2], items[i][1].split("-", 1)[0]) for i in picks])
    follows = [i for i in range(len(items) - 1) if items[i][0] == items[i + 1][0]]
    chosen = rng.choice(follows, size=min(count, len(follows)), replace=False)

    def other(i):
        while True:
            j = int(rng.randint(len(items)))
            if items[j][0] != items[i][0]:
                return j

    match, rank = [], []
    for k, i in enumerate(chosen):
        j = other(i)
        match.append((items[i][2], items[i + 1][2], "1") if k % 2 == 0 else (items[i][2], items[j][2], "0"))
        rank.append((items[i][2], items[i + 1][2], items[j][2]))
    write(os.path.join(HERE, f"match_{split}.tsv"), ["text_a", "text_b", "label"], match)
    write(os.path.join(HERE, f"rank_{split}.tsv"), ["text_a", "text_b", "text_c"], rank)


if __name__ == "__main__":
    rng = np.random.RandomState(0)
    make("train", 4000, rng)
    make("dev", 1000, rng)
