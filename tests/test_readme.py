"""The README works as written: every command of its ``sh`` blocks runs, in order, in one shell with a newcomer's
PATH, from a fresh working directory (a copy of the repository's layout with empty ``runs/``); every ``make`` target
it names exists; every link points at a file; it stays short (depth goes to docs/)."""
import os
import re
import shlex
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")
MAX_LINES = 300


def readme_commands():
    """Every command line of the README's ``sh`` blocks, in order, as argument lists (comments dropped)."""
    text = open(README).read()
    commands = []
    for block in re.findall(r"```sh\n(.*?)```", text, re.S):
        for line in block.splitlines():
            words = shlex.split(line, comments=True)
            if words:
                commands.append(words)
    return commands


def test_readme_is_short_and_its_links_exist():
    lines = open(README).read().splitlines()
    assert len(lines) < MAX_LINES, f"README.md has {len(lines)} lines; move depth to docs/"
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", "\n".join(lines)):
        if not target.startswith("http"):
            assert os.path.exists(os.path.join(ROOT, target)), f"README links to a missing file: {target}"


def test_every_yaml_block_that_names_its_file_shows_that_file():
    """A ``yaml`` block whose introducing paragraph names a ``.yaml`` file of the repository (the last one named
    before the block) holds the same settings as that file (comments aside)."""
    import yaml

    text = open(README).read()
    checked = 0
    for match in re.finditer(r"```yaml\n(.*?)```", text, re.S):
        before = text[:match.start()].rstrip().rsplit("\n\n", 1)[-1]
        named = re.findall(r"`([\w/.-]+\.yaml)`", before)
        if named:
            assert yaml.safe_load(match.group(1)) == yaml.safe_load(open(os.path.join(ROOT, named[-1]))), named[-1]
            checked += 1
    assert checked


def test_every_make_target_the_readme_names_exists():
    makefile = open(os.path.join(ROOT, "Makefile")).read()
    targets = set(re.findall(r"^([\w-]+):", makefile, re.M))
    named = {words[1] for words in readme_commands() if words[0] == "make"}
    named |= set(re.findall(r"`make ([\w-]+)", open(README).read()))
    assert named and named <= targets, named - targets


def newcomer_path():
    """The PATH of a shell before the README's set-up: this machine's, without any virtual environment's bin."""
    return os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep)
                           if p and not os.path.isfile(os.path.join(p, "activate")))


def readme_script():
    """Every non-``make`` line of the README's ``sh`` blocks, in order, in one shell script that stops at the first
    line that fails (naming it); ``make`` lines are the CI's and the demo test's (their .venv is this one)."""
    lines = ["if command -v mtl >/dev/null; then echo 'mtl is on the PATH before the README puts it there' >&2; "
             "exit 3; fi"]
    for words in readme_commands():
        if words[0] != "make":
            line = shlex.join(words)
            lines.append(f"{line} || {{ echo {shlex.quote('README line failed: ' + line)} >&2; exit 1; }}")
    return "\n".join(lines) + "\n"


@pytest.mark.slow
@pytest.mark.subprocess
def test_every_readme_command_runs_in_order_with_a_newcomers_path(tmp_path):
    """The lines run as a newcomer's shell runs them after ``make demo``: from a fresh folder holding the
    repository's layout (``examples``, ``tasks``, the ``.venv`` that ``make demo`` made) with the PATH the machine
    had (no virtual environment on it): ``mtl`` is found only because a README line put it there."""
    for name in ("examples", "tasks", ".venv"):
        os.symlink(os.path.join(ROOT, name), tmp_path / name)
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "OMP_NUM_THREADS", "MTL_VERBOSE")}
    env.update(PYTHONPATH=ROOT, PATH=newcomer_path())  # this checkout's mtl, under the venv's console script
    script = readme_script()
    assert script.count("README line failed") >= 8
    proc = subprocess.run(["bash", "-c", script], capture_output=True, text=True, cwd=str(tmp_path), env=env,
                          timeout=3600)
    assert proc.returncode == 0, f"{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    assert (tmp_path / "runs" / "own_data" / "export" / "eval_pairs_s1_s2_s12.json").is_file()


def test_the_readme_puts_mtl_on_the_path_before_its_first_mtl_line():
    """A newcomer's shell has no ``mtl`` until ``.venv/bin`` is on its PATH: a line before the first ``mtl`` line
    activates the environment (what the test above runs, in order)."""
    words = [w for w in readme_commands() if w[0] != "make"]
    first_mtl = next(i for i, w in enumerate(words) if w[0] == "mtl")
    assert [".", ".venv/bin/activate"] in words[:first_mtl], words[:first_mtl + 1]
