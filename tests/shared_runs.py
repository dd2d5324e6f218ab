"""Training runs shared by the tests of a session: every 2-process run in one launch, 1-process runs in this process.

A launch of ``python -m paddle.distributed.launch --nproc_per_node 2`` costs seconds before the first step (the
launcher's and both workers' Paddle import, the process group, the launcher's 1 s polling of its workers), while
the small jobs of the tests train in about a second each. So:

* A test module registers each 2-process run it needs with ``@two_process_run("name")``: a function of an empty
  folder that writes what the run needs there and returns ``(entry, result)``, the entry that
  ``tests/dist_scripts/run_batch.py`` executes on both ranks (``{"train": ARGV}``: ``examples/train_joint.py ARGV``
  as the launcher would run it; ``{"call": [SCRIPT, FUNCTION, *ARGS]}``: a function of a test script) and what the
  test gets back (usually the run's folder). A test that reads runs is marked
  ``@pytest.mark.two_process_runs("name", ...)``.
* The session fixture ``two_process``, set up for the first test that uses it, starts one launch of every run named
  by the markers of the selected tests, in registration order; the runs are independent jobs (each seeds itself) on
  the same 2 processes. A run that no marker names gets a launch of its own when asked for.
* A resumed run still starts in a process that never trained its job: a run cut short in this launch is resumed in
  a later launch (or in this process), never in this one.
* ``one_process[name]`` (runs registered with ``@one_process_run``) trains a 1-process reference once per session,
  in this process: nothing about a 1-process run needs a process of its own (``train_here``).
* Under pytest-xdist (``make test`` runs three workers) the runs live in a folder of the session that every worker
  shares: the first worker that needs a launch (or a 1-process run) makes it under a file lock and records its
  results there; a worker that comes later waits for the lock and reads them. Each run trains once per session.
"""
import argparse
import contextlib
import fcntl
import json
import os
import pathlib
import pickle
import re
import time

import pytest

from mtl.core.safe_pickle import BUILTINS, NUMPY, load_pickle
from tests.dist_util import ROOT, run_distributed

# what the records of the session's runs hold (numbers, paths, arrays), read back with the safe reader
RESULTS = {**BUILTINS, **NUMPY, ("pathlib", "PosixPath"): pathlib.PosixPath}

RUN_BATCH = os.path.join(ROOT, "tests", "dist_scripts", "run_batch.py")
TWO_PROCESS_RUNS = {}  # name -> function(folder) -> (entry, result)
ONE_PROCESS_RUNS = {}  # name -> function(folder) -> (argv of train_here, result)


def two_process_run(name):
    """Register a 2-process run of the session's launch (see the module docstring)."""
    def register(build):
        TWO_PROCESS_RUNS[name] = build
        return build
    return register


def one_process_run(name):
    """Register a 1-process run trained once per session by ``one_process``: ``build(folder)`` returns
    ``(argv of train_here, result)``."""
    def register(build):
        ONE_PROCESS_RUNS[name] = build
        return build
    return register


def train_here(*argv):
    """Train in this process exactly as ``examples/train_joint.py ARGV`` trains one process (the same argument parser
    and ``mtl.commands.train.train``); return the summary. A user error raises instead of exiting with status 2."""
    from mtl.commands.train import add_train_args, train

    parser = argparse.ArgumentParser()
    add_train_args(parser)
    return train(parser.parse_args([str(a) for a in argv]))


class TwoProcessRuns:
    """The 2-process runs of the session: ``runs[name]`` is the result of a run (of the session's launch, or of a
    launch of its own for a run no marker names); ``runs.output(name)`` is everything the launch that ran it printed
    (the launcher's console and both ranks' logs)."""

    def __init__(self, session, root):
        self.session, self.root = session, root
        self.results, self.outputs = {}, {}

    def wanted(self):
        """Every run named by a ``two_process_runs`` marker of a selected test, in registration order."""
        names = set()
        for item in self.session.items:
            for marker in item.iter_markers("two_process_runs"):
                names.update(marker.args)
        unknown = names - set(TWO_PROCESS_RUNS)
        assert not unknown, f"two_process_runs marker names unregistered runs: {sorted(unknown)}"
        return [name for name in TWO_PROCESS_RUNS if name in names]

    def __getitem__(self, name):
        if name not in self.results:
            self.launch([n for n in self.wanted() if n not in self.results] or [name], name)
        code, output = self.outputs[name]
        assert code == 0, f"the launch of the 2-process runs failed with exit code {code} {failed_in(output)}:\n" \
                          f"{output[-20000:]}"
        return self.results[name]

    def output(self, name):
        """What the launch that ran ``name`` printed: the launcher's console and every rank's log."""
        self[name]
        return self.outputs[name][1]

    def launch(self, names, needed):
        """Launch ``names`` (and ``needed``) in one launch, unless a pytest-xdist worker of this session already has:
        the launches are recorded in the shared folder, under a lock, so each run trains once per session."""
        if needed not in names:
            names = names + [needed]
        with shared_lock(self.root):
            record = self.root / "launched.pickle"
            launched = load_pickle(str(record), RESULTS) if record.is_file() else {}
            fresh = [name for name in names if name not in launched]
            if needed not in launched:
                launched.update(self.launch_here(fresh))
                record.write_bytes(pickle.dumps(launched))
        for name, (result, code, output) in launched.items():
            self.results[name], self.outputs[name] = result, (code, output)

    def launch_here(self, names):
        """One launch of ``names`` from this process: ``{name: (result, exit code, output)}``."""
        spec, results, started = [], {}, time.time()
        for name in names:
            folder = self.root / name
            folder.mkdir()
            entry, results[name] = TWO_PROCESS_RUNS[name](folder)
            spec.append(dict(entry, name=name))
        path = self.root / f"batch_{len(list(self.root.glob('batch_*.json')))}.json"
        path.write_text(json.dumps(spec, indent=1))
        code, output = run_distributed(RUN_BATCH, 2, [str(path)], timeout=1800)
        output = f"{len(names)} runs in one launch ({time.time() - started:.1f} s): {', '.join(names)}\n{output}"
        return {name: (results[name], code, output) for name in names}


@contextlib.contextmanager
def shared_lock(folder, name="all"):
    """An exclusive lock ``name`` in ``folder`` among the processes of the session (pytest-xdist workers)."""
    with open(folder / f".{name}.lock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def shared_folder(tmp_path_factory, name):
    """``name`` under the session's base folder, shared by its pytest-xdist workers (each has a base of its own
    inside the session's); created once."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent
    folder = base / name
    folder.mkdir(exist_ok=True)
    return folder


def failed_in(output):
    """Which run of a failed launch each rank was in (the last one it started and did not finish)."""
    started = {}
    for line in output.splitlines():
        match = re.match(r"\[run_batch\] rank (\d+): (\S+) (\.\.\.|done)", line)
        if match:
            rank, name, state = match.groups()
            started[rank] = None if state == "done" else name
    where = [f"rank {rank} in run '{name}'" for rank, name in sorted(started.items()) if name]
    return f"({', '.join(where)})" if where else "(before or after every run)"


class OneProcessRuns:
    """``runs[name]``: the result of a registered 1-process run, trained in this process on first use."""

    def __init__(self, root):
        self.root, self.results = root, {}

    def __getitem__(self, name):
        if name not in self.results:
            with shared_lock(self.root, name):  # trained once per session, by the first worker that asks
                record = self.root / f"{name}.pickle"
                if not record.is_file():
                    folder = self.root / name
                    folder.mkdir()
                    argv, result = ONE_PROCESS_RUNS[name](folder)
                    train_here(*argv)
                    record.write_bytes(pickle.dumps(result))
                self.results[name] = load_pickle(str(record), RESULTS)
        return self.results[name]


@pytest.fixture(scope="session")
def two_process(request, tmp_path_factory):
    """The session's 2-process runs (:class:`TwoProcessRuns`), launched when the fixture is set up (its time shows
    as the setup of the first test that uses it)."""
    runs = TwoProcessRuns(request.session, shared_folder(tmp_path_factory, "two_process"))
    wanted = runs.wanted()
    if wanted:
        runs.launch(wanted, wanted[0])
    return runs


@pytest.fixture(scope="session")
def one_process(tmp_path_factory):
    """The session's shared 1-process runs (:class:`OneProcessRuns`)."""
    return OneProcessRuns(shared_folder(tmp_path_factory, "one_process"))
