"""The tuning log: one JSON object per line, appended as measurements arrive.

A log is the only durable output of a tuning run, so it must survive crashes (each record is flushed as
soon as it is measured; a torn last line costs one record, never the file) and it must be enough on its
own: before the first record of a workload, the writer stores the workload's PrimFunc, target and hardware
parameters, so a fresh process can rebuild the :class:`~ansor.task.search_task.SearchTask` and replay every
state without the code that registered the workload. A log is also untrusted input: loading never fails
on what a line holds (:mod:`ansor.log.codec` checks every field). The format is described in
``docs/log_format.md``.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import stat
from collections import Counter
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, BinaryIO, Collection, Iterable, Iterator, Optional, Sequence, Union

import tvm
import tvm_ffi

from ..errors import RecordError
from ..host_cpu import MachineFacts
from ..state.loop_state import State
from .measurement import MeasureInput, MeasureResult
from .codec import (
    RECORD_VERSION, CorruptLine, LoadCache, RecordLine, load_prim_func, parse_line,
    parse_record_line, parse_workload_line,
)
from ..task.search_task import SearchTask
from ..target import parse_target, target_to_str
from ..state.transform_steps import Step, steps_to_json
from ..version import writer

logger = logging.getLogger("ansor")

__all__ = ["RECORD_VERSION", "MAX_LINE_BYTES", "MAX_LOG_BYTES", "PathLike", "Record", "RecordWriter",
           "best_records", "distill", "distinct_records", "load_records", "log_targets", "other_targets_message",
           "save_records"]

#: Longest line read (longer ones are skipped with a warning): a workload line of the largest built-in
#: network's task is ~45 KB, a record ~1 KB.
MAX_LINE_BYTES = 16 * 2 ** 20
#: Largest log read (2,048 records take 1.2 MB); a larger file is refused, not read for minutes.
MAX_LOG_BYTES = 4 * 2 ** 30

PathLike = Union[str, "os.PathLike[str]"]


# ---------------------------------------------------------------------------------------------- records
@dataclass
class Record:
    """One measured state of a task, as loaded from a log.

    The state is rebuilt from ``steps`` on first access: replaying every step list while loading would make
    loading a large log slow, and most callers (best-of, resume, distill) only need the steps.
    """

    task: SearchTask
    steps: tuple[Step, ...]
    result: MeasureResult
    machine: Optional[MachineFacts] = None  # where it was measured, as its log says (None: not said)

    @property
    def workload_key(self) -> str:
        return self.task.workload_key

    @cached_property
    def state(self) -> State:
        """The loop state the steps produce (raises :class:`~ansor.errors.StepError` if they do not fit)."""
        return self.task.compute_dag.init_state().with_steps(self.steps)


def distinct_records(records: Iterable[Record]) -> list[Record]:
    """One record per (workload, target, state), in first-seen order: the best valid one, else the first.

    A state measured twice (two tuners on one log, a log concatenated with itself) is one trial: resume
    counts these, not lines.
    """
    kept: dict[tuple[str, str, tuple[Step, ...]], Record] = {}
    for rec in records:
        ident = (rec.workload_key, rec.task.target_str, rec.steps)
        cur = kept.get(ident)
        if cur is None or (rec.result.ok and (not cur.result.ok or rec.result.mean_cost < cur.result.mean_cost)):
            kept[ident] = rec
    return list(kept.values())


def best_records(records: Iterable[Record]) -> dict[str, Record]:
    """For each workload key, the record whose state to run: the valid measurement (``error_no == 0``) with
    the lowest mean cost, unless the network-level selection chose a state after it was measured.

    A selection record (``in_network``, loaded with ``load_records(..., selections=True)``) names the state
    that ran fastest inside the network among the few best measured ones. The latest one stands while the
    fastest measurement is older than it (the selection saw that measurement); a faster state measured
    later was never tried in the network, and the measurements decide again.
    """
    best: dict[str, Record] = {}
    chosen: dict[str, Record] = {}
    for rec in records:
        key = rec.workload_key
        if not rec.result.ok:
            continue
        if rec.result.in_network:
            if key not in chosen or rec.result.timestamp >= chosen[key].result.timestamp:
                chosen[key] = rec
        elif key not in best or rec.result.mean_cost < best[key].result.mean_cost:
            best[key] = rec
    for key, rec in chosen.items():
        if key not in best or best[key].result.timestamp <= rec.result.timestamp:
            best[key] = rec
    return best


def log_targets(path: PathLike, workload_keys: Optional[Collection[str]] = None) -> Counter[str]:
    """How many loadable records each target string has in the log (only records of ``workload_keys``)."""
    only = next(iter(workload_keys)) if workload_keys is not None and len(workload_keys) == 1 else None
    return Counter(r.task.target_str for r in load_records(path, workload_key=only)
                   if workload_keys is None or r.workload_key in workload_keys)


def other_targets_message(path: PathLike, target: Union[str, tvm.target.Target],
                          workload_keys: Optional[Collection[str]] = None) -> Optional[str]:
    """Why a resume for ``target`` found nothing: the other targets the log holds records for (of
    ``workload_keys`` if given), with how to tune for one; ``None`` if it holds none.

    A target string differs as soon as ``mcpu`` or the core count does, so a log tuned on another machine
    (or with ``host`` on a machine with another core count) resumes nothing on this one.
    """
    wanted = target_to_str(parse_target(target))
    counts = log_targets(path, workload_keys)
    counts.pop(wanted, None)
    if not counts:
        return None
    top = counts.most_common(3)
    held = "; ".join(f"{n} for {t}" for t, n in top)
    more = f" (and {len(counts) - len(top)} more targets)" if len(counts) > len(top) else ""
    return (f"{path} holds no record of these tasks for target {wanted}, but {held}{more}; to continue "
            f"those, tune with --target '{top[0][0]}'")


# ---------------------------------------------------------------------------------------------- writing
class RecordWriter:
    """Appends records to a log, one flushed line each, with a loadable workload line before its records.

    While open, the writer holds an exclusive lock on the file (``flock``): a second writer, in this or
    another process, is refused with a :class:`RecordError`, so two tuners never append the same work to
    one log. Readers do not lock.

    Parameters
    ----------
    path
        The log file; created (with its parent folders) if missing, appended to otherwise.
    fsync
        Also ``os.fsync`` after every record, so records survive a power loss, not only a crash of this
        process. Off by default: on most disks it costs far more than the write itself; call :meth:`sync`
        once per round instead.
    machine
        The machine the records of CPU targets are measured on, kept on their workload lines (None: say
        nothing, e.g. when the runners are a cluster's other nodes).
    """

    def __init__(self, path: PathLike, *, fsync: bool = False, machine: Optional[MachineFacts] = None):
        self.path = Path(path)
        self.fsync = fsync
        self.machine = machine
        self._dirty = False
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if self.path.exists():
                _check_regular(self.path, self.path)
            # O_NONBLOCK: opening a FIFO for writing would otherwise wait for a reader forever.
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK, 0o644)
        except OSError as err:
            raise RecordError(f"{self.path}: cannot open log for writing ({err.strerror or err})") from None
        try:
            _check_regular(fd, self.path)
            _lock(fd, self.path)
            self._file_lines, ends_clean = _scan_workload_lines(self.path)
        except BaseException:
            os.close(fd)
            raise
        self._fd: Optional[int] = fd
        # key -> the program and machine that the key's records appended now are read with (its last usable
        # workload line)
        self._programs: dict[str, Optional[tuple[tvm.tirx.PrimFunc, Optional[MachineFacts]]]] = {}
        if not ends_clean:  # a torn last line from a crash: do not glue the next record onto it
            self._append(b"\n")

    def write(self, inputs: Sequence[MeasureInput], results: Sequence[MeasureResult]) -> None:
        """Append one record per (input, result) pair; each is in the OS before the next is written."""
        if len(inputs) != len(results):
            raise RecordError(f"{self.path}: cannot write {len(inputs)} inputs with {len(results)} results")
        for inp, res in zip(inputs, results):
            self.write_record(inp.task, inp.state.steps, res)

    def write_record(self, task: SearchTask, steps: Sequence[Step], result: MeasureResult,
                     machine: Optional[MachineFacts] = None) -> None:
        """Append one record given its step list (no :class:`State` needed, e.g. when copying records);
        ``machine``: where it was measured, if not on the writer's machine (a copied record's)."""
        key = task.workload_key
        facts = (machine or self.machine) if task.target.kind.name == "llvm" else None
        text = _record_line(task, steps, result)
        if not self._has_program(key, task.func, facts):
            text = _workload_line(task, facts) + text
            self._programs[key] = (task.func, facts)
        self._append(text.encode("utf-8"))

    def sync(self) -> None:
        """``fsync`` what was written since the last call: once per round makes a log survive power loss.

        Cheap when nothing was written; the tuning scripts call it at the end of every round.
        """
        if self._fd is None or not self._dirty:
            return
        try:
            os.fsync(self._fd)
        except OSError as err:
            raise RecordError(f"{self.path}: cannot sync log to disk ({err.strerror or err})") from None
        self._dirty = False

    def close(self) -> None:
        """Sync and close the log (which releases the lock); closing twice is harmless."""
        if self._fd is None:
            return
        try:
            self.sync()
        finally:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> "RecordWriter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _has_program(self, key: str, func: tvm.tirx.PrimFunc, machine: Optional[MachineFacts]) -> bool:
        """Whether the file already says that ``key`` is ``func`` measured on ``machine``: its last loadable
        workload line of ``key``.

        Only such a line counts: one of another version, one whose PrimFunc this TVM cannot load, or one of
        another program under the same key would leave the records appended now unreadable or misread.
        """
        if key not in self._programs:
            self._programs[key] = _last_program(self._file_lines.pop(key, []))
        known = self._programs[key]
        if known is None or known[1] != machine:
            return False
        if known[0] is func or tvm_ffi.structural_equal(known[0], func):
            self._programs[key] = (func, machine)  # the next record of this task compares by identity
            return True
        return False

    def _append(self, data: bytes) -> None:
        if self._fd is None:
            raise RecordError(f"{self.path}: write to a closed log")
        view = memoryview(data)
        try:
            while view:  # one write() per record in O_APPEND mode keeps a line whole
                view = view[os.write(self._fd, view):]
            self._dirty = True
            if self.fsync:
                os.fsync(self._fd)
                self._dirty = False
        except OSError as err:
            raise RecordError(f"{self.path}: cannot append to log ({err.strerror or err})") from None


def save_records(path: PathLike, inputs: Sequence[MeasureInput], results: Sequence[MeasureResult]) -> None:
    """Append measured inputs and results to the log at ``path``."""
    with RecordWriter(path) as writer:
        writer.write(inputs, results)


def _record_line(task: SearchTask, steps: Sequence[Step], result: MeasureResult) -> str:
    """A record line (what :func:`~ansor.log.codec.parse_record_line` reads back)."""
    obj: dict[str, Any] = {
        "i": [[task.workload_key, task.target_str, task.hardware_params.to_json()], [[], steps_to_json(steps)]],
        "r": [[float(c) for c in result.costs], int(result.error_no), float(result.all_cost),
              float(result.timestamp)],
        "v": RECORD_VERSION,
    }
    if result.node:
        obj["node"] = result.node
    if not result.checked:
        obj["unchecked"] = 1
    if result.in_network:
        obj["net"] = 1
    return json.dumps(obj) + "\n"


def _workload_line(task: SearchTask, machine: Optional[MachineFacts]) -> str:
    obj = {"workload": task.workload_key, "target": task.target_str, "hw": task.hardware_params.to_json(),
           "prim_func": tvm.ir.save_json(task.func), "desc": task.desc, "writer": writer(), "v": RECORD_VERSION}
    if machine is not None:
        obj["machine"] = machine.to_json()
    return json.dumps(obj) + "\n"


def _scan_workload_lines(path: Path) -> tuple[dict[str, list[bytes]], bool]:
    """The workload lines of each key in ``path``, in file order, and whether it ends with a newline."""
    found: dict[str, list[bytes]] = {}
    with open(path, "rb") as f:
        for _, raw, _ in _lines(f, path, []):
            if raw.startswith(b'{"workload"'):  # the writer always puts this key first
                try:
                    key = parse_workload_line(parse_line(raw)).key
                except CorruptLine:
                    continue
                found.setdefault(key, []).append(raw)
        size = f.seek(0, os.SEEK_END)
        ends_clean = size == 0 or (f.seek(size - 1), f.read(1))[1] == b"\n"
    return found, ends_clean


def _last_program(lines: list[bytes]) -> Optional[tuple[tvm.tirx.PrimFunc, Optional[MachineFacts]]]:
    """The PrimFunc and machine of the last of these workload lines that loads (what the loader reads
    records with)."""
    for raw in reversed(lines):
        try:
            wl = parse_workload_line(parse_line(raw))
            return load_prim_func(wl.key, wl.prim_func), wl.machine
        except CorruptLine:
            continue
    return None


def _check_regular(fd_or_path: Union[int, PathLike], path: PathLike) -> None:
    """Refuse devices, FIFOs, sockets and directories: reading ``/dev/zero`` would never end."""
    mode = os.fstat(fd_or_path).st_mode if isinstance(fd_or_path, int) else os.stat(fd_or_path).st_mode
    if not stat.S_ISREG(mode):
        kind = ("a directory" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode)
                else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "not a regular file")
        raise RecordError(f"{path} is {kind}, not a log file; give a regular file (example: --log-file logs/mm.json)")


def _lock(fd: int, path: Path) -> None:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _lock_holder(fd)
        who = f"another tuner (pid {holder})" if holder else "another tuner"
        raise RecordError(f"{path} is being written by {who}; use another --log-file or wait for it to "
                          "finish") from None
    except OSError as err:
        if err.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL):
            raise RecordError(f"{path}: cannot lock log ({err.strerror or err})") from None
        logger.warning("%s: this file system cannot lock files; make sure no other tuner writes this log", path)


def _lock_holder(fd: int) -> Optional[int]:
    """The pid holding an ``flock`` on ``fd``'s file, from ``/proc/locks`` (Linux), or ``None``."""
    st = os.fstat(fd)
    ident = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    try:
        with open("/proc/locks") as f:
            for line in f:
                parts = line.split()
                if len(parts) > 5 and parts[1] == "FLOCK" and parts[5] == ident and parts[4].isdigit():
                    return int(parts[4])
    except OSError:
        pass
    return None


# ---------------------------------------------------------------------------------------------- loading
@dataclass(frozen=True)
class _Workload:
    """A workload line after its PrimFunc was loaded."""

    key: str
    func: tvm.tirx.PrimFunc
    desc: str
    machine: Optional[MachineFacts]


def load_records(path_or_paths: Union[PathLike, Iterable[PathLike]], *, workload_key: Optional[str] = None,
                 target: Union[str, tvm.target.Target, None] = None, selections: bool = False) -> list[Record]:
    """Read the records of one or several logs, in file order.

    Nothing a line holds makes this fail: each unusable line (not JSON, truncated, too long, wrong shape or
    types, an unknown step, another version, a workload line whose PrimFunc is refused, a record with no
    usable workload line of its key in the same file) is skipped with one warning naming file and line.

    Parameters
    ----------
    path_or_paths
        A log file or a sequence of them.
    workload_key
        Keep only records of this workload.
    target
        Keep only records measured for this target (any form :func:`~ansor.target.parse_target` takes).
    selections
        Also return the network-level selection's records (``"net": 1``), which only
        :func:`best_records` reads; left out by default, since they are not measurements of trials.

    Raises
    ------
    RecordError
        If a file is missing, unreadable, not a regular file, or larger than :data:`MAX_LOG_BYTES`.
    """
    if isinstance(path_or_paths, (str, os.PathLike)):
        paths: list[PathLike] = [path_or_paths]
    else:
        paths = list(path_or_paths)
    want_target = None
    if target is not None:
        want_target = target_to_str(parse_target(target))
    cache = LoadCache()
    records: list[Record] = []
    for path in paths:
        with _open_log(path) as f:
            records.extend(_load_file(f, path, workload_key, want_target, cache))
    return records if selections else [r for r in records if not r.result.in_network]


def _open_log(path: PathLike) -> BinaryIO:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # O_NONBLOCK: opening a FIFO must not wait
    except OSError as err:
        raise RecordError(f"{path}: cannot read log ({err.strerror or err})") from None
    try:
        _check_regular(fd, path)
        size = os.fstat(fd).st_size
        if size > MAX_LOG_BYTES:
            raise RecordError(f"{path} has {size / 2 ** 30:.1f} GiB, more than the {MAX_LOG_BYTES // 2 ** 30} GiB "
                              "a log may have; split it, or keep its best records with distill")
    except BaseException:
        os.close(fd)
        raise
    return os.fdopen(fd, "rb")


def _lines(f: BinaryIO, path: PathLike, skipped: list[tuple[int, str]]) -> Iterator[tuple[int, bytes, bool]]:
    """(line number, bytes, torn) of each non-blank line; a line over :data:`MAX_LINE_BYTES` goes to ``skipped``.

    ``torn``: the last line has no newline, most likely because a crash cut it.
    """
    total = 0
    for lineno in range(1, 2 ** 62):
        raw = f.readline(MAX_LINE_BYTES + 1)
        if not raw:
            return
        total += len(raw)
        if len(raw) > MAX_LINE_BYTES:
            while raw and not raw.endswith(b"\n"):  # skip the rest of the line without holding it
                raw = f.readline(2 ** 20)
                total += len(raw)
            skipped.append((lineno, f"line longer than {MAX_LINE_BYTES} bytes"))
        elif raw.strip():
            yield lineno, raw, not raw.endswith(b"\n")
        if total > MAX_LOG_BYTES:  # the file grew past the limit while being read
            skipped.append((lineno, f"stopped reading: the log passed {MAX_LOG_BYTES} bytes"))
            return


def _load_file(f: BinaryIO, path: PathLike, want_key: Optional[str], want_target: Optional[str],
               cache: LoadCache) -> list[Record]:
    """A record is read with the last usable workload line of its key above it, else the first below it."""
    skipped: list[tuple[int, str]] = []
    current: dict[str, _Workload] = {}
    waiting: dict[str, list[tuple[int, RecordLine]]] = {}  # records above any usable workload line of their key
    records: list[tuple[int, Record]] = []
    writers: set[str] = set()

    def bind(lineno: int, line: RecordLine, wl: _Workload) -> None:
        try:
            steps = cache.steps(line.steps)
            task = cache.task(wl.key, wl.func, wl.desc, line.target, line.hw)
        except CorruptLine as err:
            skipped.append((lineno, str(err)))
            return
        records.append((lineno, Record(task, steps, line.result, wl.machine)))

    for lineno, raw, torn in _lines(f, path, skipped):
        try:
            obj = parse_line(raw, truncated=torn)
            if "workload" in obj:
                wl_line = parse_workload_line(obj)
                if want_key is not None and wl_line.key != want_key:
                    continue
                writers.add(wl_line.writer)
                wl = current[wl_line.key] = _Workload(wl_line.key, cache.func(wl_line, f"{path}:{lineno}"),
                                                      wl_line.desc, wl_line.machine)
                for n, line in waiting.pop(wl.key, []):
                    bind(n, line, wl)
                continue
            line = parse_record_line(obj, want_key, want_target)
        except CorruptLine as err:
            skipped.append((lineno, str(err)))
            continue
        if line is None:
            continue
        wl = current.get(line.key)
        if wl is None:
            waiting.setdefault(line.key, []).append((lineno, line))
        else:
            bind(lineno, line, wl)
    for key, lines in waiting.items():
        skipped.extend((n, f"no usable workload line for {key!r} in this file") for n, _ in lines)
    for lineno, reason in sorted(skipped):
        logger.warning("%s:%d: skipped corrupt record (%s)", path, lineno, reason)
    _note_other_writers(path, writers)
    records.sort(key=lambda item: item[0])
    return [rec for _, rec in records]


#: (log, writer) pairs already reported by :func:`_note_other_writers`: once per process, not per load.
_REPORTED_WRITERS: set[tuple[str, str]] = set()


def _note_other_writers(path: PathLike, writers: set[str]) -> None:
    """One note per log written by another ansor or TVM version; its records load all the same."""
    this = writer()
    for other in sorted(w for w in writers if w and w != this):
        if (str(path), other) not in _REPORTED_WRITERS:
            _REPORTED_WRITERS.add((str(path), other))
            logger.warning("%s was written by %s (this is %s); its records are read as they are", path, other, this)


# ---------------------------------------------------------------------------------------------- distill
def distill(in_paths: Union[PathLike, Iterable[PathLike]], out_path: PathLike, top_k: int = 1) -> int:
    """Write the ``top_k`` best distinct valid states of each workload, target and measuring machine to ``out_path``.

    ``out_path`` is replaced atomically, so it may be one of the inputs. Returns the number of records kept.
    """
    return len(distill_records(load_records(in_paths), out_path, top_k))


def distill_records(records: Iterable[Record], out_path: PathLike, top_k: int = 1) -> list[Record]:
    """:func:`distill` of records already loaded; returns the records written."""
    if top_k < 1:
        raise ValueError(f"top_k must be at least 1, got {top_k}")
    groups: dict[tuple[str, str, Optional[MachineFacts]], list[Record]] = {}
    for rec in records:  # times of two machines do not compare: each machine keeps its own best
        if rec.result.ok:
            groups.setdefault((rec.workload_key, rec.task.target_str, rec.machine), []).append(rec)
    out = Path(out_path)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)
    kept: list[Record] = []
    try:
        with RecordWriter(tmp) as writer:
            for recs in groups.values():
                seen: set[tuple[Step, ...]] = set()
                for rec in sorted(recs, key=lambda r: r.result.mean_cost):
                    if len(seen) == top_k:
                        break
                    if rec.steps not in seen:
                        seen.add(rec.steps)
                        writer.write_record(rec.task, rec.steps, rec.result, rec.machine)
                        kept.append(rec)
        try:
            os.replace(tmp, out)
        except OSError as err:
            raise RecordError(f"{out}: cannot replace log ({err.strerror or err})") from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return kept
