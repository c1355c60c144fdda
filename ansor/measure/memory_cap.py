"""A memory cap for each build, so one candidate's compilation cannot take the machine.

While it builds, a build worker limits its own data memory (``RLIMIT_DATA``: heap and private mappings,
what LLVM allocates; the worker itself uses ~0.5 GB of it for Python, TVM and Ray). A build that reaches the cap
fails to allocate: TVM then raises (``std::bad_alloc``), or LLVM reports ``out of memory`` and aborts,
which kills the worker. A worker that died is not enough to blame memory, so the builder retries such a
candidate once in a separate process started by a worker (:class:`IsolatedBuild`), where the process's
death, its last words on stderr and its memory can be watched; only then does the candidate fail, with a
message that says whether it was the cap (``build exceeded the 9.0 GiB memory cap``) or a compiler crash.

Default cap: three quarters of the node's memory divided by its CPU count (one build per CPU), at least
:data:`MIN_CAP_BYTES`; ``ProgramMeasurer(build_memory_gib=...)`` or the scripts' ``--build-memory-gib``
choose another.
"""

from __future__ import annotations

import ctypes
import os
import pickle
import resource
import select
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from typing import TYPE_CHECKING, Iterator, Optional, Sequence

import psutil

from ..errors import short_message
from ..log.measurement import BuildResult, ErrorNo

if TYPE_CHECKING:
    from ..task.search_task import SearchTask
    from ..state.transform_steps import Step

#: The smallest default cap: TVM and Ray alone need about half of it.
MIN_CAP_BYTES = 2 * 2 ** 30
#: Share of a node's memory its builds may use together by default (the rest: runners, Ray, the OS).
DEFAULT_SHARE = 0.75
#: What a failed allocation looks like in TVM's and LLVM's error messages.
_OOM_WORDS = ("bad_alloc", "out of memory", "cannot allocate memory", "memoryerror")
_PR_SET_PDEATHSIG = 1
_LIBC = ctypes.CDLL(None, use_errno=True)
#: What an isolated build's process writes once it has imported TVM, before its pickled result.
CHILD_READY = b"R"
#: The module an isolated build's process runs (:mod:`ansor.measure.build_child`).
CHILD_MODULE = "ansor.measure.build_child"


def default_cap_bytes() -> int:
    """This node's default cap: 3/4 of its memory over its CPUs, at least :data:`MIN_CAP_BYTES`."""
    total = psutil.virtual_memory().total
    return max(MIN_CAP_BYTES, int(total * DEFAULT_SHARE / max(1, os.cpu_count() or 1)))


def gib(n_bytes: int) -> str:
    return f"{n_bytes / 2 ** 30:.1f} GiB"


def apply_cap(cap: int) -> None:
    """Limit this process's data memory to ``cap`` bytes (soft limits: raising them again is allowed).

    ``RLIMIT_DATA`` alone makes an allocator at the cap crawl: glibc reserves a new arena (address space,
    not data), fails to make it writable, releases it, and does so again for each small allocation, for
    minutes. So the address space is limited too, to what it is now plus the data still allowed: the
    reservation itself then fails and the allocation fails at once.
    """
    me = os.getpid()
    room = max(0, cap - _status_bytes(me, "VmData"))
    for limit, value in ((resource.RLIMIT_DATA, cap), (resource.RLIMIT_AS, _status_bytes(me, "VmSize") + room)):
        _, hard = resource.getrlimit(limit)
        resource.setrlimit(limit, (value if hard == resource.RLIM_INFINITY else min(value, hard), hard))


@contextmanager
def capped(cap: int) -> Iterator[None]:
    """Hold this process to ``cap`` bytes of data memory within the block only; crash signals kill it.

    A build that reached the cap leaves its memory with the allocator, not the OS; if the limit stayed,
    the Ray worker's own threads could no longer allocate the reply. And a crash at the cap (LLVM's
    ``out of memory`` abort) ran Ray's crash handler, which needs memory to symbolize the stack and spun
    instead (seen in testing as a 60 s build timeout): within the block those signals take their default
    action, so the worker dies at once and the builder's isolated retry says why.
    """
    limits = {limit: resource.getrlimit(limit) for limit in (resource.RLIMIT_DATA, resource.RLIMIT_AS)}
    saved = {sig: _sigaction(sig, _SIG_DFL) for sig in _CRASH_SIGNALS}
    apply_cap(cap)
    try:
        yield
    finally:
        for limit, values in limits.items():
            resource.setrlimit(limit, values)
        for sig, old in saved.items():
            _sigaction(sig, old)


_CRASH_SIGNALS = (signal.SIGABRT, signal.SIGSEGV, signal.SIGBUS, signal.SIGILL, signal.SIGFPE)
#: ``struct sigaction`` with SIG_DFL as its handler and nothing else set. 256 bytes: larger than glibc's
#: struct on any 64-bit Linux, which is all that is read or written.
_SIG_DFL = ctypes.create_string_buffer(256)


def _sigaction(sig: int, new: ctypes.Array) -> ctypes.Array:
    """Install the raw ``struct sigaction`` ``new`` for ``sig``; return the previous one, raw.

    Through libc rather than :mod:`signal`: the handlers to save and restore are C handlers (Ray's), which
    Python's ``signal.getsignal`` cannot hand back.
    """
    old = ctypes.create_string_buffer(256)
    if _LIBC.sigaction(sig, new, old) != 0:
        raise OSError(ctypes.get_errno(), f"sigaction({sig}) failed")
    return old


def die_with_parent(sig: int) -> None:
    """Have the kernel send this process ``sig`` when the process that started it exits."""
    _LIBC.prctl(_PR_SET_PDEATHSIG, sig)


def is_out_of_memory(text: str) -> bool:
    lowered = text.lower()
    return any(word in lowered for word in _OOM_WORDS)


def cap_message(cap: int, detail: str = "") -> str:
    suffix = f" ({short_message(detail)})" if detail.strip() else ""
    return (f"build exceeded the {gib(cap)} memory cap{suffix}; raise it with --build-memory-gib "
            f"if this program should build")


class IsolatedBuild:
    """A build in a fresh Python process under ``cap``; a process that dies becomes a result saying why.

    A fresh interpreter (``python -m ansor.measure.build_child``), not a fork of the worker: a forked Ray
    worker inherits Ray's threads' locks and its crash handlers, which hung or took the worker down with the
    child in testing. Creating one returns once the process has imported TVM (seconds), so the build
    timeout can start after that. The process never touches Ray and is killed with its parent, so a build
    timeout that kills the worker also ends it.
    """

    def __init__(self, task: SearchTask, steps: Optional[Sequence[Step]], cap: int):
        self.cap = cap
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        self._proc = subprocess.Popen([sys.executable, "-m", CHILD_MODULE], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        try:
            self._proc.stdin.write(pickle.dumps((task, None if steps is None else tuple(steps), cap)))
            self._proc.stdin.close()
        except BrokenPipeError:  # it died before reading: reported by result() from its exit status
            pass
        os.read(self._proc.stdout.fileno(), len(CHILD_READY))  # TVM imported (or, if empty, the process died)

    def result(self, code_on_crash: ErrorNo) -> BuildResult:
        """Wait for the build; its result, or why the process died (the cap, or a crash)."""
        start = time.time()
        data, stderr, peak = _collect(self._proc.pid, self._proc.stdout.fileno(), self._proc.stderr.fileno())
        status = self._proc.wait()
        if data and status == 0:
            return pickle.loads(data)
        words = stderr.decode(errors="replace")
        if is_out_of_memory(words) or peak >= 0.9 * self.cap:
            msg = cap_message(self.cap, words)
        else:
            how = f"signal {-status}" if status < 0 else f"exit status {status}"
            last_words = f": {words.strip()[-300:]}" if words.strip() else ""
            msg = f"the compiler crashed ({how}); it died outside the worker too{last_words}"
        return BuildResult(None, int(code_on_crash), msg, time.time() - start, start)


def _collect(pid: int, result_fd: int, err_fd: int) -> tuple[bytes, bytes, int]:
    """Read the child's result and stderr until both close; sample its data memory meanwhile."""
    chunks: dict[int, list[bytes]] = {result_fd: [], err_fd: []}
    open_fds = [result_fd, err_fd]
    peak = 0
    while open_fds:
        ready, _, _ = select.select(open_fds, [], [], 0.05)
        for fd in ready:
            block = os.read(fd, 1 << 16)
            if block:
                chunks[fd].append(block)
            else:
                open_fds.remove(fd)
        peak = max(peak, _status_bytes(pid, "VmData"))
    return b"".join(chunks[result_fd]), b"".join(chunks[err_fd])[-4000:], peak


def _status_bytes(pid: int, field: str) -> int:
    """A ``kB`` field of ``/proc/<pid>/status`` (``VmData``, ``VmSize``) in bytes; 0 once the process is gone."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def oom_result(cap: Optional[int], err_text: str, start: float, code: ErrorNo) -> Optional[BuildResult]:
    """A failed build whose error says an allocation failed under the cap, as a cap failure; else None."""
    if cap is None or not is_out_of_memory(err_text):
        return None
    return BuildResult(None, int(code), cap_message(cap, err_text), time.time() - start, start)
