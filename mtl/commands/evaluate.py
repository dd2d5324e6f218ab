"""``mtl eval RUN_DIR|EXPORT_DIR|WEIGHTS.pdparams --sets FILE ... | --ijb ROOT``: 1:1 verification of a finished run,
an export or converted weights, afterwards; ``--ijb`` runs IJB-B/C template verification (:mod:`mtl.evaluation.ijb`,
TAR at FAR 1e-6 ... 1e-1 per protocol variant, ``ijb_<target>.json`` and ``roc_<target>.png``).

The protocol is the one used during training (:mod:`mtl.evaluation.verify`): squared L2 distance of normalised
embeddings, thresholds 0..4 step 0.01, 10 folds stratified by kind and drawn from the pairs' images with a fixed seed
(so that the order of the file does not matter; ``--folds file`` keeps insightface's contiguous tenths of the file),
VAL at FAR = 1e-3; with ``--flip`` the embedding
is normalize(f(x) + f(flip x)), exactly as in training, else normalize(f(x)). A run is evaluated from its latest
checkpoint (``--weights averaged|live``, default averaged when the run averaged); an export from its inference model.
Prints insightface's line per set (``[lfw][20000]Accuracy-Flip: 0.99650+-0.00300``) and a table, and writes
``eval_<set>.json`` and ``roc_<set>.png`` into ``--out`` (default: the evaluated folder).
"""
import json
import os

import numpy as np

from mtl.commands.evaluate_lfw import add_lfw_arguments, check_lfw_args, run_lfw
from mtl.core.errors import ConfigError
from mtl.serving.export import export_preprocess
from mtl.serving.inference import load_model
from mtl.serving.run_plugins import add_trust_plugins


def insightface_line(name, step, result, flip):
    """``[lfw][20000]Accuracy-Flip: 0.99650+-0.00300`` (``Accuracy`` without flip), as insightface logs it."""
    label = "Accuracy-Flip" if flip else "Accuracy"
    return f"[{name}][{step}]{label}: {result['accuracy']:1.5f}+-{result['std']:1.5f}"


# the table of mtl eval: VAL is read at the threshold chosen for a FAR of 1e-3 on the training folds; the FAR it
# reaches on the held-out folds is shown beside it (with few pairs it is far from 1e-3)
EVAL_HEADERS = ["set", "pairs", "accuracy", "std", "VAL", "at FAR", "threshold"]
EVAL_NOTE = ("(accuracy: mean and std over 10 folds, each holding a tenth of either kind of pair; VAL: true accept "
             "rate at the threshold chosen for FAR 1e-3 on the "
             "training folds, 'at FAR' the false accept rate it reached on the held-out folds)")


def evaluate(path, set_paths, weights="auto", flip=False, batch_size=128, out_dir=None, console=print,
             preprocess_task=None, trust_plugins=False, fold_order="stratified"):
    """Evaluate ``path`` on every verification set; write ``eval_<set>.json`` and ``roc_<set>.png``; return
    ``{set: {"accuracy", "std", "val_at_far", "threshold", "far", ...}}``. The sets' images are prepared as the
    training images of ``preprocess_task`` were (default: the way all the model's tasks share)."""
    from tabulate import tabulate

    from mtl.data.verification_sets import load_verification_set
    from mtl.evaluation.metrics import small_folds_warning
    from mtl.evaluation.verify import evaluate_sets

    loaded = load_model(path, weights, trust_plugins)
    model, field, shape, step, described, preprocessing = (loaded.model, loaded.input_field, loaded.input_shape,
                                                           loaded.step, loaded.description, loaded.preprocessing)
    prepare = export_preprocess({"preprocess": preprocessing}, path, preprocess_task)
    if len(shape) != 3 or shape[0] != 3:
        raise ConfigError(f"'{path}': verification sets hold RGB images, but the backbone's input '{field}' has "
                          f"shape {list(shape)} (expected [3, S, S])")
    out_dir = out_dir or (os.path.dirname(os.path.abspath(path)) if os.path.isfile(path) else path)
    os.makedirs(out_dir, exist_ok=True)
    console(f"evaluating {described}, step {step}{', flip' if flip else ''}")
    results, rows = {}, []
    for set_path in set_paths:
        vset = load_verification_set(set_path, image_size=int(shape[-1]), preprocess=prepare)
        roc = os.path.join(out_dir, f"roc_{vset.name}.png")
        flat = evaluate_sets(model, [vset], batch_size, field, roc, f"{vset.name}: ROC", flip=flip,
                             fold_order=fold_order)
        result = {key.split("/", 1)[1]: value for key, value in flat.items()}
        result.update({"pairs": vset.num_pairs, "same_pairs": int(vset.issame.sum()),
                       "different_pairs": int((~vset.issame).sum()), "folds": fold_order, "step": step,
                       "flip": flip, "model": described, "set": os.path.abspath(set_path)})
        warning = small_folds_warning(vset.issame, folds=min(10, vset.num_pairs))  # the folds evaluate_sets cut
        if warning:
            console(f"{vset.name}: {warning}")
        with open(os.path.join(out_dir, f"eval_{vset.name}.json"), "w") as f:
            json.dump(result, f, indent=1)
        console(insightface_line(vset.name, step, result, flip))
        results[vset.name] = result
        rows.append([vset.name, vset.num_pairs, f"{result['accuracy']:.5f}", f"{result['std']:.5f}",
                     f"{result['val_at_far']:.5f}", f"{result['far']:.5f}", f"{result['threshold']:.3f}"])
    console(tabulate(rows, headers=EVAL_HEADERS, tablefmt="github", disable_numparse=True))
    console(EVAL_NOTE)
    console(f"results in {out_dir} (eval_<set>.json, roc_<set>.png)")
    return results


def _progress(total, desc):
    """A tqdm bar of ``total`` items (stderr)."""
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, dynamic_ncols=True, leave=False)


def evaluate_ijb(path, root, target="IJBC", weights="auto", batch_size=64, out_dir=None, console=print,
                 as_json=False, trust_plugins=False):
    """IJB-B/C 1:1 template verification of ``path`` (:mod:`mtl.evaluation.ijb`): TAR at FAR 1e-6 ... 1e-1 for the
    flip test with and without detector-score weighting (and without the flip test), as a table (or JSON with
    ``as_json``); writes ``ijb_<target>.json`` and ``roc_<target>.png``; returns the results, features included."""
    from mtl.evaluation.ijb import embed_faces, read_ijb
    from mtl.evaluation.ijb_protocol import evaluate_variants

    loaded = load_model(path, weights, trust_plugins)
    model, field, shape, step, described, preprocessing = (loaded.model, loaded.input_field, loaded.input_shape,
                                                           loaded.step, loaded.description, loaded.preprocessing)
    if any(any((v or {}).values()) for v in preprocessing.values()) and not as_json:
        console(f"note: the model's tasks prepared their images with {preprocessing}; IJB faces are aligned and "
                "normalised only, as insightface's protocol prepares them")
    if len(shape) != 3 or shape[0] != 3 or shape[1] != shape[2]:
        raise ConfigError(f"'{path}': IJB faces are RGB squares, but the backbone's input '{field}' has shape "
                          f"{list(shape)} (expected [3, S, S])")
    ijb = read_ijb(root, target)
    out_dir = out_dir or (os.path.dirname(os.path.abspath(path)) if os.path.isfile(path) else path)
    os.makedirs(out_dir, exist_ok=True)
    if not as_json:
        console(f"evaluating {described}, step {step}, on {target}: {len(ijb.images)} faces, "
                f"{len(np.unique(ijb.templates))} templates, {len(ijb.pairs)} pairs")
    bar = _progress(len(ijb.images), f"{target} faces")
    plain, flipped = embed_faces(model, field, int(shape[1]), ijb, batch_size, bar.update)
    bar.close()
    variants = evaluate_variants(ijb, plain, flipped, _progress)
    report = ijb_report(ijb, variants, described, step)
    with open(os.path.join(out_dir, f"ijb_{target.lower()}.json"), "w") as f:
        json.dump(report, f, indent=1)
    plot_ijb_roc(variants, os.path.join(out_dir, f"roc_{target.lower()}.png"), f"{target}: ROC")
    console(json.dumps(report, indent=1) if as_json else ijb_table(report))
    if not as_json:
        console(f"results in {out_dir} (ijb_{target.lower()}.json, roc_{target.lower()}.png)")
    return {"report": report, "variants": variants, "features": (plain, flipped)}


def ijb_report(ijb, variants, described, step) -> dict:
    """The JSON record: the set, the model, and per variant its TAR at each FAR and its AUC."""
    return {"target": ijb.target, "root": os.path.abspath(ijb.root), "faces": len(ijb.images),
            "templates": int(len(np.unique(ijb.templates))), "pairs": int(len(ijb.pairs)), "model": described,
            "step": step, "variants": {name: {"tar_at_far": {f"{far:.0e}": tar for far, tar in v["tar"].items()},
                                              "auc": v["auc"]} for name, v in variants.items()}}


def ijb_table(report) -> str:
    """TAR (%) at each FAR per variant, one row each, as the peer's table shows it."""
    from tabulate import tabulate

    fars = list(next(iter(report["variants"].values()))["tar_at_far"])
    rows = [[name, *(f"{100 * v['tar_at_far'][far]:.2f}" for far in fars), f"{100 * v['auc']:.2f}"]
            for name, v in report["variants"].items()]
    return tabulate(rows, headers=[f"{report['target']} (TAR %)", *(f"FAR={far}" for far in fars), "AUC %"],
                    tablefmt="github", disable_numparse=True)


def plot_ijb_roc(variants, path, title):
    """PNG of the variants' ROC curves, FAR on a log axis from 1e-6 (the peer's plot; FAR 0 is off the axis)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4.5))
    for name, v in variants.items():
        ax.plot(v["fpr"], v["tpr"], lw=1, label=f"{name} (TAR@1e-4 {100 * v['tar'][1e-4]:.2f}%)")
    ax.set_xscale("log")
    ax.set_xlim(1e-6, 1)
    ax.set_xlabel("false accept rate")
    ax.set_ylabel("true accept rate")
    ax.set_title(title)
    ax.grid(True, linestyle="--", alpha=0.4)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _cmd_eval(args):
    if args.batch_size < 1:
        raise ConfigError(f"must be at least 1, got {args.batch_size}", key="--batch-size")
    if args.out and os.path.exists(args.out) and not os.path.isdir(args.out):
        raise ConfigError(f"'{args.out}' is a file; --out names the folder eval_<set>.json and roc_<set>.png go into",
                          key="--out")
    if args.sets and args.ijb:
        raise ConfigError("mtl eval takes either --sets FILE ... (verification sets) or --ijb ROOT (IJB-B/C), not both")
    if args.all_people:  # every held-out person of every task of the run together
        from mtl.studies.all_people import evaluate_all_people

        if args.sets or args.ijb or args.lfw:
            raise ConfigError("--all-people scores the run's own held-out people; it takes no --sets, --ijb or --lfw",
                              key="--all-people")
        evaluate_all_people(args.path, args.weights, args.batch_size, args.out, trust_plugins=args.trust_plugins)
        return
    check_lfw_args(args)
    if args.lfw:
        run_lfw(args)
        return
    if not args.sets and not args.ijb:  # the run's own evaluation split(s) and sets
        from mtl.commands.evaluate_run import evaluate_run

        evaluate_run(args.path, args.weights, args.out, trust_plugins=args.trust_plugins)
        return
    if args.ijb:
        evaluate_ijb(args.path, args.ijb, args.target, args.weights, args.batch_size, args.out,
                     as_json=args.json, trust_plugins=args.trust_plugins)
        return
    evaluate(args.path, args.sets, args.weights, args.flip, args.batch_size, args.out, preprocess_task=args.preprocess,
             trust_plugins=args.trust_plugins, fold_order=args.folds)


def add_cli(sub):
    """Register ``mtl eval``."""
    p = sub.add_parser("eval", help="a finished run on its own evaluation data, or a run or an export on .bin / "
                                    "pairs verification sets (--sets), TAR at FAR on IJB-B/C (--ijb) or LFW's own "
                                    "protocol (--lfw DIR --view 1|2 [--set K])")
    p.add_argument("path", metavar="RUN_DIR|EXPORT_DIR", help="a finished run (its output_dir), an export folder or "
                                                          "converted weights (.pdparams)")
    p.add_argument("--sets", nargs="+", metavar="FILE",
                   help="verification sets: InsightFace .bin files or pairs lists (img1<TAB>img2<TAB>0|1); without "
                        "--sets and --ijb a run is scored on its own evaluation splits and sets")
    p.add_argument("--ijb", metavar="ROOT", help="IJB-B/C 1:1 template verification on the set under ROOT (meta/, "
                                                 "loose_crop/), insightface's protocol")
    p.add_argument("--target", choices=["IJBB", "IJBC"], default="IJBC", help="--ijb: which set")
    p.add_argument("--json", action="store_true", help="--ijb: print the results as JSON instead of a table")
    p.add_argument("--weights", choices=["auto", "averaged", "live"], default="auto",
                   help="a run's weights (auto: averaged when the run averaged)")
    p.add_argument("--flip", action="store_true", help="embed normalize(f(x) + f(flip x)), as training does")
    p.add_argument("--folds", choices=["stratified", "file"], default="stratified",
                   help="--sets: the 10 folds. stratified (default): each fold holds a tenth of the same-person and "
                        "a tenth of the different-person pairs, drawn from the pairs' images with a fixed seed, so "
                        "the file's order does not matter; file: insightface's contiguous tenths of the file (for "
                        "figures comparable to insightface's on .bin sets ordered as LFW's, each tenth both kinds)")
    p.add_argument("--batch-size", type=int, default=128, help="images per forward pass")
    p.add_argument("--out", help="where eval_<set>.json and roc_<set>.png go (default: the evaluated folder)")
    p.add_argument("--preprocess", metavar="TASK",
                   help="prepare images as this task's were (crop, equalisation; default: the way all tasks share)")
    p.add_argument("--all-people", action="store_true",
                   help="a run: every held-out person of every task together (1:1 on every pair of their images, "
                        "1:N identification: rank-1, rank-5, CMC; gallery: each person's first image)")
    add_lfw_arguments(p)
    add_trust_plugins(p)
    p.set_defaults(func=_cmd_eval)
