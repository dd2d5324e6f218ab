"""``mtl eval RUN_DIR|EXPORT_DIR --sets FILE ...``: 1:1 verification of a finished run or an export, afterwards.

The protocol is the one used during training (:mod:`mtl.evaluation.verify`): squared L2 distance of normalised
embeddings, thresholds 0..4 step 0.01, 10 folds without shuffling, VAL at FAR = 1e-3; with ``--flip`` the embedding
is normalize(f(x) + f(flip x)), exactly as in training, else normalize(f(x)). A run is evaluated from its latest
checkpoint (``--weights averaged|live``, default averaged when the run averaged); an export from its inference model.
Prints insightface's line per set (``[lfw][20000]Accuracy-Flip: 0.99650+-0.00300``) and a table, and writes
``eval_<set>.json`` and ``roc_<set>.png`` into ``--out`` (default: the evaluated folder).
"""
import json
import os

from mtl.data.preprocess import task_preprocessing
from mtl.errors import ConfigError
from mtl.export import export_preprocess


def load_model(path, weights="auto"):
    """(backbone-like layer, input field, input shape, step, description, preprocessing ``{task: mapping}``) of a
    run folder or an export folder."""
    from mtl.export import field_adapter, load_run_backbone

    if os.path.isfile(os.path.join(path, "export.json")):
        import paddle

        if weights != "auto":
            raise ConfigError(f"--weights {weights} applies to a run; the export '{path}' holds the weights it was "
                              "exported with (see its export.json)")
        with open(os.path.join(path, "export.json")) as f:
            meta = json.load(f)
        model = field_adapter(paddle.jit.load(os.path.join(path, "backbone")), meta["input_field"], to_dict=False)
        kind = "averaged" if meta.get("averaged") else "live"
        return (model, meta["input_field"], meta["input_shape"], meta["step"], f"export ({kind} weights)",
                meta.get("preprocess") or {})
    if os.path.isfile(os.path.join(path, "job.json")):
        averaged = {"auto": None, "averaged": True, "live": False}[weights]
        backbone, _, ckpt, use_avg = load_run_backbone(path, None, averaged)
        with open(os.path.join(ckpt, "state.json")) as f:
            step = json.load(f)["step"]
        field = backbone.input_fields()[0]
        with open(os.path.join(path, "job.json")) as f:
            preprocessing = task_preprocessing(json.load(f)["tasks"])
        return (backbone, field.name, list(field.shape), step, f"{ckpt} ({'averaged' if use_avg else 'live'} weights)",
                preprocessing)
    raise ConfigError(f"'{path}' is neither a training run (job.json) nor an export (export.json)")


def insightface_line(name, step, result, flip):
    """``[lfw][20000]Accuracy-Flip: 0.99650+-0.00300`` (``Accuracy`` without flip), as insightface logs it."""
    label = "Accuracy-Flip" if flip else "Accuracy"
    return f"[{name}][{step}]{label}: {result['accuracy']:1.5f}+-{result['std']:1.5f}"


def evaluate(path, set_paths, weights="auto", flip=False, batch_size=128, out_dir=None, console=print,
             preprocess_task=None):
    """Evaluate ``path`` on every verification set; write ``eval_<set>.json`` and ``roc_<set>.png``; return
    ``{set: {"accuracy", "std", "val_at_far", "threshold", "far", ...}}``. The sets' images are prepared as the
    training images of ``preprocess_task`` were (default: the way all the model's tasks share)."""
    from tabulate import tabulate

    from mtl.data.verification_sets import load_verification_set
    from mtl.evaluation.verify import evaluate_sets

    model, field, shape, step, described, preprocessing = load_model(path, weights)
    prepare = export_preprocess({"preprocess": preprocessing}, path, preprocess_task)
    if len(shape) != 3 or shape[0] != 3:
        raise ConfigError(f"'{path}': verification sets hold RGB images, but the backbone's input '{field}' has "
                          f"shape {list(shape)} (expected [3, S, S])")
    out_dir = out_dir or path
    os.makedirs(out_dir, exist_ok=True)
    console(f"evaluating {described}, step {step}{', flip' if flip else ''}")
    results, rows = {}, []
    for set_path in set_paths:
        vset = load_verification_set(set_path, image_size=int(shape[-1]), preprocess=prepare)
        roc = os.path.join(out_dir, f"roc_{vset.name}.png")
        flat = evaluate_sets(model, [vset], batch_size, field, roc, f"{vset.name}: ROC", flip=flip)
        result = {key.split("/", 1)[1]: value for key, value in flat.items()}
        result.update({"pairs": vset.num_pairs, "step": step, "flip": flip, "model": described,
                       "set": os.path.abspath(set_path)})
        with open(os.path.join(out_dir, f"eval_{vset.name}.json"), "w") as f:
            json.dump(result, f, indent=1)
        console(insightface_line(vset.name, step, result, flip))
        results[vset.name] = result
        rows.append([vset.name, vset.num_pairs, f"{result['accuracy']:.5f}", f"{result['std']:.5f}",
                     f"{result['val_at_far']:.5f}", f"{result['threshold']:.3f}"])
    console(tabulate(rows, headers=["set", "pairs", "accuracy", "std", "VAL@FAR=1e-3", "threshold"],
                     tablefmt="github", disable_numparse=True))
    console(f"results in {out_dir} (eval_<set>.json, roc_<set>.png)")
    return results


def _cmd_eval(args):
    evaluate(args.path, args.sets, args.weights, args.flip, args.batch_size, args.out, preprocess_task=args.preprocess)


def add_cli(sub):
    """Register ``mtl eval``."""
    p = sub.add_parser("eval", help="verification accuracy of a finished run or an export on .bin / pairs sets")
    p.add_argument("path", metavar="RUN_DIR|EXPORT_DIR")
    p.add_argument("--sets", nargs="+", required=True, metavar="FILE",
                   help="verification sets: InsightFace .bin files or pairs lists (img1<TAB>img2<TAB>0|1)")
    p.add_argument("--weights", choices=["auto", "averaged", "live"], default="auto",
                   help="a run's weights (auto: averaged when the run averaged)")
    p.add_argument("--flip", action="store_true", help="embed normalize(f(x) + f(flip x)), as training does")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--out", help="where eval_<set>.json and roc_<set>.png go (default: the evaluated folder)")
    p.add_argument("--preprocess", metavar="TASK",
                   help="prepare images as this task's were (crop, equalisation; default: the way all tasks share)")
    p.set_defaults(func=_cmd_eval)
