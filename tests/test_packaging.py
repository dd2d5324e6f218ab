"""Installing the project never replaces an installed Paddle build, in a fresh venv, offline.

``paddlepaddle`` (CPU) and ``paddlepaddle-gpu`` install the same ``paddle`` package: a ``paddlepaddle==X``
requirement in setup.py made ``pip install .`` put the CPU wheel over a GPU install. Here a fresh venv gets a stand-in
``paddlepaddle-gpu`` first, then the project with ``pip install --no-index`` from a folder that also offers a
stand-in ``paddlepaddle`` and every other pinned requirement: the GPU stand-in must stay the only Paddle. The
control installs the same wheel with the old requirement added, and the CPU stand-in does come in.

The fresh venv has no ``wheel`` package (and no network), so the project's wheel is assembled here from the metadata
setuptools writes for setup.py (``egg_info``: requirements and extras as declared); pip then resolves it.
"""
import base64
import hashlib
import json
import os
import re
import shutil
import sys
import zipfile

import pytest

from tests import warm_python

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STUB_PINS = {"paddlepaddle-gpu": "3.3.1", "paddlepaddle": "3.3.1"}


def _wheel(folder, name, version, files, requires=(), extras=(), entry_points=None):
    """A pure-Python wheel ``name==version`` holding ``files`` ({path: text}), written into ``folder``."""
    dist = f"{re.sub(r'[-.]+', '_', name)}-{version}"
    meta = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    meta += [f"Provides-Extra: {extra}" for extra in extras] + [f"Requires-Dist: {req}" for req in requires]
    content = dict(files)
    content[f"{dist}.dist-info/METADATA"] = "\n".join(meta) + "\n"
    content[f"{dist}.dist-info/WHEEL"] = ("Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                          "Tag: py3-none-any\n")
    if entry_points:
        content[f"{dist}.dist-info/entry_points.txt"] = entry_points
    record = [f"{path},sha256={_digest(text)},{len(text.encode())}" for path, text in content.items()]
    content[f"{dist}.dist-info/RECORD"] = "\n".join(record + [f"{dist}.dist-info/RECORD,,"]) + "\n"
    path = os.path.join(folder, f"{dist}-py3-none-any.whl")
    with zipfile.ZipFile(path, "w") as archive:
        for name_in, text in content.items():
            archive.writestr(name_in, text)
    return path


def _digest(text):
    return base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()


def _declared(tmp_path):
    """(requirements, {extra: requirements}, entry points) of setup.py, as setuptools writes them (egg_info)."""
    project = tmp_path / "project"
    project.mkdir()
    for name in ("setup.py", "mtl", "heads"):
        source = os.path.join(ROOT, name)
        (shutil.copytree if os.path.isdir(source) else shutil.copy)(source, project / name)
    warm_python.run([sys.executable, "setup.py", "-q", "egg_info", "--egg-base", str(tmp_path)], cwd=project,
                    check=True, capture_output=True)
    info = tmp_path / "mtl.egg-info"
    required, extras, section = [], {}, None
    for line in (info / "requires.txt").read_text().splitlines():
        if line.startswith("["):
            section = line.strip("[]")
            extras[section] = []
        elif line.strip():
            (required if section is None else extras[section]).append(line.strip())
    return required, extras, (info / "entry_points.txt").read_text()


def _project_wheel(folder, required, extras, entry_points):
    files = {os.path.relpath(os.path.join(d, f), ROOT): open(os.path.join(d, f)).read()
             for d, _, names in os.walk(os.path.join(ROOT, "mtl")) for f in names if f.endswith(".py")}
    requires = required + [f'{req}; extra == "{extra}"' for extra, reqs in extras.items() for req in reqs]
    return _wheel(folder, "mtl", "0.1.0", files, requires, list(extras), entry_points)


def _stubs(folder, required):
    """Stand-ins: both Paddle wheels (a ``paddle`` package saying which build it is) and every other pin."""
    for name, version in STUB_PINS.items():
        _wheel(folder, name, version, {"paddle/__init__.py": f"BUILD = {name!r}\n"})
    for requirement in required:
        name, version = requirement.split("==")
        _wheel(folder, name, version, {})


def _pip(venv, *args):
    """This interpreter's pip run for the fresh venv (``pip --python``: pip executes under the venv's interpreter and
    installs into it), with no machine-wide configuration."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_") and k != "PYTHONPATH"}  # the checkout's
    # mtl.egg-info on the path would read as mtl installed already
    env["PIP_CONFIG_FILE"] = os.devnull  # no machine-wide find-links or index: only the stub folder
    out = warm_python.run([sys.executable, "-m", "pip", "--python", os.path.join(venv, "bin", "python"), *args,
                          "--disable-pip-version-check"], env=env, capture_output=True, text=True, timeout=600,
                         cwd=os.path.dirname(venv))  # not the checkout: its mtl.egg-info would read as installed
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


# what the venv's own interpreter sees installed (importlib.metadata: every distribution on its path) and which
# Paddle build ``import paddle`` gives it
INSTALLED = ("import importlib.metadata as m, json, paddle; "
             "print(json.dumps([sorted({d.metadata['Name'].lower() for d in m.distributions()}), paddle.BUILD]))")


def _install_over_gpu(tmp_path, name, wheel, stubs):
    """A fresh venv with the GPU stand-in, then ``wheel`` from the stub folder; (installed names, paddle's build).
    The venv is made without pip (``ensurepip`` costs seconds; pip runs from outside with ``--python``)."""
    venv = str(tmp_path / name)
    warm_python.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True, capture_output=True, timeout=600)
    _pip(venv, "install", "--no-index", "--find-links", stubs, "paddlepaddle-gpu==3.3.1")
    _pip(venv, "install", "--no-index", "--find-links", stubs, wheel)
    installed, build = json.loads(warm_python.run([os.path.join(venv, "bin", "python"), "-I", "-c", INSTALLED],
                                                  capture_output=True, text=True, check=True).stdout)
    return set(installed), build


@pytest.mark.slow
@pytest.mark.subprocess
def test_installing_the_project_keeps_the_installed_gpu_paddle(tmp_path):
    required, extras, entry_points = _declared(tmp_path)
    assert not [r for r in required if r.startswith("paddlepaddle")]
    assert extras.get("cpu") == ["paddlepaddle==3.3.1"]  # the CPU wheel only when asked for: pip install .[cpu]
    stubs, wheels = str(tmp_path / "stubs"), str(tmp_path / "wheels")
    os.makedirs(stubs)
    os.makedirs(wheels)
    _stubs(stubs, required)
    installed, build = _install_over_gpu(tmp_path, "venv", _project_wheel(wheels, required, extras, entry_points),
                                         stubs)
    assert {"mtl", "paddlepaddle-gpu"} <= installed and "paddlepaddle" not in installed
    assert build == "paddlepaddle-gpu"
    # the control: the requirement setup.py once had (``paddlepaddle==3.3.1``) brings the CPU wheel in over the GPU one
    old = str(tmp_path / "old")
    os.makedirs(old)
    installed, build = _install_over_gpu(tmp_path, "venv_old", _project_wheel(
        old, required + ["paddlepaddle==3.3.1"], extras, entry_points), stubs)
    assert "paddlepaddle" in installed and build == "paddlepaddle"


def test_mtl_says_in_one_line_when_no_paddle_is_installed(monkeypatch, capsys):
    import importlib.util

    from mtl import cli

    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "paddle" else object())
    with pytest.raises(SystemExit) as stop:
        cli.main(["train", "--help"])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "paddlepaddle-gpu==3.3.1" in err and "make venv" in err
