"""Errors a user can meet; the CLI turns each into one line and a non-zero exit."""


class Fa4traceError(Exception):
    """Base of every error fa4trace raises on purpose."""


class TraceFormatError(Fa4traceError, ValueError):
    """A buffer or bundle is not what fa4trace wrote (wrong magic, truncated, corrupted...)."""


class DeviceUnavailable(Fa4traceError, RuntimeError):
    """The operation needs a CUDA GPU (or a built kernel) that this machine does not have."""


class MissingDependency(Fa4traceError):
    """An optional package this needs is not installed; the message names it and the pip command."""


class WouldOverwrite(Fa4traceError, FileExistsError):
    """Writing would replace a file (or folder) the user has; the caller decides how to allow it."""


class BadOption(Fa4traceError, ValueError):
    """An option or argument has a value fa4trace cannot take; the message names it, in one line."""
