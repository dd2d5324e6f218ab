"""User-facing errors: one sentence naming the file, the key path and what was expected."""


class MtlError(Exception):
    """Base class of errors meant for users (printed as one line, exit status 2, no traceback).

    ``source`` is the file (or "<inline>") and ``key`` the dotted key path, e.g. ``schedule.batch_size``; the
    message is printed after them (``bare_message`` keeps it without them).
    """

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


class ContractError(MtlError):
    """Two plug-ins disagree on a field (name, shape or dtype)."""


class DataError(MtlError):
    """A data file or record is unreadable or holds a value outside what its task expects."""
