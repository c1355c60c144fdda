"""One exception hierarchy for the whole package.

Every error we raise on purpose derives from :class:`AnsorError`, so scripts can turn any of them into a
one-line message and exit code 2, while real bugs still surface as ordinary tracebacks.
"""


class AnsorError(Exception):
    """Base class of every error the package raises deliberately."""


class WorkloadError(AnsorError):
    """An unknown or malformed workload name."""


class StepError(AnsorError):
    """A transform step that does not fit the state it is applied to (missing stage, bad iterator, ...)."""


class RecordError(AnsorError):
    """A log file that cannot be read or written."""


class TargetError(AnsorError):
    """A target description that cannot be parsed."""
