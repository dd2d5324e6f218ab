"""``mtl export RUN_DIR OUT_DIR`` and ``mtl embed EXPORT_DIR IMAGES... -o emb.npy`` (see :mod:`mtl.serving.export`)."""

import numpy as np

from mtl.serving.export import embed, export
from mtl.serving.run_plugins import add_trust_plugins


def _cmd_export(args):
    meta = export(args.run_dir, args.out_dir, args.checkpoint, args.weights, args.trust_plugins, args.task,
                  onnx_opset=args.opset if args.onnx else None)
    print(f"exported step {meta['step']} ({'averaged' if meta['averaged'] else 'live'} weights) to {args.out_dir}: "
          f"backbone (input {meta['input_field']} {meta['input_shape']}, {meta['feature_size']}-d"
          + (f", embeds for task {meta['task']}" if meta["task"] else "") + "), heads "
          f"{', '.join(meta['heads'])}" + (f"; ONNX {meta['onnx']} (dynamic batch)" if args.onnx else ""))


def _cmd_embed(args):
    from mtl.core.errors import ConfigError, require_output_file

    require_output_file(args.output, "--output", suffix=".npy")
    if args.batch_size < 1:
        raise ConfigError(f"must be at least 1, got {args.batch_size}", key="--batch-size")
    emb = embed(args.export_dir, args.inputs, args.batch_size, args.flip, args.normalize, args.preprocess)
    np.save(args.output, emb)
    print(f"wrote {emb.shape[0]} embeddings of size {emb.shape[1]} to {args.output}")


def add_cli(sub):
    """Register ``mtl export`` and ``mtl embed``."""
    p = sub.add_parser("export", help="export a run's backbone (inference model) and merged head weights")
    p.add_argument("run_dir", help="a finished run (its output_dir)")
    p.add_argument("out_dir", help="the export folder to write (backbone, heads/, export.json)")
    p.add_argument("--checkpoint", help="a checkpoint folder (default: the run's latest)")
    p.add_argument("--weights", choices=["auto", "averaged", "live"], default="auto",
                   help="which weights (auto: averaged when the run averaged)")
    p.add_argument("--task", help="the task the model embeds for, when the run's architecture gives each task its own "
                                  "embedding (mmoe, cgc, ple, cross_stitch, task_norm, adapters, towers)")
    p.add_argument("--onnx", action="store_true", help="also write backbone.onnx (dynamic batch) via paddle2onnx")
    p.add_argument("--opset", type=int, default=13, help="ONNX opset of --onnx")
    add_trust_plugins(p)
    p.set_defaults(func=_cmd_export)
    p = sub.add_parser("embed", help="embed images or .npy arrays with an exported model")
    p.add_argument("export_dir", help="an export folder (mtl export)")
    p.add_argument("inputs", nargs="+", help="image files or .npy arrays [N, C, H, W]")
    p.add_argument("-o", "--output", required=True, help="where to write the embeddings (.npy)")
    p.add_argument("--batch-size", type=int, default=64, help="inputs per forward pass")
    p.add_argument("--flip", action="store_true", help="add the embedding of the mirrored image (image inputs only)")
    p.add_argument("--normalize", action="store_true", help="L2-normalise the embeddings")
    p.add_argument("--preprocess", metavar="TASK",
                   help="prepare images as this task's were (crop, equalisation; default: the way all tasks share)")
    p.set_defaults(func=_cmd_embed)
