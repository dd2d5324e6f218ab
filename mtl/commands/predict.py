"""``mtl predict RUN_OR_EXPORT INPUTS... [--task T] [--top K] [-o OUT] [--input-format F]``: what each task's head
predicts for new inputs (classes, labels, values), with the data's names (:mod:`mtl.serving.prediction`); for text
tasks, the input file again with every prediction filled in (:mod:`mtl.serving.prediction_text`)."""
from mtl.serving.run_plugins import add_trust_plugins


def _cmd_predict(args):
    from mtl.core.errors import ConfigError, require_output_file
    from mtl.serving.inference import open_for_prediction
    from mtl.serving.prediction import predict, prediction_table, write_predictions
    from mtl.serving.prediction_text import predict_text, text_tasks

    if args.top < 1:
        raise ConfigError(f"--top must be >= 1, got {args.top}")
    if args.json:
        require_output_file(args.json, "--json")

    model = open_for_prediction(args.path, args.weights, args.trust_plugins)
    if text_tasks(model) and (args.task is None or args.task in text_tasks(model)):
        predict_text(model, args.path, args.inputs, args.task, args.output, args.input_format, args.json)
        return
    if args.output or args.input_format:
        raise ConfigError("-o and --input-format are for text tasks; this model's tasks read images, arrays or table "
                          "rows (their predictions are printed, and written with --json)")
    results = predict(args.path, args.inputs, args.task, args.weights, args.trust_plugins, model)
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
                        "them, or .csv table rows (columns by name, standardised as the task's table was); for text "
                        "tasks: CoNLL-U, IOB2, TSV, SQuAD .json or raw text (one text per line) files")
    p.add_argument("--task", help="predict for this task only (default: every task whose head predicts and that "
                                  "reads these inputs)")
    p.add_argument("--top", type=int, default=3, help="classes shown per input (and at most this many labels)")
    p.add_argument("--weights", choices=["auto", "averaged", "live"], default="auto",
                   help="a run's weights (auto: averaged when the run averaged)")
    p.add_argument("--json", metavar="FILE", help="also write every prediction as JSON (all the numbers)")
    p.add_argument("-o", "--output", metavar="PATH",
                   help="text tasks: the file the input is written to with the predictions filled in (a folder for "
                        "several inputs; default: printed)")
    p.add_argument("--input-format", choices=["conllu", "iob2", "tsv", "squad", "text"],
                   help="text tasks: the inputs' format (default by extension: .conllu, .iob2/.bio/.iob/.conll, .tsv, "
                        ".json for SQuAD, anything else one text per line)")
    add_trust_plugins(p)
    p.set_defaults(func=_cmd_predict)
