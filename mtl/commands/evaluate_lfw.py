"""``mtl eval MODEL --lfw DIR --view 1|2 [--set k]``: LFW's own verification protocol (:mod:`mtl.evaluation.lfw`).

View 1 chooses the threshold on ``pairsDevTrain.txt`` and measures on ``pairsDevTest.txt``; View 2 set k chooses it
on the other nine sets and measures on set k's 600 pairs; ``--view 2`` without ``--set`` scores every set with the
one model (LFW's protocol only for a model that trained on none of LFW's people). Writes ``eval_lfw_<view>.json``
(the figures and the scored pairs' distances) and ``roc_lfw_<view>.txt`` (LFW's ROC format) into ``--out``.
"""
import json
import os

from mtl.core.errors import ConfigError, DataError
from mtl.serving.export import export_preprocess
from mtl.serving.inference import load_model


def embed_lfw_images(model, field, image_size, root, paths, prepare, flip, batch_size, console):
    """``{relative path: unit embedding}`` of every image ``paths`` names under ``root``."""
    from mtl.data.verification_sets import ImageBatches, decode_all
    from mtl.evaluation.verify import embed_pairs

    encoded = []
    for rel in paths:
        full = os.path.join(root, rel)
        try:
            with open(full, "rb") as f:
                encoded.append(f.read())
        except OSError as exc:
            raise DataError(f"LFW image '{full}' cannot be read: {exc.strerror}") from None
    console(f"embedding {len(paths)} LFW images{' (and their mirror images)' if flip else ''}")
    pixels = decode_all(encoded, int(image_size), lambda i: f"LFW image '{os.path.join(root, paths[i])}'",
                        preprocess=prepare)
    embeddings = embed_pairs(model, ImageBatches(pixels, prepare), batch_size, field, flip)
    return dict(zip(paths, embeddings))


def view_name(view: int, test_set=None) -> str:
    """``view1``, ``view2`` (every set) or ``view2_set3``."""
    return f"view{view}" + ("" if test_set is None else f"_set{test_set}")


def score_view(distances, issame, view: int, test_set=None) -> dict:
    """The protocol's figures: View 1's test file, View 2's set ``test_set`` (from 1), or every View 2 set."""
    from mtl.evaluation.lfw import score_set, summary

    if view == 1:
        return {"sets": {"pairsDevTest": score_set(distances, issame, 1)}}
    chosen = range(1, len(distances) + 1) if test_set is None else [test_set]
    scored = {f"set{k}": score_set(distances, issame, k - 1) for k in chosen}
    result = {"sets": scored}
    if test_set is None:
        result.update(summary([s["accuracy"] for s in scored.values()]))
    return result


def check_view(lfw_dir, view, test_set):
    """A ConfigError naming the option unless the view, the set and the folder make sense."""
    if view not in (1, 2):
        raise ConfigError(f"--view must be 1 or 2, got {view}")
    if test_set is not None and (view != 2 or not 1 <= test_set <= 10):
        raise ConfigError("--set chooses one of View 2's ten sets (1 to 10)" if view == 2 else
                          "--set applies to --view 2 (View 1 has one test file, pairsDevTest.txt)")
    if not os.path.isdir(lfw_dir):
        raise ConfigError(f"--lfw '{lfw_dir}' is not a folder: give the folder of LFW's pairs files and images")


def view_distances(loaded, lfw_dir, view, flip, batch_size, preprocess_task, path, console):
    """``(pair sets, distances per set)`` of the view's pairs under the model ``loaded``."""
    from mtl.data.lfw import check_images, view_pairs
    from mtl.evaluation.lfw import images_root, pair_distances_by_path

    pairs = view_pairs(lfw_dir, view)
    root = images_root(lfw_dir)
    check_images(root, pairs, f"LFW's pairs of view {view} ('{lfw_dir}')")
    shape = loaded.input_shape
    if len(shape) != 3 or shape[0] != 3:
        raise ConfigError(f"'{path}': LFW holds RGB images, but the backbone's input '{loaded.input_field}' has "
                          f"shape {list(shape)} (expected [3, S, S])")
    prepare = export_preprocess({"preprocess": loaded.preprocessing}, path, preprocess_task)
    paths = sorted({p for s in pairs for p in s.first + s.second})
    embeddings = embed_lfw_images(loaded.model, loaded.input_field, shape[-1], root, paths, prepare, flip,
                                  batch_size, console)
    return pairs, [pair_distances_by_path(embeddings, s) for s in pairs]


def write_record(record, distances, issame, scored, out_dir, name):
    """``eval_lfw_<name>.json`` (with the scored sets' distances) and ``roc_lfw_<name>.txt``."""
    from mtl.evaluation.lfw import roc_points, write_roc

    record["distances"] = {set_name: distances[k].tolist() for set_name, k in zip(record["sets"], scored)}
    record["issame"] = {set_name: issame[k].astype(int).tolist() for set_name, k in zip(record["sets"], scored)}
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, f"eval_lfw_{name}.json"), "w") as f:
        json.dump(record, f, indent=1)
    write_roc(os.path.join(out_dir, f"roc_lfw_{name}.txt"),
              *roc_points([distances[k] for k in scored], [issame[k] for k in scored]))


def evaluate_lfw(path, lfw_dir, view=1, test_set=None, weights="auto", flip=False, batch_size=128, out_dir=None,
                 console=print, preprocess_task=None, trust_plugins=False) -> dict:
    """Score ``path`` (a run, an export or converted weights) on LFW's protocol; write the JSON and ROC files;
    return the JSON record."""
    check_view(lfw_dir, view, test_set)
    loaded = load_model(path, weights, trust_plugins)
    console(f"evaluating {loaded.description}, step {loaded.step}, on LFW view {view}"
            + ("" if view == 1 else f", set {test_set}" if test_set else ", every set with this one model"))
    pairs, distances = view_distances(loaded, lfw_dir, view, flip, batch_size, preprocess_task, path, console)
    issame = [s.issame for s in pairs]
    record = score_view(distances, issame, view, test_set)
    record.update({"view": view, "set": test_set, "flip": flip, "model": loaded.description, "step": loaded.step,
                   "lfw": os.path.abspath(lfw_dir)})
    scored = [1] if view == 1 else ([test_set - 1] if test_set else list(range(len(pairs))))
    out_dir = out_dir or (os.path.dirname(os.path.abspath(path)) if os.path.isfile(path) else path)
    name = view_name(view, test_set)
    write_record(record, distances, issame, scored, out_dir, name)
    for set_name, figures in record["sets"].items():
        console(f"[lfw-{name}][{loaded.step}]{'Accuracy-Flip' if flip else 'Accuracy'} on {set_name}: "
                f"{figures['accuracy']:1.5f} (threshold {figures['threshold']:.2f} from the "
                f"{'pairsDevTrain' if view == 1 else 'other nine sets'} pairs; AUC {figures['auc']:.4f})")
    if "mean" in record:
        console(f"[lfw-view2][{loaded.step}] mean over the ten sets {record['mean']:.5f} +- {record['se']:.5f} "
                "(standard error); LFW's protocol only when this model trained on none of LFW's people")
    console(f"results in {out_dir} (eval_lfw_{name}.json, roc_lfw_{name}.txt: 'tpr fpr' per line, LFW's format)")
    return record


def check_lfw_args(args):
    """The command line's LFW options, or a ConfigError naming the option."""
    if args.lfw and (args.sets or args.ijb):
        raise ConfigError("mtl eval takes one of --sets, --ijb or --lfw")
    if not args.lfw and (args.view is not None or args.set is not None):
        raise ConfigError("--view and --set choose LFW's protocol: give the LFW folder with --lfw DIR")


def add_lfw_arguments(p):
    """``--lfw DIR``, ``--view``, ``--set`` on ``mtl eval``."""
    p.add_argument("--lfw", metavar="DIR", help="LFW's protocol: DIR holds LFW's pairs files (pairsDevTrain.txt, "
                                                "pairsDevTest.txt, pairs.txt) and its person folders (DIR/images or "
                                                "DIR itself)")
    p.add_argument("--view", type=int, choices=[1, 2], help="--lfw: View 1 (threshold from pairsDevTrain, accuracy "
                                                             "on pairsDevTest; the default) or View 2")
    p.add_argument("--set", type=int, metavar="K", help="--lfw --view 2: score set K (1-10) with the threshold of "
                                                        "the other nine sets (default: every set, one model)")


def run_lfw(args):
    """``mtl eval --lfw``."""
    evaluate_lfw(args.path, args.lfw, args.view or 1, args.set, args.weights, args.flip, args.batch_size, args.out,
                 preprocess_task=args.preprocess, trust_plugins=args.trust_plugins)

