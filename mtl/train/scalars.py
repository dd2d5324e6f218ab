"""VisualDL scalars of a run: every number of every ``metrics.jsonl`` record, under ``output_dir/vdl/``.

``log.visualdl: true`` turns it on. Tags are the record keys (``loss``, ``loss/<task>``, ``lr``, ``grad_norm``,
``<metric>/<task>``, ``eval/<task>/<metric>``, ``eval_averaged/<task>/<metric>``, ``samples_per_s``), the step is
the record's ``step``. ``visualdl --logdir output_dir/vdl`` shows them. VisualDL (Paddle's TensorBoard) is an optional
extra (requirements-extras.txt): it installs and runs with our pins (protobuf 7, numpy 2.4), so no TensorBoard fallback
is needed.
"""
import math
import os
import shutil

from mtl.core.errors import ConfigError

SCALAR_DIR = "vdl"


def visualdl_available():
    """Whether VisualDL can be imported."""
    try:
        import visualdl  # noqa: F401
    except ImportError:
        return False
    return True


def check_available(cfg):
    """At load time: ``log.visualdl: true`` needs VisualDL installed (a ConfigError naming the key otherwise)."""
    if cfg["log"].get("visualdl") and not visualdl_available():
        raise ConfigError("log.visualdl is true but VisualDL is not installed; install the optional extra "
                          "(pip install -r requirements-extras.txt) or set log.visualdl: false", cfg.get("source"),
                          "log.visualdl")


def scalars_of(record):
    """``{tag: float}`` of a metrics record: its finite numbers except ``step`` (booleans are flags, not scalars)."""
    out = {}
    for key, value in record.items():
        if key == "step" or isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if math.isfinite(value):
            out[key] = float(value)
    return out


class ScalarWriter:
    """Writes metrics records as VisualDL scalars into ``logdir``, flushed after every record.

    The folder is started afresh and ``replay`` (the records a resumed run keeps) is written first, so that the
    steps a stopped run logged after its checkpoint do not show twice.
    """

    def __init__(self, logdir, replay=()):
        try:
            from visualdl import LogWriter
        except ImportError:
            raise ConfigError("log.visualdl is true but VisualDL is not installed (pip install -r "
                              "requirements-extras.txt)", key="log.visualdl") from None
        shutil.rmtree(logdir, ignore_errors=True)
        os.makedirs(logdir, exist_ok=True)
        self.logdir = logdir
        self._writer = LogWriter(logdir=logdir)
        for record in replay:
            self._add(record)
        self._writer.flush()

    def _add(self, record):
        step = record.get("step")
        if step is None:
            return
        for tag, value in scalars_of(record).items():
            self._writer.add_scalar(tag=tag, value=value, step=int(step))

    def write(self, record):
        """Add the record's scalars at its step and flush them to disk."""
        self._add(record)
        self._writer.flush()

    def close(self):
        """Flush and close the event file."""
        self._writer.close()


def read_scalars(logdir):
    """``{tag: [(step, value), ...]}`` of every VisualDL record file under ``logdir`` (for tests and tools)."""
    from visualdl import LogReader

    out = {}
    for name in sorted(os.listdir(logdir)):
        if "vdlrecords" not in name:
            continue
        reader = LogReader(file_path=os.path.join(logdir, name))
        for tag in reader.get_tags().get("scalar", []):
            out.setdefault(tag, []).extend((int(r.id), float(r.value)) for r in reader.get_data("scalar", tag))
    return out
