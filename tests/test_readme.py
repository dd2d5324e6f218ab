"""The README works as written: every command of its ``sh`` blocks runs, in order, from a fresh working directory
(a copy of the repository's layout with empty ``runs/``); every ``make`` target it names exists; every link points
at a file; it stays short (depth goes to docs/)."""
import os
import re
import shlex
import subprocess
import sys

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


@pytest.mark.slow
@pytest.mark.subprocess
def test_every_readme_command_runs_in_order(tmp_path):
    """``make`` lines are the CI's and the demo test's; every other line runs here as written (``mtl`` is the
    installed console script, ``python -m mtl.cli``)."""
    for name in ("examples", "tasks"):
        os.symlink(os.path.join(ROOT, name), tmp_path / name)
    env = dict(os.environ, PYTHONPATH=ROOT)
    env.pop("OMP_NUM_THREADS", None)
    ran = 0
    for words in readme_commands():
        if words[0] == "make":
            continue
        command = [sys.executable, "-m", "mtl.cli", *words[1:]] if words[0] == "mtl" else words
        proc = subprocess.run(command, capture_output=True, text=True, cwd=str(tmp_path), env=env, timeout=900)
        assert proc.returncode == 0, f"{shlex.join(words)}\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
        ran += 1
    assert ran >= 8
    assert (tmp_path / "runs" / "own_data" / "export" / "eval_pairs_s1_s2_s12.json").is_file()
