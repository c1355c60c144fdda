"""What a user types, checked before any work starts: the parser, typed flag values, environment variables.

Every command's parser is an :class:`ArgumentParser`, whose errors are one line ``error: ...`` and exit
status 2 (argparse's own print a usage block first). Flag values are converted by the types below, which
reject empty, negative, non-finite, out-of-range and mistyped values with a message that names the flag and
gives an example; :func:`check_environment` does the same for the variables we read. A value that passes is
one the command can work with, so bad input never reaches TVM or Ray.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
from dataclasses import dataclass
from typing import NoReturn, Optional

from .errors import AnsorError

#: Exit status of bad input, for every command.
EXIT_BAD_INPUT = 2

#: Largest thread count accepted: TVM starts this many threads at its first kernel.
MAX_THREADS = 1024


class ArgumentParser(argparse.ArgumentParser):
    """argparse with the project's error format: one ``error: ...`` line on stderr, exit status 2."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        line = message.splitlines()[0] if message else "bad arguments"
        value = _VALUE_ERROR.match(line)
        if value:  # a type below rejected a value: name the flag, and show it in the example
            flag = value["flag"].split("/")[-1]
            example = f"(example: {flag} " if flag.startswith("-") else "(example: "
            print(f"error: {flag} {value['why'].replace('(example: ', example)}", file=sys.stderr)
        else:
            print(f"error: {line} (see {self.prog} --help)", file=sys.stderr)
        sys.exit(EXIT_BAD_INPUT)


#: argparse's message for a value a ``type`` refused: "argument FLAG: WHY".
_VALUE_ERROR = re.compile(r"^argument (?P<flag>[^:]+): (?P<why>(must|cannot|\S+ (does not exist|is a directory|exists)).*)$")


# ---------------------------------------------------------------------------------------------- flag types
@dataclass(frozen=True)
class Number:
    """A finite number in ``[low, high]`` (``integer``: an int). Used as an argparse ``type``; the walk test
    of every flag reads ``low``/``high`` to choose values that must fail."""

    low: float
    high: float
    integer: bool = True
    example: str = "1"

    def __call__(self, text: str) -> int | float:
        try:
            value = int(text) if self.integer else float(text)
        except ValueError:
            value = math.nan
        if not math.isfinite(value) or not self.low <= value <= self.high:
            kind = "an integer" if self.integer else "a number"
            raise argparse.ArgumentTypeError(f"must be {kind} from {self._bound(self.low)} to "
                                             f"{self._bound(self.high)}, got {text!r} (example: {self.example})")
        return value

    def _bound(self, x: float) -> str:
        return str(int(x)) if self.integer else f"{x:g}"

    @property
    def __name__(self) -> str:  # argparse names the type in some messages
        return "integer" if self.integer else "number"


def count(high: float, example: str = "1") -> Number:
    """A positive integer up to ``high``."""
    return Number(1, high, True, example)


def positive(high: float, example: str = "1") -> Number:
    """A positive finite number up to ``high`` (zero excluded by a tiny lower bound)."""
    return Number(sys.float_info.min, high, False, example)


#: Trial budgets: 10 million trials is years of tuning; more is a typo.
TRIALS = count(10_000_000, "64")
#: Random seeds feed XGBoost, whose seed is a 32-bit integer.
SEED = Number(0, 2 ** 31 - 1, True, "0")
#: Wall-clock minutes: a year at most.
MINUTES = positive(60 * 24 * 365, "10")
#: States per heavy task the network-level selection re-times (0: off).
SELECT = Number(0, 16, True, "3")
#: Timing repeats of a final measurement.
REPEATS = count(10_000, "10")
#: Candidates per search round.
PER_ROUND = count(4096, "16")
#: Batch sizes.
BATCH = count(65_536, "1")
#: Fresh processes per setting of the thread-pool probe (each imports TVM: ~2 s).
PROBE_PROCESSES = count(100, "3")
#: A build worker's memory cap, in GiB.
MEMORY_GIB = positive(1 << 20, "8")


@dataclass(frozen=True)
class Text:
    """A non-empty string (a path, a name, a target); ``what`` says what it is in the message."""

    what: str
    example: str

    def __call__(self, text: str) -> str:
        if not text.strip():
            raise argparse.ArgumentTypeError(f"must be {self.what}, got an empty string (example: {self.example})")
        if "\x00" in text:
            raise argparse.ArgumentTypeError(f"must be {self.what}, got a string with a NUL byte")
        return text

    @property
    def __name__(self) -> str:
        return self.what


@dataclass(frozen=True)
class ExistingFile(Text):
    """A path to a readable file that exists."""

    def __call__(self, text: str) -> str:
        text = super().__call__(text)
        if os.path.isdir(text):
            raise argparse.ArgumentTypeError(f"{text} is a directory, not {self.what}")
        if not os.path.exists(text):
            raise argparse.ArgumentTypeError(f"{text} does not exist (expected {self.what})")
        if not os.access(text, os.R_OK):
            raise argparse.ArgumentTypeError(f"cannot read {text} (permission denied)")
        return text


@dataclass(frozen=True)
class OutputFile(Text):
    """A path a file can be written to: not a directory, in a directory that exists or can be created."""

    def __call__(self, text: str) -> str:
        text = super().__call__(text)
        if os.path.isdir(text):
            raise argparse.ArgumentTypeError(f"{text} is a directory; give a file path (example: {self.example})")
        _check_parent(text, self.what)
        return text


@dataclass(frozen=True)
class OutputDir(Text):
    """A directory to write into: an existing directory, or a path that can be created."""

    def __call__(self, text: str) -> str:
        text = super().__call__(text)
        if os.path.exists(text) and not os.path.isdir(text):
            raise argparse.ArgumentTypeError(f"{text} exists and is not a directory (expected {self.what})")
        _check_parent(text, self.what)
        return text


def _check_parent(path: str, what: str) -> None:
    """The nearest existing ancestor of ``path`` must be a writable directory."""
    parent = os.path.dirname(os.path.abspath(path))
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise argparse.ArgumentTypeError(f"cannot create {path}: {parent} is not a directory (expected {what})")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"cannot write {path}: {parent} is not writable (expected {what})")


#: The names of :class:`ansor.task.precision.Precision` (a layer above this module's), for ``--precision``.
PRECISIONS = ("fp32", "bf16", "bf16-stored")


def add_precision_arg(parser: argparse.ArgumentParser, *, for_logs: bool = False) -> None:
    """``--precision {fp32,bf16,bf16-stored}``; for a command that reads a network's log, the default is the
    log's."""
    default = ("the log's: bf16 for a <network>-b<batch>-bf16.json log (bf16-stored for -bf16-stored.json), "
               "else fp32" if for_logs else "fp32, bit for bit what it was before bf16 existed")
    parser.add_argument("--precision", choices=PRECISIONS, default=None if for_logs else "fp32",
                        help="what the network computes in: fp32; bf16: convolutions' and dense layers' inputs "
                             "rounded to bf16 (weights at build time), products and sums in fp32, everything "
                             "else fp32, on the CPU's bf16 dot product (cpuinfo flag avx512_bf16); bf16-stored: "
                             "bf16, and every activation those layers read stored in bf16, as OpenVINO stores "
                             "them, so a residual add or batch norm that reads it too reads the rounded value "
                             f"(faster; further from fp32). Default: {default}")


_HOST_PORT = re.compile(r"^(ray://)?(?P<host>\[[0-9a-fA-F:.]+\]|[A-Za-z0-9_.-]+):(?P<port>\d{1,5})$")


def ray_address(text: str, name: str = "--ray-address") -> str:
    """A Ray cluster address: ``auto``, ``HOST:PORT`` or ``ray://HOST:PORT`` with a port in 1..65535."""
    found = _HOST_PORT.match(text.strip())
    if text.strip() != "auto" and (found is None or not 1 <= int(found["port"]) <= 65535):
        raise AnsorError(f"{name} must be HOST:PORT of a Ray cluster's head (port 1..65535), ray://HOST:PORT or "
                         f"'auto', got {text!r} (example: 127.0.0.1:6379)")
    return text.strip()


def ray_address_type(text: str) -> str:
    """:func:`ray_address` as an argparse ``type``."""
    try:
        return ray_address(text)
    except AnsorError as err:
        raise argparse.ArgumentTypeError(str(err).removeprefix("--ray-address "))


ray_address_type.__name__ = "Ray address"


# --------------------------------------------------------------------------------- environment variables
#: The variables the commands read, with what a valid value is; the walk test sets each to bad values.
ENVIRONMENT = {
    "TVM_NUM_THREADS": f"an integer from 1 to {MAX_THREADS}: the threads of TVM's CPU runtime",
    "RAY_ADDRESS": "HOST:PORT of a Ray cluster's head, ray://HOST:PORT or 'auto' (empty: unset)",
    "ANSOR_HOST_LOCK": "a file path in an existing, writable directory: the machine's measurement lock (empty: "
                       "unset)",
}


def check_environment(environ: Optional[dict] = None) -> None:
    """Raise a one-line :class:`AnsorError` naming the first of our variables that holds a bad value."""
    env = os.environ if environ is None else environ
    threads = env.get("TVM_NUM_THREADS")
    if threads is not None:
        try:
            ok = 1 <= int(threads) <= MAX_THREADS
        except ValueError:
            ok = False
        if not ok:
            raise AnsorError(f"the environment variable TVM_NUM_THREADS={threads!r} is not valid: it must be "
                             f"{ENVIRONMENT['TVM_NUM_THREADS']} (unset it to use the target's core count)")
    if env.get("RAY_ADDRESS", "").strip():
        ray_address(env["RAY_ADDRESS"], "the environment variable RAY_ADDRESS")
    lock = env.get("ANSOR_HOST_LOCK", "")
    if lock:
        folder = os.path.dirname(os.path.abspath(lock))
        if os.path.isdir(lock) or not os.path.isdir(folder) or not os.access(folder, os.W_OK | os.X_OK):
            raise AnsorError(f"the environment variable ANSOR_HOST_LOCK={lock!r} is not valid: it must be "
                             f"{ENVIRONMENT['ANSOR_HOST_LOCK']}")
