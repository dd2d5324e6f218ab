"""User-facing errors: one sentence naming the file, the key path and what was expected."""


class MtlError(Exception):
    """Base class of errors meant for users (printed as one line, exit status ``exit_status``, no traceback).

    ``source`` is the file (or "<inline>") and ``key`` the dotted key path, e.g. ``schedule.batch_size``; the
    message is printed after them (``bare_message`` keeps it without them).
    """

    exit_status = 2

    def __init__(self, message="", source=None, key=None):
        self.source = source
        self.key = key
        self.bare_message = message
        where = ""
        if source and key:
            where = f"{source}: {key}: "
        elif source:
            where = f"{source}: "
        elif key:
            where = f"{key}: "
        super().__init__(where + message)

    def located(self, source) -> str:
        """The bare message once the file ``source`` that gave the failing value is known (the component that raised
        did not know it); most errors need nothing from it."""
        return self.bare_message


class ConfigError(MtlError):
    """A job, task or component configuration is wrong."""


class ParameterError(ConfigError, ValueError):
    """A plug-in's parameter has a value the plug-in cannot work with: what a reader, backbone, head or weighting
    constructor raises for a bad config value (anything else it raises is a bug in the plug-in, reported as one)."""


class PluginError(MtlError):
    """A plug-in raised something other than a user error while it was built or run: a bug in the plug-in, named
    with its file; ``traceback_text`` (for the run's log) says where."""

    def __init__(self, message="", traceback_text=""):
        super().__init__(message)
        self.traceback_text = traceback_text


class ContractError(MtlError):
    """Two plug-ins disagree on a field (name, shape or dtype)."""


class DataError(MtlError):
    """A data file or record is unreadable or holds a value outside what its task expects."""


class DiskError(MtlError):
    """A file of the run could not be written (a full disk, a read-only filesystem, no permission, an I/O error): the
    job stops with exit status 74 (``EX_IOERR`` of sysexits.h) and one sentence naming the file and why."""

    exit_status = 74


def write_problem(path, exc: OSError) -> str:
    """``could not write 'PATH': No space left on device (ENOSPC)``: the words for an OSError met writing ``path``."""
    import errno

    name = errno.errorcode.get(exc.errno, "")
    why = exc.strerror or str(exc) or type(exc).__name__
    return f"could not write '{path}': {why}" + (f" ({name})" if name else "")


def absent(path) -> str:
    """Why a file the user named cannot be read, for the end of a sentence: ``is a folder, not a file`` or ``does
    not exist`` (a folder given for a file was said not to exist)."""
    import os

    return "is a folder, not a file" if os.path.isdir(path) else "does not exist"


def require_input_file(path):
    """DataError unless ``path`` is a file: an input given to ``mtl embed`` or ``mtl predict`` (a folder is said to be
    one, not to be missing)."""
    import os

    if os.path.isdir(path):
        raise DataError(f"input '{path}' is a folder; give its files (e.g. '{os.path.join(path, '*.png')}')")
    if not os.path.isfile(path):
        raise DataError(f"input '{path}' does not exist")


RECORD_MARKERS = ("job.json", "export.json")  # a folder holding one is a run or an export
# what a run or an export keeps at its top (the checkpoints, heads and logs are in its sub-folders)
RECORD_FILES = ("job.json", "summary.json", "data.json", "export.json", "metrics.jsonl", "eval.jsonl",
                "baseline.json", "same_person.json", "tokenizer.json", "encoder.json", "backbone.json",
                "backbone.pdiparams", "text_encoder.json", "text_encoder.pdiparams")


def _records_owner(folder: str, levels: int = 3):
    """The run or export folder (one holding a :data:`RECORD_MARKERS` file) that is ``folder`` or one of its
    ``levels`` parents, or None."""
    import os

    for _ in range(levels + 1):
        if any(os.path.isfile(os.path.join(folder, m)) for m in RECORD_MARKERS):
            return folder
        parent = os.path.dirname(folder)
        if parent == folder:
            return None
        folder = parent
    return None


def require_output_file(path, key, suffix=None):
    """ConfigError (``key``: the option) unless a command's output file can go at ``path``, checked before any work:
    its folder exists, it is not a folder, it ends in ``suffix`` when given (numpy adds ``.npy`` to any other name,
    and the file would not be where the command says), and it is not one of a run's or an export's own files
    (``--json run/job.json`` replaced the run's config with the predictions): a record at its top
    (:data:`RECORD_FILES`) or any file in its sub-folders (checkpoints, heads, logs). Other files beside a run's
    records, such as the user's own earlier output, may be written again."""
    import os

    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise ConfigError(f"'{path}' is a folder; name the file to write", key=key)
    if not os.path.isdir(folder):
        raise ConfigError(f"cannot write '{path}': the folder '{folder}' does not exist", key=key)
    if suffix and not str(path).endswith(suffix):
        raise ConfigError(f"'{path}' does not end in {suffix}", key=key)
    owner = _records_owner(folder) if os.path.exists(path) else None
    if owner and (owner != folder or os.path.basename(path) in RECORD_FILES):
        raise ConfigError(f"'{path}' is a file of the run or export in '{owner}'; write the output elsewhere",
                          key=key)
