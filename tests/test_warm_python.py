"""tests/warm_python.py against its reference, a new interpreter: the same command through ``warm_python.run`` and
through ``subprocess.run`` gives the same exit status, output and files; what it cannot run the same way goes to a
new interpreter."""
import json
import os
import subprocess
import sys

import pytest

from tests import warm_python

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# what a process sees of itself: argv, folder, a variable, sys.path[0], __name__, whether stdin has data
SELF = ("import json, os, sys; print(json.dumps({'argv': sys.argv, 'cwd': os.getcwd(), 'var': os.environ.get('WP_VAR'),"
        " 'path0': sys.path[0], 'in_path': os.environ.get('WP_DIR', '-') in sys.path, 'name': __name__,"
        " 'stdin': sys.stdin.read()}))")
SCRIPT = """import json, os, sys
import mylib
print(json.dumps({"argv": sys.argv, "path0": sys.path[0], "name": __name__, "lib": mylib.VALUE}))
print("to stderr", file=sys.stderr)
sys.exit(int(sys.argv[1]))
"""

COMMANDS = {
    "code": (["-c", SELF, "a", "b"], None),
    "code with stdin": (["-c", SELF], "fed\n"),
    "script and exit status": (["{dir}/script.py", "3"], None),
    "unbuffered script": (["-u", "{dir}/script.py", "0"], None),
    "module": (["-m", "mylib", "x"], None),
    "uncaught exception": (["-c", "import sys\nprint('before')\nraise ValueError('boom')"], None),
    "sys.exit with a message": (["-c", "import sys; sys.exit('a message')"], None),
    "an atexit handler": (["-c", "import atexit; atexit.register(lambda: print('at exit'))"], None),
    "a thread joined at exit": (["-c", "import threading, time\nthreading.Thread(target=lambda: (time.sleep(0.3), "
                                       "print('thread done'))).start()"], None),
    "carriage returns": (["-c", "import sys; sys.stdout.write('a\\rb\\r\\nc')"], None),
}


@pytest.fixture
def folder(tmp_path):
    """A folder with a script and an importable module (found through PYTHONPATH)."""
    (tmp_path / "script.py").write_text(SCRIPT)
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "mylib.py").write_text("import sys\nVALUE = 42\nif __name__ == '__main__':\n"
                                  "    print('main', sys.argv, __name__)\n")
    return tmp_path


def both(argv, folder, stdin=None, **options):
    """The command run by a fork of the warm server and by a new interpreter (results with the folder masked)."""
    cmd = [sys.executable, *[a.replace("{dir}", str(folder)) for a in argv]]
    env = dict(os.environ, WP_VAR="v", WP_DIR=str(folder / "lib"), PYTHONPATH=str(folder / "lib"))
    assert warm_python.forkable(cmd, env, options)
    runs = [run(cmd, input=stdin, capture_output=True, text=True, cwd=str(folder), env=env, timeout=60, **options)
            for run in (warm_python.run, subprocess.run)]
    return [(r.returncode, r.stdout.replace(str(folder), "DIR"), r.stderr.replace(str(folder), "DIR")) for r in runs]


@pytest.mark.subprocess
@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_a_forked_command_runs_as_in_a_new_interpreter(folder, name):
    argv, stdin = COMMANDS[name]
    (warm_code, warm_out, warm_err), (code, out, err) = both(argv, folder, stdin)
    assert (warm_code, warm_out) == (code, out)
    if "Traceback" in err:  # the same exception, raised from the same line of the command
        assert warm_err.splitlines()[-1] == err.splitlines()[-1] and "warm_python" not in warm_err, warm_err
    else:
        assert warm_err == err


@pytest.mark.subprocess
def test_a_forked_command_draws_fresh_random_seeds(folder):
    """Two forks draw different Python, numpy and Paddle random numbers, as two new interpreters do."""
    code = ("import json, random, numpy, paddle; print(json.dumps([random.random(), float(numpy.random.rand()), "
            "float(paddle.rand([1]).numpy()[0])]))")
    draws = [json.loads(warm_python.run([sys.executable, "-c", code], capture_output=True, text=True,
                                        timeout=60).stdout) for _ in range(2)]
    assert all(a != b for a, b in zip(*draws)), draws


@pytest.mark.subprocess
def test_stderr_to_stdout_and_a_timeout_that_kills(folder):
    cmd = [sys.executable, "-c", "import sys; print('out'); print('err', file=sys.stderr, flush=True)"]
    merged = warm_python.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60)
    assert merged.stdout == subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True).stdout
    slow = [sys.executable, "-c", "import os, time; print(os.getpid(), flush=True); time.sleep(60)"]
    with pytest.raises(subprocess.TimeoutExpired) as stopped:
        warm_python.run(slow, capture_output=True, text=True, timeout=1)
    pid = int(stopped.value.stdout)
    import time

    deadline = time.time() + 10
    while gone(pid) is False and time.time() < deadline:
        time.sleep(0.05)
    assert gone(pid), f"process {pid} still runs after its timeout"  # killed, not left to finish


def gone(pid):
    """True when process ``pid`` has exited (no such process, or a zombie waiting for its parent)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


@pytest.mark.subprocess
def test_a_forked_report_forks_its_own_runs_too(folder):
    """A command's own ``subprocess.run([sys.executable, ...])`` goes to the same server: the inner process's
    parent is the server, and what it prints comes back as from a new interpreter."""
    inner = "import os; print(os.getppid())"
    outer = ("import subprocess, sys, os; done = subprocess.run([sys.executable, '-c', " + repr(inner) + "], "
             "capture_output=True, text=True); print(done.stdout.strip(), os.getpid())")
    result = warm_python.run([sys.executable, "-c", outer], capture_output=True, text=True, timeout=60)
    inner_parent, outer_pid = map(int, result.stdout.split())
    assert inner_parent == warm_python.server_pid() != outer_pid
    fresh = subprocess.run([sys.executable, "-c", outer], capture_output=True, text=True, timeout=60)
    assert len(fresh.stdout.split()) == 2 and fresh.stdout.split()[0] == fresh.stdout.split()[1]


@pytest.mark.subprocess  # (the server's environment decides)
@pytest.mark.parametrize("cmd, env, why", [
    (["python3", "-c", "1"], {}, "another interpreter"),
    (["{python}", "-I", "-c", "1"], {}, "a flag of its own"),
    (["{python}", "-c", "1"], {"OMP_NUM_THREADS": "7"}, "a variable Paddle reads at import"),
    (["{python}", "-c", "1"], {"FLAGS_check_nan_inf": "1"}, "a Paddle flag"),
    (["{python}", "-c", "1"], {"MTL_VERBOSE": "1"}, "Paddle's glog would show"),
    (["{python}", "-m", "mtl.cli", "train", "job.yaml", "--verbose"], {}, "Paddle's glog would show"),
])
def test_what_a_fork_would_run_differently_goes_to_a_new_interpreter(cmd, env, why):
    cmd = [c.format(python=sys.executable) for c in cmd]
    assert not warm_python.forkable(cmd, dict(os.environ, **env), {}), why
    assert warm_python.forkable([sys.executable, "-c", "1"], dict(os.environ), {})
    assert not warm_python.forkable([sys.executable, "-c", "1"], dict(os.environ), {"start_new_session": True})


def test_the_tests_of_what_happens_before_paddle_is_imported_use_new_interpreters():
    """The tests whose subject is a new interpreter's start (the README, Paddle's import warning, the thread count
    set before Paddle starts) call subprocess.run themselves."""
    for name, text in (("test_readme.py", "subprocess.run([\"bash\""),
                       ("test_text_report.py", "done = subprocess.run([sys.executable"),
                       ("test_documented_keys.py", "done = subprocess.run([sys.executable, \"-c\", PROBE")):
        assert text in open(os.path.join(ROOT, "tests", name)).read(), name


@pytest.mark.subprocess
def test_a_server_that_is_gone_is_one_sentence(monkeypatch, tmp_path):
    server = dict(warm_python.start(), path=str(tmp_path / "no_socket"))
    server["environ"] = warm_python.start()["environ"] or (dict(os.environ), {})
    monkeypatch.setattr(warm_python, "_server", server)
    with pytest.raises(RuntimeError, match="warm Python server .* is gone .* MTL_TESTS_COLD=1"):
        warm_python.run([sys.executable, "-c", "1"], capture_output=True, timeout=60)
