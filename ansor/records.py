"""The tuning log: one JSON object per line, appended as measurements arrive.

A log is the only durable output of a tuning run, so it must survive crashes (each record is flushed as
soon as it is measured; a torn last line costs one record, never the file) and it must be enough on its
own: before the first record of a workload, the writer stores the workload's PrimFunc, target and hardware
parameters, so a fresh process can rebuild the :class:`~ansor.search_task.SearchTask` and replay every
state without the code that registered the workload. The format is described in ``docs/log_format.md``.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence, Union

import tvm
import tvm_ffi

from .errors import RecordError, StepError, TargetError
from .loop_state import State
from .measure.types import ErrorNo, MeasureInput, MeasureResult
from .search_task import SearchTask
from .target import HardwareParams, parse_target, target_to_str
from .transform_steps import Step, step_from_json, steps_to_json

logger = logging.getLogger("ansor")

#: Version tag of every line this module writes; lines with another tag are skipped on load.
RECORD_VERSION = "ansor-0.1"

PathLike = Union[str, "os.PathLike[str]"]
#: What identifies a measured program: the workload key and the step list.
StateIdentity = tuple[str, tuple[Step, ...]]

_WORKLOAD_PREFIX = b'{"workload"'
_MAX_REASON = 200
_ERROR_CODES = frozenset(int(e) for e in ErrorNo)


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

    @property
    def workload_key(self) -> str:
        return self.task.workload_key

    @cached_property
    def state(self) -> State:
        """The loop state the steps produce (raises :class:`~ansor.errors.StepError` if they do not fit)."""
        return self.task.compute_dag.init_state().with_steps(self.steps)


def state_identity(workload_key: str, state: Union[State, Sequence[Step]]) -> StateIdentity:
    """Identity of a state for "already measured?" checks: the same step list is the same program."""
    return workload_key, tuple(getattr(state, "steps", state))


def measured_keys(records: Iterable[Record]) -> set[StateIdentity]:
    """Identities of every state in ``records`` (failed ones too: they would fail again).

    Filter the records by target first (``load_records(..., target=...)``) when a log mixes targets.
    """
    return {state_identity(r.workload_key, r.steps) for r in records}


def best_records(records: Iterable[Record]) -> dict[str, Record]:
    """For each workload key, the valid record (``error_no == 0``) with the lowest mean cost."""
    best: dict[str, Record] = {}
    for rec in records:
        if not rec.result.ok:
            continue
        cur = best.get(rec.workload_key)
        if cur is None or rec.result.mean_cost < cur.result.mean_cost:
            best[rec.workload_key] = rec
    return best


def best_record(path: PathLike, workload_key: str,
                target: Union[str, tvm.target.Target, None] = None) -> Optional[Record]:
    """The best valid record of one workload in a log, or ``None`` if it has none."""
    return best_records(load_records(path, workload_key=workload_key, target=target)).get(workload_key)


# ---------------------------------------------------------------------------------------------- writing
class RecordWriter:
    """Appends records to a log, one flushed line each, with the workload line before a key's first record.

    Parameters
    ----------
    path
        The log file; created (with its parent folders) if missing, appended to otherwise.
    fsync
        Also ``os.fsync`` after every write, so records survive a power loss, not only a crash of this
        process. Off by default: on most disks it costs far more than the write itself.
    """

    def __init__(self, path: PathLike, *, fsync: bool = False):
        self.path = Path(path)
        self.fsync = fsync
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._keys, ends_clean = _scan_workload_keys(self.path)
            self._fd: Optional[int] = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        except OSError as err:
            raise RecordError(f"{self.path}: cannot open log for writing ({err.strerror or err})") from None
        if not ends_clean:  # a torn last line from a crash: do not glue the next record onto it
            self._append(b"\n")

    def write(self, inputs: Sequence[MeasureInput], results: Sequence[MeasureResult]) -> None:
        """Append one record per (input, result) pair; each is on disk before the next is written."""
        if len(inputs) != len(results):
            raise RecordError(f"{self.path}: cannot write {len(inputs)} inputs with {len(results)} results")
        for inp, res in zip(inputs, results):
            self.write_record(inp.task, inp.state.steps, res)

    def write_record(self, task: SearchTask, steps: Sequence[Step], result: MeasureResult) -> None:
        """Append one record given its step list (no :class:`State` needed, e.g. when copying records)."""
        key = task.workload_key
        text = _record_line(task, steps, result)
        if key not in self._keys:
            text = _workload_line(task) + text
        self._append(text.encode("utf-8"))
        self._keys.add(key)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> "RecordWriter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _append(self, data: bytes) -> None:
        if self._fd is None:
            raise RecordError(f"{self.path}: write to a closed log")
        view = memoryview(data)
        try:
            while view:  # one write() per record in O_APPEND mode keeps concurrent writers' lines whole
                view = view[os.write(self._fd, view):]
            if self.fsync:
                os.fsync(self._fd)
        except OSError as err:
            raise RecordError(f"{self.path}: cannot append to log ({err.strerror or err})") from None


def save_records(path: PathLike, inputs: Sequence[MeasureInput], results: Sequence[MeasureResult]) -> None:
    """Append measured inputs and results to the log at ``path``."""
    with RecordWriter(path) as writer:
        writer.write(inputs, results)


def _record_line(task: SearchTask, steps: Sequence[Step], result: MeasureResult) -> str:
    obj: dict[str, Any] = {
        "i": [[task.workload_key, task.target_str, task.hardware_params.to_json()], [[], steps_to_json(steps)]],
        "r": [[float(c) for c in result.costs], int(result.error_no), float(result.all_cost),
              float(result.timestamp)],
        "v": RECORD_VERSION,
    }
    if result.node:
        obj["node"] = result.node
    return json.dumps(obj) + "\n"


def _workload_line(task: SearchTask) -> str:
    obj = {"workload": task.workload_key, "target": task.target_str, "hw": task.hardware_params.to_json(),
           "prim_func": tvm.ir.save_json(task.func), "desc": task.desc, "v": RECORD_VERSION}
    return json.dumps(obj) + "\n"


def _scan_workload_keys(path: Path) -> tuple[set[str], bool]:
    """Workload keys already in ``path`` and whether it ends with a newline (an absent file does)."""
    keys: set[str] = set()
    last = b"\n"
    if not path.exists():
        return keys, True
    with open(path, "rb") as f:
        for line in f:
            last = line
            if line.startswith(_WORKLOAD_PREFIX):
                try:
                    obj = json.loads(line)
                except ValueError:
                    continue
                if isinstance(obj, dict) and isinstance(obj.get("workload"), str):
                    keys.add(obj["workload"])
    return keys, last.endswith(b"\n")


# ---------------------------------------------------------------------------------------------- loading
class _Corrupt(Exception):
    """A line that cannot become a record; the message is the reason shown in the warning."""


@dataclass(frozen=True)
class _Workload:
    """A workload line after its PrimFunc was loaded."""

    key: str
    func: tvm.tirx.PrimFunc
    desc: str


class _LoadCache:
    """What one load call parses once: PrimFunc texts, target strings, steps; one task per program+target.

    Structurally equal programs under the same key share one PrimFunc object (and so one task) across
    files; a key whose program differs from one loaded earlier keeps its own, with a warning.
    """

    def __init__(self) -> None:
        self._func_by_text: dict[str, tvm.tirx.PrimFunc] = {}
        self._funcs_by_key: dict[str, list[tvm.tirx.PrimFunc]] = {}
        self._targets: dict[str, tvm.target.Target] = {}
        self._tasks: dict[tuple[str, int, str, tuple[int, ...]], SearchTask] = {}
        self._steps: dict[tuple, Step] = {}

    def steps(self, data: list) -> tuple[Step, ...]:
        """Parse a step list; records of one search share most steps, so each distinct one is parsed once."""
        out = []
        for item in data:
            try:  # lists become tuples so a step's JSON can key the memo (deeper nesting is never valid)
                memo_key = tuple(tuple(v) if type(v) is list else v for v in item)
                step = self._steps.get(memo_key)
            except TypeError:
                memo_key, step = None, None
            if step is None:
                try:
                    step = step_from_json(item)
                except StepError as err:
                    raise _Corrupt(_first_line(err)) from None
                if memo_key is not None:
                    self._steps[memo_key] = step
            out.append(step)
        return tuple(out)

    def func(self, key: str, text: str, where: str) -> tvm.tirx.PrimFunc:
        func = self._func_by_text.get(text)
        if func is not None:
            return func
        try:
            func = tvm.ir.load_json(text)
        except Exception as err:  # TVM raises several types for malformed JSON graphs
            raise _Corrupt(f"workload {key!r}: cannot load prim_func ({_first_line(err)})") from None
        if not isinstance(func, tvm.tirx.PrimFunc):
            raise _Corrupt(f"workload {key!r}: prim_func holds a {type(func).__name__}, not a PrimFunc")
        known = self._funcs_by_key.setdefault(key, [])
        same = next((f for f in known if tvm_ffi.structural_equal(f, func)), None)
        if same is None:
            if known:
                logger.warning("%s: workload %r is a different program from one loaded earlier under the "
                               "same key; its records keep their own program", where, key)
            known.append(func)
            same = func
        self._func_by_text[text] = same
        return same

    def task(self, wl: _Workload, target: str, hw: tuple[int, ...]) -> SearchTask:
        ident = (wl.key, id(wl.func), target, hw)
        task = self._tasks.get(ident)
        if task is None:
            tgt = self._targets.get(target)
            if tgt is None:
                try:
                    tgt = self._targets[target] = parse_target(target)
                except TargetError as err:
                    raise _Corrupt(str(err)) from None
            try:
                params = HardwareParams.from_json(list(hw))
            except TypeError:
                raise _Corrupt(f"hardware parameters {list(hw)} do not match HardwareParams") from None
            task = self._tasks[ident] = SearchTask(wl.func, tgt, workload_key=wl.key, hardware=params,
                                                   desc=wl.desc)
        return task


def load_records(path_or_paths: Union[PathLike, Iterable[PathLike]], *, workload_key: Optional[str] = None,
                 target: Union[str, tvm.target.Target, None] = None) -> list[Record]:
    """Read the records of one or several logs, in file order.

    Corrupt lines (not JSON, truncated, wrong shape, unknown step, another version, or a workload whose
    workload line is missing from the same file) are skipped with one warning each, naming file and line.

    Parameters
    ----------
    path_or_paths
        A log file or a sequence of them.
    workload_key
        Keep only records of this workload.
    target
        Keep only records measured for this target (any form :func:`~ansor.target.parse_target` takes).

    Raises
    ------
    RecordError
        If a file is missing or unreadable.
    """
    if isinstance(path_or_paths, (str, os.PathLike)):
        paths: list[PathLike] = [path_or_paths]
    else:
        paths = list(path_or_paths)
    want_target = None
    if target is not None:
        want_target = target_to_str(parse_target(target))
    cache = _LoadCache()
    records: list[Record] = []
    for path in paths:
        records.extend(_load_file(path, workload_key, want_target, cache))
    return records


def _load_file(path: PathLike, want_key: Optional[str], want_target: Optional[str],
               cache: _LoadCache) -> list[Record]:
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as err:
        raise RecordError(f"{path}: cannot read log ({err.strerror or err})") from None
    lines = data.split(b"\n")
    # Text after the last newline is a line whose newline never came: most likely torn by a crash.
    torn = len(lines) if lines[-1].strip() else 0
    if not torn:
        lines.pop()
    workloads: dict[str, _Workload] = {}
    pending: list[tuple[int, dict]] = []
    skipped: list[tuple[int, str]] = []
    for lineno, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        try:
            obj = _parse_json(raw, truncated=lineno == torn)
            if "workload" in obj:
                wl = _parse_workload(obj, want_key, cache, f"{path}:{lineno}")
                if wl is not None and wl.key not in workloads:
                    workloads[wl.key] = wl
            else:
                pending.append((lineno, obj))
        except _Corrupt as err:
            skipped.append((lineno, str(err)))
    # Records are resolved after the whole file was read, so the order of workload lines does not matter.
    records = []
    for lineno, obj in pending:
        try:
            rec = _parse_record(obj, want_key, want_target, workloads, cache)
        except _Corrupt as err:
            skipped.append((lineno, str(err)))
            continue
        if rec is not None:
            records.append(rec)
    for lineno, reason in sorted(skipped):
        logger.warning("%s:%d: skipped corrupt record (%s)", path, lineno, reason)
    return records


def _parse_json(raw: bytes, truncated: bool) -> dict:
    try:
        obj = json.loads(raw)
    except ValueError as err:  # JSONDecodeError and UnicodeDecodeError
        raise _Corrupt("truncated line" if truncated else f"not JSON: {_first_line(err)}") from None
    if not isinstance(obj, dict):
        raise _Corrupt(f"a JSON {type(obj).__name__}, not an object")
    if obj.get("v") != RECORD_VERSION:
        raise _Corrupt(f"version {obj.get('v')!r}, expected {RECORD_VERSION!r}")
    return obj


def _parse_workload(obj: dict, want_key: Optional[str], cache: _LoadCache, where: str) -> Optional[_Workload]:
    key, text, desc = obj.get("workload"), obj.get("prim_func"), obj.get("desc", "")
    if not isinstance(key, str) or not isinstance(text, str) or not isinstance(desc, str):
        raise _Corrupt("workload line needs string fields workload, prim_func and desc")
    if want_key is not None and key != want_key:
        return None
    return _Workload(key, cache.func(key, text, where), desc)


def _parse_record(obj: dict, want_key: Optional[str], want_target: Optional[str],
                  workloads: dict[str, _Workload], cache: _LoadCache) -> Optional[Record]:
    try:
        (key, target, hw), (_, steps_json) = obj["i"]
        costs, error_no, all_cost, timestamp = obj["r"]
    except (KeyError, TypeError, ValueError):
        raise _Corrupt('wrong shape: expected "i": [[key, target, hw], [[], steps]] and '
                       '"r": [costs, error_no, all_cost, timestamp]') from None
    _check(isinstance(key, str) and isinstance(target, str), "workload key and target must be strings")
    if (want_key is not None and key != want_key) or (want_target is not None and target != want_target):
        return None
    _check(isinstance(hw, list) and all(type(v) is int for v in hw), "hardware parameters must be integers")
    _check(isinstance(steps_json, list), "steps must be a list")
    _check(isinstance(costs, list) and all(_is_number(c) for c in costs), "costs must be numbers")
    _check(type(error_no) is int and _is_number(all_cost) and _is_number(timestamp),
           "error_no must be an integer, all_cost and timestamp numbers")
    _check(error_no in _ERROR_CODES, f"error_no {error_no} is not an Ansor error code")
    node = obj.get("node", "")
    _check(isinstance(node, str), "node must be a string")
    wl = workloads.get(key)
    if wl is None:
        raise _Corrupt(f"no usable workload line for {key!r} in this file")
    steps = cache.steps(steps_json)
    result = MeasureResult(tuple(float(c) for c in costs), ErrorNo(error_no), "", float(all_cost), float(timestamp), node)
    return Record(cache.task(wl, target, tuple(hw)), steps, result)


def _check(ok: bool, reason: str) -> None:
    if not ok:
        raise _Corrupt(f"wrong shape: {reason}")


def _is_number(value: Any) -> bool:
    return type(value) in (int, float)


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    line = text[0] if text else type(err).__name__
    return line if len(line) <= _MAX_REASON else line[:_MAX_REASON] + "..."


# ---------------------------------------------------------------------------------------------- distill
def distill(in_paths: Union[PathLike, Iterable[PathLike]], out_path: PathLike, top_k: int = 1) -> int:
    """Write the ``top_k`` best distinct valid states of each workload and target to ``out_path``.

    ``out_path`` is replaced atomically, so it may be one of the inputs. Returns the number of records kept.
    """
    if top_k < 1:
        raise ValueError(f"top_k must be at least 1, got {top_k}")
    groups: dict[tuple[str, str], list[Record]] = {}
    for rec in load_records(in_paths):
        if rec.result.ok:
            groups.setdefault((rec.workload_key, rec.task.target_str), []).append(rec)
    out = Path(out_path)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)
    kept = 0
    try:
        with RecordWriter(tmp) as writer:
            for recs in groups.values():
                seen: set[tuple[Step, ...]] = set()
                for rec in sorted(recs, key=lambda r: r.result.mean_cost):
                    if len(seen) == top_k:
                        break
                    if rec.steps not in seen:
                        seen.add(rec.steps)
                        writer.write_record(rec.task, rec.steps, rec.result)
                        kept += 1
        try:
            os.replace(tmp, out)
        except OSError as err:
            raise RecordError(f"{out}: cannot replace log ({err.strerror or err})") from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return kept
