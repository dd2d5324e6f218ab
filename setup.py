"""Installs the ``mtl`` library, the built-in head plug-ins and the ``mtl`` console command.

``heads/`` is a folder of plug-in files (loaded by path, like ``tasks/``), not a package: a wheel puts it under
``share/mtl/heads`` (see ``mtl.core.plugin_loading.builtin_heads_folder``), so nothing called ``heads`` lands in
site-packages.

Paddle is not a requirement here: the CPU wheel ``paddlepaddle`` and the GPU wheel ``paddlepaddle-gpu`` install the
same ``paddle`` package, and a requirement on one would make ``pip install .`` replace the other. The build is
chosen by the Makefile (``tools/select_paddle.py``: the GPU wheel where ``nvidia-smi`` works); ``pip install
.[cpu]`` asks for the CPU wheel explicitly, and ``mtl`` says in one line when no Paddle is installed.
"""
import glob

from setuptools import find_packages, setup

setup(
    name="mtl",
    version="0.1.0",
    description="Multi-task learning on one backbone with model-parallel margin heads, on PaddlePaddle",
    packages=find_packages(include=["mtl", "mtl.*"]),
    data_files=[("share/mtl/heads", sorted(glob.glob("heads/*.py")))],
    python_requires=">=3.9",
    install_requires=[  # no Paddle build (see the docstring); requirements.txt pins the version, 3.3.1
        "numpy==2.4.6",
        "pyyaml==6.0.4",
        "tabulate==0.10.0",
        "tqdm==4.70.1",
        "scikit-learn==1.9.1",
        "threadpoolctl==3.8.0",  # numpy's BLAS threads, set after numpy loaded (mtl.core.runtime)
        "matplotlib==3.11.2",
        "pillow==13.0.0",
        "opencv-python-headless==5.0.0.93",
        "tokenizers==0.23.3",  # the subword tokenizer of the text encoders (mtl.text.tokenizer)
    ],
    extras_require={"cpu": ["paddlepaddle==3.3.1"],  # the GPU build comes from Paddle's CUDA index: the Makefile
                    "test": ["pytest==9.2.0", "ruff==0.17.6", "scipy==1.17.1", "hypothesis==6.170.17"],
                    # the same pins as requirements-extras.txt: ONNX export and VisualDL scalars
                    "ecosystem": ["paddle2onnx==2.1.0", "onnx==1.17.0", "onnxruntime==1.32.0", "visualdl==2.5.3"]},
    entry_points={"console_scripts": ["mtl=mtl.cli:main"]},
)
