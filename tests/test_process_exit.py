"""mtl's entry points end the process as Python's shutdown does, without tearing the modules down one by one
(mtl.core.runtime.run_as_process / exit_process): everything a command prints, its atexit handlers and its non-daemon
threads come out as under plain Python (the reference: the same program without it), with the same exit status;
only the finalisation of what is still referenced at exit is skipped."""
import os
import subprocess
import sys

import pytest

from mtl import cli
from mtl.data.loader import WORKER_CHECK_INTERVAL, WorkerLoader

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# a program whose end shows every part of Python's shutdown; COMMAND is what it does last
PROGRAM = """
import atexit, sys, threading, time
atexit.register(lambda: print("atexit ran", flush=False))
def late():
    time.sleep(0.3)
    print("thread done")
threading.Thread(target=late).start()
sys.stdout.write("buffered, never flushed")
def command():
    {command}
"""
ENDS = {"returns": "pass", "exit 3": "sys.exit(3)", "exit None": "sys.exit()", "exit message": "sys.exit('bad input')",
        "exit 0": "sys.exit(0)"}


def run_program(command, quick):
    body = PROGRAM.format(command=command)
    body += ("from mtl.core.runtime import run_as_process\nrun_as_process(command)\n" if quick else "command()\n")
    return subprocess.run([sys.executable, "-c", body], capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, PYTHONPATH=ROOT))


@pytest.mark.subprocess
@pytest.mark.parametrize("end", sorted(ENDS))
def test_a_quick_exit_prints_and_exits_as_python_does(end):
    quick, plain = run_program(ENDS[end], True), run_program(ENDS[end], False)
    assert (quick.returncode, quick.stdout, quick.stderr) == (plain.returncode, plain.stdout, plain.stderr)
    assert "thread done" in quick.stdout and "atexit ran" in quick.stdout and "never flushed" in quick.stdout


@pytest.mark.subprocess
@pytest.mark.parametrize("form", ["-c", "-m", "script"])
def test_a_quick_exit_skips_the_finalisation_of_what_is_still_referenced(tmp_path, form):
    """As the process's own program (``python -c``, ``python -m``, ``python SCRIPT``, the console script)."""
    body = ("class Held:\n    def __del__(self):\n        print('finalised')\nheld = Held()\n"
            "from mtl.core.runtime import run_as_process\nrun_as_process(lambda: print('done'))\n")
    plain_body = body.replace("run_as_process(lambda: print('done'))", "print('done')")

    def run(text):
        (tmp_path / "command.py").write_text(text)
        args = {"-c": ["-c", text], "-m": ["-m", "command"], "script": [str(tmp_path / "command.py")]}[form]
        return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=60, cwd=str(tmp_path),
                              env=dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, str(tmp_path)])))

    quick, plain = run(body), run(plain_body)
    assert plain.stdout == "done\nfinalised\n" and quick.stdout == "done\n", (plain.stdout, quick.stdout)


def test_the_commands_end_the_process_only_when_they_are_the_process(monkeypatch, capsys):
    """``mtl`` and ``examples/train_joint.py`` (argv from sys.argv) end through run_as_process; called with argv
    (tests, other code) they return or raise SystemExit as functions do."""
    ended = []
    monkeypatch.setattr("mtl.core.runtime.run_as_process", lambda func, *args: ended.append((func, args)))
    monkeypatch.setattr(sys, "argv", ["mtl", "launch", "--help"])
    cli.main()
    cli.train_main()
    assert [(f.__name__, a) for f, a in ended] == [("_main", (["launch", "--help"],)),
                                                    ("_train_main", (["launch", "--help"],))]
    with pytest.raises(SystemExit) as stopped:
        cli.main(["launch", "--help"])
    assert stopped.value.code == 0 and "usage: mtl launch" in capsys.readouterr().out


def test_the_data_workers_are_watched_every_half_second():
    """Paddle's reader thread looks for a dead worker every DataLoader ``timeout`` seconds while it waits for a
    batch (5 s when it is 0, its default): a worker the OOM killer took is said within half a second."""
    from tests.dist_scripts.faulty_readers.faulty_readers import RaisingReader

    loader = WorkerLoader(RaisingReader(num_samples=4, num_classes=2, bad_index=99), 1)
    assert loader.loader.timeout == WORKER_CHECK_INTERVAL == 0.5


@pytest.mark.subprocess
def test_under_a_profiler_the_process_goes_on_to_write_the_profile(tmp_path):
    """``python -m cProfile -o F SCRIPT`` writes F after SCRIPT returns: a script that would end the process quickly
    leaves that to the profiler, and ends as the same script without the quick exit does under it."""
    def profiled(name, last_line):
        script = tmp_path / f"{name}.py"
        script.write_text(f"import sys\nsys.path.insert(0, {ROOT!r})\nfrom mtl.core.runtime import run_as_process\n"
                          f"{last_line}\n")
        profile = tmp_path / f"{name}.prof"
        done = subprocess.run([sys.executable, "-m", "cProfile", "-o", str(profile), str(script)],
                              capture_output=True, text=True, timeout=60)
        return done, profile

    quick, quick_profile = profiled("quick", "run_as_process(lambda: print('ran') or sys.exit(4))")
    plain, plain_profile = profiled("plain", "print('ran'); sys.exit(4)")
    assert (quick.returncode, quick.stdout, quick.stderr) == (plain.returncode, plain.stdout, plain.stderr)
    assert quick.stdout == "ran\n" and plain_profile.is_file()
    assert quick_profile.is_file() and quick_profile.stat().st_size > 0
