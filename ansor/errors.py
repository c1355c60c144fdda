"""One exception hierarchy for the whole package.

Every error we raise on purpose derives from :class:`AnsorError`, so scripts can turn any of them into a
one-line message and exit code 2, while real bugs still surface as ordinary tracebacks. The two helpers
at the end keep every message one line long, whatever TVM or a log file put into it.
"""

import reprlib
from typing import Optional


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


# ------------------------------------------------------------------------------------------------ messages
#: Longest message line a helper below returns: a TVM error can print a whole program.
MAX_MESSAGE_CHARS = 300

_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxlist, _REPR.maxstring, _REPR.maxother = 3, 8, 60, 60


def short_message(error: BaseException | str, limit: Optional[int] = MAX_MESSAGE_CHARS, *,
                  pick: str = "first", typed: bool = False) -> str:
    """What went wrong, in at most ``limit`` characters (``None``: no limit); the one shortening helper.

    ``pick`` says which text: ``"first"``, the line after TVM's ``Error message:`` when there is one (its
    schedule errors print the IR first and the reason last), else the first non-blank line; ``"last"``, the
    last non-blank line (what TVM's passes and Relax raise ends with the reason); ``"joined"``, every line
    joined into one (a script's ``error:`` line); ``"all"``, the whole text, lines and all (a build's error
    in a log record). ``typed`` puts the exception's type in front. An error without text is named by its
    type.
    """
    text = str(error).strip()
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if pick == "all":
        line = text
    elif pick == "joined":
        line = " ".join(lines)
    elif pick == "last":
        line = lines[-1] if lines else ""
    else:
        line = next((ln[len("Error message:"):].strip() for ln in lines if ln.startswith("Error message:")),
                    lines[0] if lines else "")
    if typed and isinstance(error, BaseException):
        line = f"{type(error).__name__}: {line}"
    elif not line:
        line = type(error).__name__ if isinstance(error, BaseException) else "unknown error"
    return line if limit is None or len(line) <= limit else line[:limit] + " ..."


def short_repr(value: object) -> str:
    """A bounded ``repr`` for messages about data read from files, which may be huge or deeply nested."""
    return _REPR.repr(value)
