"""``mtl baseline CONFIG`` and ``mtl compare RUN_DIR ...``: the command lines of :mod:`mtl.studies.comparison`
(single-task baselines and the multi-task gain, runs side by side with a bar chart)."""
import os

from mtl.core.charts import check_chart_path
from mtl.studies.comparison import compare_runs, compare_table, plot_comparison, run_baselines


def _baseline_command(args):
    from mtl.commands.train import prepare_job

    run_baselines(prepare_job(args), overwrite=args.overwrite)


def _compare_command(args):
    path = args.plot or os.path.join(os.path.dirname(os.path.abspath(os.path.normpath(args.runs[0]))),
                                     "compare.png")
    check_chart_path(path, "--plot")
    runs = compare_runs(args.runs)
    print(compare_table(runs))
    plot_comparison(runs, path)
    print(f"\nbar chart: {path}")


def add_cli(sub):
    """``mtl baseline CONFIG [--set ...]`` and ``mtl compare RUN_DIR ... [--plot PNG]``."""
    from mtl.commands.train import add_config_args

    p = sub.add_parser("baseline", help="single-task baselines of a joint job and the multi-task gain Δm")
    add_config_args(p)
    p.add_argument("--overwrite", action="store_true",
                   help="train over the joint and single-task folders even when they hold runs of another job")
    p.set_defaults(func=_baseline_command)
    p = sub.add_parser("compare", help="finished runs side by side (primary metrics, Δm) with a bar chart")
    p.add_argument("runs", nargs="+", help="run folders (output_dir of finished runs)")
    p.add_argument("--plot", help="bar chart PNG (default: compare.png next to the first run)")
    p.set_defaults(func=_compare_command)
