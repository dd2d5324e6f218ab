"""One run per output folder: a hold on ``output_dir`` taken by rank 0 of a run (per run, not per rank).

``output_dir/.run.lock`` is created atomically and complete: the record is written to a file of this process first,
then hard-linked to the lock's name (``link`` fails when the name exists; atomic on local filesystems and on NFS, the
classic NFS lock), so no reader sees an empty hold. With ``O_CREAT | O_EXCL`` and then a write, a job killed between
the two left an empty hold that the next run judged alive for ``STALE`` seconds; that path remains only for a
filesystem without hard links. The hold holds the holder's host, process id, the process's start time and a run id;
a thread touches it every ``HEARTBEAT`` seconds while the run lives. A second run that finds it:

* on the same host: the holder is alive when its process exists and started when the hold says (a process id
  reused by another program is not the holder);
* on another host (several machines sharing the filesystem): alive when the hold was touched within ``STALE``
  seconds, judged on the filesystem's own clock (the modification time of a file the caller touches now), so the
  machines' clocks need not agree;
* alive: refused in one sentence naming the holder; gone (killed, machine lost): the stale hold is moved aside
  (``.run.lock.stale.<pid>``, atomic, so of two takers only one succeeds) and taken over.

The hold is released when the run ends, however it ends (a process killed with SIGKILL leaves it, and the next run
recognises it as stale).
"""
import json
import os
import socket
import threading
import time
import uuid

from mtl.core.errors import ConfigError

LOCK_FILE = ".run.lock"
HEARTBEAT = 10.0  # seconds between touches of a live hold
STALE = 60.0  # a hold of another host untouched this long is a dead run's


def _process_start(pid: int):
    """The start time of process ``pid`` in clock ticks since boot (``/proc/<pid>/stat`` field 22), or None."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def _alive_here(pid: int, started) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's process: it exists
    return started is None or _process_start(pid) in (None, started)


class RunLock:
    """The hold on one output folder (module docstring); :meth:`acquire` raises ConfigError when a live run holds
    it."""

    def __init__(self, output_dir: str, heartbeat: float = HEARTBEAT, stale: float = STALE):
        self.output_dir, self.heartbeat, self.stale = output_dir, heartbeat, stale
        self.path = os.path.join(output_dir, LOCK_FILE)
        self.record = {"host": socket.gethostname(), "pid": os.getpid(), "started": _process_start(os.getpid()),
                       "run": uuid.uuid4().hex, "since": time.strftime("%Y-%m-%d %H:%M:%S")}
        self._stop = threading.Event()
        self._thread = None

    def acquire(self, source=None):
        """Take the hold, taking over a stale one; ConfigError naming the holder when it is a live run's."""
        os.makedirs(self.output_dir, exist_ok=True)
        for _ in range(5):
            try:
                self._create()
            except FileExistsError:
                holder = self._holder()
                if holder is not None and self._alive(holder):
                    raise ConfigError(f"output_dir '{self.output_dir}' is held by a running job (host "
                                      f"{holder.get('host')}, process {holder.get('pid')}, since "
                                      f"{holder.get('since')}; {self.path}): wait for it to finish, stop it, or "
                                      f"choose another output_dir", source, "output_dir") from None
                self._move_aside(holder)
                continue
            self._thread = threading.Thread(target=self._beat, name="mtl-run-lock", daemon=True)
            self._thread.start()
            return self
        raise ConfigError(f"output_dir '{self.output_dir}': could not take its hold {self.path} (another job keeps "
                          f"taking it)", source, "output_dir")

    def _create(self):
        """Create the hold with its record in one step (module docstring); FileExistsError when it exists."""
        # this run's own name: two hosts sharing the folder may have processes of the same id (containers)
        own = f"{self.path}.new.{self.record['run']}"
        try:
            with open(own, "w") as f:
                json.dump(self.record, f)
            try:
                os.link(own, self.path)
            except FileExistsError:
                raise
            except OSError:  # no hard links here (some FUSE and SMB mounts): create, then write
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
                with os.fdopen(fd, "w") as f:
                    json.dump(self.record, f)
        finally:
            if os.path.exists(own):
                os.remove(own)

    def release(self):
        """Give the hold back (only our own: a hold another run took over stays)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        holder = self._holder()
        if holder is not None and holder.get("run") == self.record["run"]:
            try:
                os.remove(self.path)
            except FileNotFoundError:
                pass

    def _beat(self):
        while not self._stop.wait(self.heartbeat):
            try:
                os.utime(self.path)
            except OSError:
                return

    def _holder(self):
        try:
            with open(self.path) as f:
                holder = json.load(f)
            return holder if isinstance(holder, dict) else {}
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            return {}  # unreadable: judged by its age alone

    def _alive(self, holder: dict) -> bool:
        if holder.get("pid") == os.getpid() and holder.get("host") == self.record["host"]:
            return False  # an earlier run of this same process (one that did not release it): ours to take
        if holder.get("host") == self.record["host"] and isinstance(holder.get("pid"), int):
            return _alive_here(holder["pid"], holder.get("started"))
        return self._age() < self.stale

    def _age(self) -> float:
        """Seconds since the hold was last touched, on the filesystem's clock."""
        probe = os.path.join(self.output_dir, f".run.lock.probe.{os.getpid()}")
        try:
            with open(probe, "w"):
                pass
            now = os.path.getmtime(probe)
            os.remove(probe)
            return now - os.path.getmtime(self.path)
        except OSError:
            return float("inf")

    def _move_aside(self, judged):
        """Move the stale hold ``judged`` aside, unless another run took it over meanwhile (its run id differs)."""
        now = self._holder()
        if now is None or (judged and now and now.get("run") != judged.get("run")):
            return
        try:
            os.replace(self.path, f"{self.path}.stale.{os.getpid()}")
        except FileNotFoundError:
            pass  # another taker moved it first
