"""A memory cap for each build, so one candidate's compilation cannot take the machine.

A build worker limits its own data memory (``RLIMIT_DATA``: heap and private mappings, what LLVM
allocates; the worker itself uses ~0.5 GB of it for Python, TVM and Ray). A build that reaches the cap
fails to allocate: TVM then raises (``std::bad_alloc``), or LLVM reports ``out of memory`` and aborts,
which kills the worker. A worker that died is not enough to blame memory, so the builder retries such a
candidate once in a forked child of a fresh worker (:func:`build_isolated`), where the child's death, its
last words on stderr and its memory can be watched; only then does the candidate fail, with a message that
says whether it was the cap (``build exceeded the 9.0 GiB memory cap``) or a compiler crash.

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
import time
from typing import Callable, Optional

import psutil

from .types import BuildResult, ErrorNo

#: The smallest default cap: TVM and Ray alone need about half of it.
MIN_CAP_BYTES = 2 * 2 ** 30
#: Share of a node's memory its builds may use together by default (the rest: runners, Ray, the OS).
DEFAULT_SHARE = 0.75
#: What a failed allocation looks like in TVM's and LLVM's error messages.
_OOM_WORDS = ("bad_alloc", "out of memory", "cannot allocate memory", "memoryerror")
_PR_SET_PDEATHSIG = 1


def default_cap_bytes() -> int:
    """This node's default cap: 3/4 of its memory over its CPUs, at least :data:`MIN_CAP_BYTES`."""
    total = psutil.virtual_memory().total
    return max(MIN_CAP_BYTES, int(total * DEFAULT_SHARE / max(1, os.cpu_count() or 1)))


def gib(n_bytes: int) -> str:
    return f"{n_bytes / 2 ** 30:.1f} GiB"


def apply_cap(cap: int) -> None:
    """Limit this process's data memory to ``cap`` bytes (raising the limit again is allowed: soft limit)."""
    _, hard = resource.getrlimit(resource.RLIMIT_DATA)
    if hard != resource.RLIM_INFINITY:
        cap = min(cap, hard)
    resource.setrlimit(resource.RLIMIT_DATA, (cap, hard))


def is_out_of_memory(text: str) -> bool:
    lowered = text.lower()
    return any(word in lowered for word in _OOM_WORDS)


def cap_message(cap: int, detail: str = "") -> str:
    suffix = f" ({detail.strip().splitlines()[0][:300]})" if detail.strip() else ""
    return (f"build exceeded the {gib(cap)} memory cap{suffix}; raise it with --build-memory-gib "
            f"if this program should build")


def build_isolated(build: Callable[[], BuildResult], cap: int, code_on_crash: ErrorNo) -> BuildResult:
    """Run ``build`` in a forked child under ``cap``; a child that dies becomes a failed result that says why.

    The child never touches Ray (it only compiles and writes its result to a pipe) and is killed with its
    parent, so a build timeout that kills the worker also ends it.
    """
    start = time.time()
    result_r, result_w = os.pipe()
    err_r, err_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: compile, send the result, exit without running any of the parent's cleanup
        status = 1
        try:
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
            os.close(result_r)
            os.close(err_r)
            os.dup2(err_w, 2)  # LLVM's "out of memory" goes to stderr just before it aborts
            apply_cap(cap)
            data = pickle.dumps(build())
            with os.fdopen(result_w, "wb") as out:
                out.write(data)
            status = 0
        finally:
            os._exit(status)
    os.close(result_w)
    os.close(err_w)
    data, stderr, peak = _collect(pid, result_r, err_r)
    _, status = os.waitpid(pid, 0)
    if data and os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0:
        return pickle.loads(data)
    words = stderr.decode(errors="replace")
    if is_out_of_memory(words) or peak >= 0.9 * cap:
        msg = cap_message(cap, words)
    else:
        how = f"signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status) else f"exit status {os.WEXITSTATUS(status)}"
        last_words = f": {words.strip()[-300:]}" if words.strip() else ""
        msg = f"the compiler crashed ({how}); it died in a fresh worker too{last_words}"
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
                os.close(fd)
                open_fds.remove(fd)
        peak = max(peak, _data_bytes(pid))
    return b"".join(chunks[result_fd]), b"".join(chunks[err_fd])[-4000:], peak


def _data_bytes(pid: int) -> int:
    """``VmData`` of a process in bytes (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmData:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def oom_result(cap: Optional[int], err_text: str, start: float, code: ErrorNo) -> Optional[BuildResult]:
    """A failed build whose error says an allocation failed under the cap, as a cap failure; else None."""
    if cap is None or not is_out_of_memory(err_text):
        return None
    return BuildResult(None, int(code), cap_message(cap, err_text), time.time() - start, start)
