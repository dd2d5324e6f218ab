"""``mtl predict RUN_OR_EXPORT INPUTS... [--task T] [--top K]``: what each task's head predicts for new inputs
(classes, labels, values), with the data's names (:mod:`mtl.prediction`)."""
from mtl.inference import add_trust_plugins


def _cmd_predict(args):
    from mtl.errors import ConfigError, require_output_file
    from mtl.prediction import predict, prediction_table, write_predictions

    if args.top < 1:
        raise ConfigError(f"--top must be >= 1, got {args.top}")
    if args.json:
        require_output_file(args.json, "--json")
    results = predict(args.path, args.inputs, args.task, args.weights, args.trust_plugins)
    print(prediction_table(results, args.top))
    if args.json:
        write_predictions(results, args.top, args.json)
        print(f"wrote {args.json}")


def add_cli(sub):
    """Register ``mtl predict``."""
    p = sub.add_parser("predict", help="what a run's or an export's heads predict for new inputs (classes, labels, "
                                       "values, with the data's names)")
    p.add_argument("path", metavar="RUN_OR_EXPORT", help="a finished run (its output_dir) or an export folder")
    p.add_argument("inputs", nargs="+", metavar="INPUT",
                   help="image files (prepared as the task's training images were), .npy arrays as the model reads "
                        "them, or .csv table rows (columns by name, standardised as the task's table was)")
    p.add_argument("--task", help="predict for this task only (default: every task whose head predicts and that "
                                  "reads these inputs)")
    p.add_argument("--top", type=int, default=3, help="classes shown per input (and at most this many labels)")
    p.add_argument("--weights", choices=["auto", "averaged", "live"], default="auto",
                   help="a run's weights (auto: averaged when the run averaged)")
    p.add_argument("--json", metavar="FILE", help="also write every prediction as JSON (all the numbers)")
    add_trust_plugins(p)
    p.set_defaults(func=_cmd_predict)
