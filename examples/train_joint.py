"""Train a multi-task job: ``python examples/train_joint.py [CONFIG | -c CONFIG] [-o key.path=value ...] [--resume]``.

``-c``/``-o`` are Paddle's spellings (PaddleClas, PaddleDetection) of the positional CONFIG and ``--set``.

Without arguments it trains the default demo (examples/configs/demo.yaml) on scikit-learn's bundled digits.
Under ``python -m paddle.distributed.launch --nproc_per_node N examples/train_joint.py CONFIG`` it trains on N
processes.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from mtl.cli import train_main  # noqa: E402

if __name__ == "__main__":
    train_main()
