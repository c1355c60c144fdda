"""One lock per machine, so two tuners on it never time a candidate while the other builds or times.

Each tuner with an embedded Ray believes it owns every core: its run phase reserves the CPUs of *its* Ray
instance, which knows nothing of another instance on the same machine. Without coordination one tuner's
compilers (or timings) run on the cores the other is timing on, and both record inflated, noisy costs.

The lock is ``flock`` on a file shared by every process of the machine: builds hold it shared (tuners may
compile at the same time), the run phase holds it exclusive (nothing else of any tuner runs meanwhile).
``flock`` locks belong to the open file, so a tuner that dies releases its lock with its last descriptor.
A tuner that has to wait says so on the ``ansor`` logger.
"""

from __future__ import annotations

import fcntl
import logging
import os
import time
from contextlib import contextmanager
from typing import Iterator, Optional

logger = logging.getLogger("ansor")

#: Environment variable naming the lock file (every tuner on the machine must use the same one).
LOCK_ENV = "ANSOR_HOST_LOCK"
#: The machine-wide default: /tmp is shared by every user and process, whatever their TMPDIR.
DEFAULT_LOCK_PATH = "/tmp/ansor-measure.lock"


def host_lock_path() -> str:
    """``$ANSOR_HOST_LOCK`` or :data:`DEFAULT_LOCK_PATH`."""
    return os.environ.get(LOCK_ENV) or DEFAULT_LOCK_PATH


class HostLock:
    """Shared (build) and exclusive (time) holds of the machine's measurement lock file.

    A lock file that cannot be opened (another user's, a read-only /tmp) only costs the coordination: a
    warning, and measurement goes on unlocked.
    """

    def __init__(self, path: Optional[str] = None):
        self.path = path or host_lock_path()
        self._fd: Optional[int] = None
        try:
            # Read-only is enough for flock, so a file created by another user still works; never follow a
            # planted symlink in a shared directory.
            self._fd = os.open(self.path, os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
        except OSError as err:
            logger.warning("cannot open the machine's measurement lock %s (%s): timings may overlap another "
                           "tuner's work on this machine", self.path, err.strerror or err)

    @contextmanager
    def shared(self) -> Iterator[None]:
        """Held while this tuner compiles: others may compile too, none may time."""
        with self._hold(fcntl.LOCK_SH, "compile"):
            yield

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        """Held while this tuner times: no other tuner compiles or times meanwhile."""
        with self._hold(fcntl.LOCK_EX, "time candidates"):
            yield

    @contextmanager
    def _hold(self, mode: int, what: str) -> Iterator[None]:
        if self._fd is None:
            yield
            return
        try:
            fcntl.flock(self._fd, mode | fcntl.LOCK_NB)
        except BlockingIOError:
            logger.info("waiting to %s: another tuner on this machine is %s (lock %s)", what,
                        "timing" if mode == fcntl.LOCK_SH else "compiling or timing", self.path)
            t0 = time.monotonic()
            fcntl.flock(self._fd, mode)
            logger.info("waited %.1f s for the machine's measurement lock", time.monotonic() - t0)
        try:
            yield
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
