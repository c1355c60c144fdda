"""One line of a tuning log, turned into checked data while trusting nothing in it.

A log may come from another version, another machine, a crash, or someone hostile, so every field is
checked for type and range before anything uses it, and the workload's PrimFunc only reaches TVM after
:mod:`ansor.log.tvm_json` checked its node graph. Anything that does not pass raises :class:`CorruptLine`,
whose message is the reason the loader prints; nothing here raises anything else for any line content.
The rules are listed in ``docs/log_format.md``.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import reprlib
from dataclasses import dataclass, fields
from typing import Any, Optional

import tvm
import tvm_ffi

from ..errors import StepError, short_message, short_repr
from ..host_cpu import MachineFacts
from .measurement import ErrorNo, MeasureResult
from ..task.search_task import SearchTask, prim_func_key
from ..target import HardwareParams, parse_target
from ..state.transform_steps import Step, step_from_json
from .tvm_json import GraphError, load_checked

logger = logging.getLogger("ansor")

#: Version tag of every line the writer writes; lines with another tag are skipped on load.
RECORD_VERSION = "ansor-0.1"

#: Limits on what one line may hold: far above anything a tuner writes, low enough to bound memory and time.
MAX_KEY_CHARS = 1024
MAX_TARGET_CHARS = 4096
MAX_STEPS = 10_000
MAX_COSTS = 10_000
_MAX_NODE_CHARS = 256
_MAX_HW_VALUE = 2 ** 31 - 1
_HW_FIELDS = len(fields(HardwareParams))
_ERROR_CODES = frozenset(int(e) for e in ErrorNo)
_MAX_REASON = 200
_BAD_KEY = f"the workload key must be a string of 1 to {MAX_KEY_CHARS} characters"
_BAD_TARGET = f"the target must be a string of 1 to {MAX_TARGET_CHARS} characters"
_BAD_HW = (f"hardware parameters must be 2 to {_HW_FIELDS} integers in [0, {_MAX_HW_VALUE}], the first two "
           "(cores, vector bytes) at least 1")
_BAD_STEPS = f"steps must be a list of at most {MAX_STEPS}"
_BAD_ERROR_NO = f"error_no {{}} is not an Ansor error code (0 to {max(_ERROR_CODES)})"
_BAD_COSTS = f"costs must be a list of 1 to {MAX_COSTS} finite numbers >= 0, got {{}}"
_ZERO_COST = "a valid record (error_no 0) needs costs > 0, got {}"
_BAD_TIMES = "all_cost and timestamp must be finite numbers >= 0"
_BAD_NODE = f"node must be a string of at most {_MAX_NODE_CHARS} characters"
_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxlist, _REPR.maxstring, _REPR.maxother = 2, 6, 40, 40


class CorruptLine(Exception):
    """A line that cannot be used; the message is the reason shown in the warning."""


@dataclass(frozen=True)
class WorkloadLine:
    """A workload line whose fields have the right types (its PrimFunc is not loaded yet)."""

    key: str
    prim_func: str
    desc: str
    writer: str = ""  # "ansor X, tvm Y" of the run that wrote it; "" in logs older than the field
    machine: Optional[MachineFacts] = None  # where its records were measured; None: not said, or unreadable


@dataclass(frozen=True)
class RecordLine:
    """A record line whose fields all passed the checks (its steps are still JSON)."""

    key: str
    target: str
    hw: tuple[int, ...]
    steps: list
    result: MeasureResult


def parse_line(raw: bytes, truncated: bool = False) -> dict:
    """The JSON object of a line of this format version; ``truncated``: the line had no newline."""
    try:
        obj = json.loads(raw)
    except RecursionError:  # the C decoder counts nesting against the recursion limit and stops there
        raise CorruptLine("nested too deeply") from None
    except ValueError as err:  # JSONDecodeError, UnicodeDecodeError, an integer of over 4300 digits
        raise CorruptLine("truncated line" if truncated else f"not JSON: {short_message(err, _MAX_REASON)}") from None
    if not isinstance(obj, dict):
        raise CorruptLine(f"a JSON {type(obj).__name__}, not an object")
    version = obj.get("v")
    if version != RECORD_VERSION:
        raise CorruptLine(f"version {short_repr(version)}, expected {RECORD_VERSION!r}")
    return obj


def parse_workload_line(obj: dict) -> WorkloadLine:
    key, text, desc, writer = obj.get("workload"), obj.get("prim_func"), obj.get("desc", ""), obj.get("writer", "")
    if not all(isinstance(v, str) for v in (key, text, desc, writer)):
        raise CorruptLine("workload line needs string fields workload, prim_func, desc (and writer, if present)")
    _check(0 < len(key) <= MAX_KEY_CHARS and len(desc) <= MAX_KEY_CHARS and len(writer) <= MAX_KEY_CHARS,
           f"workload key, desc and writer must have 1 to {MAX_KEY_CHARS} characters")
    machine = MachineFacts.from_json(obj["machine"]) if "machine" in obj else None
    return WorkloadLine(key, text, desc, writer, machine)


def load_prim_func(key: str, text: str) -> tvm.tirx.PrimFunc:
    """The PrimFunc of workload ``key``'s line, its node graph checked before TVM sees it."""
    try:
        return _load_prim_func_cached(text) if len(text) <= _MAX_CACHED_CHARS else _load_prim_func(text)
    except CorruptLine as err:
        raise CorruptLine(f"workload {short_repr(key)}: cannot load prim_func ({err})") from None


def _load_prim_func(text: str) -> tvm.tirx.PrimFunc:
    try:
        graph = json.loads(text)
    except RecursionError:
        raise CorruptLine("nested too deeply") from None
    except ValueError as err:
        raise CorruptLine(f"not JSON: {short_message(err, _MAX_REASON)}") from None
    try:
        func = load_checked(graph)
    except GraphError as err:
        raise CorruptLine(f"unsafe graph: {err}") from None
    except Exception as err:  # TVM raises several types for graphs it cannot decode
        raise CorruptLine(f"TVM: {short_message(err, _MAX_REASON)}") from None
    if not isinstance(func, tvm.tirx.PrimFunc):
        raise CorruptLine(f"it holds a {type(func).__name__}, not a PrimFunc")
    return func


#: Loaded PrimFuncs are cached across load calls: a tuning script reads its log several times (resume,
#: progress table, evaluation), and each of a network log's dozens of workload lines takes ~10 ms to load.
#: Texts up to 1 MB (real ones are under 50 KB), so the cache stays small whatever a log holds.
_load_prim_func_cached = functools.lru_cache(maxsize=128)(_load_prim_func)
_MAX_CACHED_CHARS = 2 ** 20


def parse_record_line(obj: dict, want_key: Optional[str] = None,
                      want_target: Optional[str] = None) -> Optional[RecordLine]:
    """Check every field of a record line, or ``None`` if it is not of ``want_key`` and ``want_target``.

    The step list is checked by :meth:`LoadCache.steps`.
    """
    try:
        (key, target, hw), (_, steps) = obj["i"]
        costs, error_no, all_cost, timestamp = obj["r"]
    except (KeyError, TypeError, ValueError):
        raise CorruptLine('wrong shape: expected "i": [[key, target, hw], [[], steps]] and '
                          '"r": [costs, error_no, all_cost, timestamp]') from None
    _check(isinstance(key, str) and 0 < len(key) <= MAX_KEY_CHARS, _BAD_KEY)
    _check(isinstance(target, str) and 0 < len(target) <= MAX_TARGET_CHARS, _BAD_TARGET)
    if (want_key is not None and key != want_key) or (want_target is not None and target != want_target):
        return None
    _check(isinstance(hw, list) and 2 <= len(hw) <= _HW_FIELDS
           and all(type(v) is int and 0 <= v <= _MAX_HW_VALUE for v in hw) and hw[0] >= 1 and hw[1] >= 1, _BAD_HW)
    _check(isinstance(steps, list) and len(steps) <= MAX_STEPS, _BAD_STEPS)
    _check(type(error_no) is int and error_no in _ERROR_CODES, _BAD_ERROR_NO, error_no)
    _check(isinstance(costs, list) and 0 < len(costs) <= MAX_COSTS and all(_finite(c) and c >= 0 for c in costs),
           _BAD_COSTS, costs)
    if error_no == ErrorNo.NO_ERROR:
        _check(all(c > 0 for c in costs), _ZERO_COST, costs)
    _check(_finite(all_cost) and all_cost >= 0 and _finite(timestamp) and timestamp >= 0, _BAD_TIMES)
    node = obj.get("node", "")
    _check(isinstance(node, str) and len(node) <= _MAX_NODE_CHARS, _BAD_NODE)
    unchecked = obj.get("unchecked", 0)
    _check(type(unchecked) is int and unchecked in (0, 1), "unchecked must be 0 or 1")
    net = obj.get("net", 0)
    _check(type(net) is int and net in (0, 1) and not (net and error_no), "net must be 0 or 1, and 0 for a failure")
    result = MeasureResult(tuple(float(c) for c in costs), ErrorNo(error_no), "", float(all_cost),
                           float(timestamp), node, checked=not unchecked, in_network=bool(net))
    return RecordLine(key, target, tuple(hw), steps, result)


class LoadCache:
    """What one load call parses once: PrimFunc texts, target strings, steps; one task per program+target.

    Structurally equal programs under the same key share one PrimFunc object (and so one task) across
    files; a key whose program differs from one loaded earlier keeps its own, with a warning.
    """

    def __init__(self) -> None:
        self._func_by_text: dict[str, tvm.tirx.PrimFunc] = {}
        self._funcs_by_key: dict[str, list[tvm.tirx.PrimFunc]] = {}
        self._targets: dict[str, tvm.target.Target] = {}
        self._tasks: dict[tuple[str, int, str, tuple[int, ...]], SearchTask] = {}
        self._steps: dict[str, Step] = {}

    def steps(self, data: list) -> tuple[Step, ...]:
        """Parse a step list; records of one search share most steps, so each distinct one is parsed once.

        The memo key is the step's ``repr``, which tells ``1`` from ``1.0`` and ``true``, so a value the
        strict parser would refuse never reuses the step of an accepted one (and it is faster to build
        than a tuple).
        """
        out = []
        for item in data:
            try:
                memo_key: Optional[str] = repr(item)
            except RecursionError:  # nested too deeply to print; the parser refuses it below
                memo_key = None
            step = self._steps.get(memo_key) if memo_key is not None else None
            if step is None:
                try:
                    step = step_from_json(item)
                except StepError as err:
                    raise CorruptLine(short_message(err, _MAX_REASON)) from None
                if memo_key is not None:
                    self._steps[memo_key] = step
            out.append(step)
        return tuple(out)

    def func(self, wl: WorkloadLine, where: str) -> tvm.tirx.PrimFunc:
        func = self._func_by_text.get(wl.prim_func)
        if func is not None:
            return func
        func = load_prim_func(wl.key, wl.prim_func)
        if wl.key.startswith("prim_func-") and prim_func_key(func) != wl.key:
            # The key of an unnamed program is its structural hash: a program damaged into another one that
            # still loads (a flipped digit) is caught here, before anything schedules it.
            raise CorruptLine(f"workload {short_repr(wl.key)}: its prim_func is not the program its key names "
                              f"(hash {prim_func_key(func)})")
        known = self._funcs_by_key.setdefault(wl.key, [])
        same = next((f for f in known if tvm_ffi.structural_equal(f, func)), None)
        if same is None:
            if known:
                logger.warning("%s: workload %r is a different program from one loaded earlier under the "
                               "same key; its records keep their own program", where, wl.key)
            known.append(func)
            same = func
        self._func_by_text[wl.prim_func] = same
        return same

    def task(self, key: str, func: tvm.tirx.PrimFunc, desc: str, target: str, hw: tuple[int, ...]) -> SearchTask:
        ident = (key, id(func), target, hw)
        task = self._tasks.get(ident)
        if task is None:
            tgt = self._targets.get(target)
            if tgt is None:
                try:
                    tgt = self._targets[target] = parse_target(target)
                except Exception as err:  # TargetError, and whatever TVM raises for a config it refuses
                    raise CorruptLine(f"target {short_repr(target)}: {short_message(err, _MAX_REASON)}") from None
            task = self._tasks[ident] = SearchTask(func, tgt, workload_key=key,
                                                   hardware=HardwareParams.from_json(list(hw)), desc=desc)
        return task


def _check(ok: bool, reason: str, *values: Any) -> None:
    """Raise unless ``ok``; ``reason`` is formatted with ``values`` only then (loading stays fast)."""
    if not ok:
        raise CorruptLine("wrong shape: " + reason.format(*map(short_repr, values)))


def _finite(value: Any) -> bool:
    """A JSON number that converts to a finite float (an integer of 400 digits does not)."""
    if type(value) is float:
        return math.isfinite(value)
    return type(value) is int and -1e300 < value < 1e300

