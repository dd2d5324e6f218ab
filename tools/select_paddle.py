"""Install the Paddle wheel that fits this machine, with the rest of requirements.txt (called by the Makefile).

``--device auto`` (the default) picks ``paddlepaddle-gpu`` when ``nvidia-smi`` runs and reports a CUDA version, the
CPU wheel ``paddlepaddle`` otherwise; ``gpu`` / ``cpu`` force the choice. Both are pinned to the Paddle version of
requirements.txt. The GPU wheel comes from Paddle's wheel index for the chosen CUDA build (Paddle's own install
instruction: ``pip install paddlepaddle-gpu==X -i https://www.paddlepaddle.org.cn/packages/stable/cuXYZ/``): the
newest build not newer than the driver's CUDA version, or ``--cuda cu118|cu126|cu129``. ``--dry-run`` prints the
pip commands without running them. Only the standard library is used (this runs before the venv has anything).
"""
import argparse
import os
import re
import shlex
import subprocess
import sys

PADDLE_INDEX = "https://www.paddlepaddle.org.cn/packages/stable/{cuda}/"
CUDA_BUILDS = {"cu118": (11, 8), "cu126": (12, 6), "cu129": (12, 9)}  # Paddle 3.x GPU wheels
CPU_WHEEL, GPU_WHEEL = "paddlepaddle", "paddlepaddle-gpu"


def driver_cuda_version():
    """(major, minor) of the CUDA version ``nvidia-smi`` reports, or None when it does not run."""
    try:
        out = subprocess.run(["nvidia-smi"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = re.search(r"CUDA Version:\s*(\d+)\.(\d+)", out.stdout)
    if out.returncode != 0 or match is None:
        return None
    return int(match.group(1)), int(match.group(2))


def cuda_build_for(version):
    """The newest Paddle CUDA build that the driver's CUDA ``version`` runs, or None when it is too old."""
    fitting = [name for name, needed in CUDA_BUILDS.items() if needed <= version]
    return max(fitting, key=CUDA_BUILDS.get) if fitting else None


def installed(python, distribution):
    """Whether ``python`` (a path that may not exist yet) has ``distribution`` installed."""
    probe = f"import importlib.metadata as m; m.version({distribution!r})"
    try:
        return subprocess.run([python, "-c", probe], capture_output=True, timeout=60).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def read_requirements(path):
    """(Paddle version, the other requirement lines) of a requirements file that pins ``paddlepaddle==X``."""
    version, others = None, []
    with open(path) as f:
        for line in f:
            line = line.split("#", 1)[0].strip()
            match = re.fullmatch(r"paddlepaddle(?:-gpu)?==(\S+)", line)
            if match:
                version = match.group(1)
            elif line:
                others.append(line)
    if version is None:
        sys.exit(f"error: {path} pins no paddlepaddle==VERSION line")
    return version, others


def choose(device, cuda=None):
    """(wheel, CUDA build or None, reason) for ``device`` auto|cpu|gpu."""
    if device == "cpu":
        return CPU_WHEEL, None, "DEVICE=cpu"
    version = driver_cuda_version()
    if device == "auto" and version is None:
        return CPU_WHEEL, None, "no working nvidia-smi"
    if cuda is None:
        cuda = cuda_build_for(version) if version else "cu118"
        if cuda is None:
            sys.exit(f"error: the driver reports CUDA {version[0]}.{version[1]}; Paddle's GPU wheels need CUDA "
                     f">= 11.8 (update the driver, or DEVICE=cpu)")
    elif cuda not in CUDA_BUILDS:
        sys.exit(f"error: CUDA={cuda} is not one of Paddle's GPU builds: {', '.join(CUDA_BUILDS)}")
    found = f"nvidia-smi reports CUDA {version[0]}.{version[1]}" if version else "DEVICE=gpu without nvidia-smi"
    return GPU_WHEEL, cuda, found


def commands(python, requirements, device, cuda=None):
    """The pip commands that install requirements.txt with the chosen Paddle wheel, and the reason of the choice."""
    version, others = read_requirements(requirements)
    wheel, build, reason = choose(device, cuda)
    pip = [python, "-m", "pip", "install", "--quiet"]
    other_wheel = GPU_WHEEL if wheel == CPU_WHEEL else CPU_WHEEL
    cmds = []
    if installed(python, other_wheel):  # both wheels install the same `paddle` package: remove the other one first
        cmds.append([python, "-m", "pip", "uninstall", "--quiet", "--yes", other_wheel])
    cmds.append(pip + others)
    if build is None:
        cmds.append(pip + [f"{CPU_WHEEL}=={version}"])
    else:
        cmds.append(pip + [f"{GPU_WHEEL}=={version}", "-i", PADDLE_INDEX.format(cuda=build)])
    return cmds, f"{wheel}=={version}" + (f" ({build})" if build else "") + f": {reason}"


def main(argv=None):
    """Parse the arguments, print the choice, run (or with ``--dry-run`` only print) the pip commands."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", choices=["auto", "cpu", "gpu"], default=os.environ.get("DEVICE") or "auto")
    parser.add_argument("--cuda", default=os.environ.get("CUDA") or None, help="cu118 | cu126 | cu129")
    parser.add_argument("--python", default=sys.executable, help="the interpreter whose pip installs")
    parser.add_argument("--requirements", default="requirements.txt")
    parser.add_argument("--dry-run", action="store_true", help="print the pip commands, run nothing")
    args = parser.parse_args(argv)
    cmds, choice = commands(args.python, args.requirements, args.device, args.cuda)
    print(f"paddle wheel: {choice}", flush=True)
    for cmd in cmds:
        print(("would run: " if args.dry_run else "+ ") + shlex.join(cmd), flush=True)
        if not args.dry_run:
            subprocess.run(cmd, check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
