"""The LFW report's tables in the README and docs/lfw.md, and its ROC picture, from the committed results.

    python examples/lfw_tables.py --write README.md docs/lfw.md --plot docs/img/lfw_roc.png --lfw ../shared/data/lfw

reads ``docs/results/lfw/view1.json`` and ``view2.json`` (``examples/lfw_report.py --json``) and each arm's mean
View 2 ROC (``docs/results/lfw/roc_<arm>.txt``, LFW's format), writes each view's table and paired differences
between the page's ``lfw-view1`` / ``lfw-view2`` markers (where it has them), and plots our curves beside LFW's
published ones (those of ``--lfw``'s ``published_roc/``). A test checks that the pages' sections are what the
committed files give.
"""
import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from lfw_outcome import differences, table  # noqa: E402

RESULTS = os.path.join(ROOT, "docs", "results", "lfw")


def section(data) -> str:
    """A view's generated section: its table and its paired differences."""
    return table(data) + "\n\nPaired differences of accuracy:\n\n" + differences(data)


def load(view):
    """The committed JSON of ``view`` (1 or 2), or None."""
    path = os.path.join(RESULTS, f"view{view}.json")
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        return json.load(f)


def plot(path, lfw_dir):
    """Our arms' mean View 2 ROC (the committed files) beside LFW's published curves."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from mtl.evaluation.lfw import read_roc

    fig, ax = plt.subplots(figsize=(7, 5.5))
    published = os.path.join(lfw_dir, "published_roc") if lfw_dir else ""
    for name in sorted(os.listdir(published)) if os.path.isdir(published) else []:
        if name.endswith(".txt"):
            tpr, fpr = read_roc(os.path.join(published, name))
            ax.plot(fpr, tpr, lw=0.8, alpha=0.7, ls="--", label=name[:-4])
    data = load(2)
    for arm in data["arms"] if data else []:
        tpr, fpr = read_roc(os.path.join(RESULTS, f"roc_{arm}.txt"))
        ax.plot(fpr, tpr, lw=1.8, label=f"ours: {arm} ({data['arms'][arm]['mean']:.4f})")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_xlabel("false positive rate")
    ax.set_ylabel("true positive rate")
    ax.set_title("LFW View 2, unrestricted: our arms (mean over the ten sets) and published curves")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="lower right", fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None):
    from mtl.core.generated_pages import markers, write_section

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", nargs="*", default=[], help="pages whose lfw-view1/lfw-view2 sections to write")
    parser.add_argument("--plot", help="write the ROC picture here")
    parser.add_argument("--lfw", help="an LFW folder whose published_roc/ the picture shows")
    args = parser.parse_args(argv)
    for page in args.write:  # each view's section where the page has its markers (the README shows View 2 only)
        with open(page) as f:
            content = f.read()
        views = [view for view in (1, 2) if markers(f"lfw-view{view}")[0] in content]
        if not views:
            parser.error(f"{page} has no lfw-view1 or lfw-view2 markers to write between")
        for view in views:
            data = load(view)
            if data is not None:
                write_section(page, f"lfw-view{view}", section(data))
    if args.plot:
        plot(args.plot, args.lfw)


if __name__ == "__main__":
    main()
