"""The schedule database shipped with the package, and the first programs it gives a task.

``ansor/data/<kind>.schedules.json`` is an ordinary tuning log (read as data by
:func:`~ansor.log.records.load_records`): the best few records of each workload of the model-zoo logs on
each ISA they were tuned on (``scripts/train_pretrained.py``). A task starts by measuring up to
:data:`SEEDS_PER_TASK` of them, as Transfer-Tuning (PACT'22) reuses the schedules of tuned models:

- its own workload's records, those tuned on the nearest hardware first (:func:`hardware_distance`: the
  same vector width, then the same CPU, then the same core count);
- else records of the same operator at other sizes (same stages, same loop kinds: :func:`signature`),
  those whose operands are constants where the task's are (:func:`constant_reads`) first, then nearest in
  FLOPs, with every split re-fitted to the new loop extents (:func:`refit`);
- else those of the same operator with other element-wise stages between its last reduction and its
  output (:func:`core_signature`): a linear layer whose epilogue also scales and adds a residual takes the
  steps of one that only adds a bias, its extra stages inlined;
- else, for a task whose output is its reduction, those of the same operator with an epilogue: the
  epilogue's place is taken by a cache-write stage, as the sketch of an epilogue-free reduction tiles it
  (DenseNet-121's transition convolutions from its fused ones, :class:`Kinship`).

A seed is an ordinary candidate: it costs a trial, is measured like any other, and wins only if it is
the fastest; a seed whose steps do not fit the task is skipped.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import logging
import math
import re
from dataclasses import replace
from functools import lru_cache
from pathlib import Path
from typing import NamedTuple, Optional, Sequence

from ..errors import AnsorError, RecordError, StepError
from ..state.loop_state import State
from ..state.transform_steps import Step
from ..state.transform_steps.layout import LayoutRewriteStep
from ..state.access import IterKind
from ..state.transform_steps.split import SplitStep, divisors, padded_extents
from ..state.transform_steps.placement import ComputeInlineStep
from ..state.transform_steps.stages import CacheReadStep
from ..host_cpu import MachineFacts, host_machine
from ..target import physical_cores, shipped_file
from ..task.search_task import SearchTask
from .records import Record, load_records

logger = logging.getLogger("ansor")

#: The suffix of the shipped schedule database after the device kind's name.
SCHEDULES_SUFFIX = "schedules.json"
#: The index of a schedule database is a JSON file beside it: ``<log name>`` + this.
INDEX_SUFFIX = ".index"
#: Seeds measured per task: a first round's worth would crowd out the search; three covered the best
#: record of the zoo's other ISA and two near neighbours at other sizes.
SEEDS_PER_TASK = 3

_NUMBERING = re.compile(r"^lv\d+_|\d+$")


def signature(task: SearchTask) -> str:
    """The computation of ``task`` without its sizes: each stage's name (numbering dropped), the kinds of
    its block variables and how many buffers it reads. Two tasks with one signature take the same steps."""
    parts = []
    for stage in task.compute_dag.stages:
        kinds = "".join(v.kind.value for v in stage.block.vars)
        parts.append(f"{_NUMBERING.sub('', stage.name)}:{kinds}:{len(stage.block.reads)}")
    return "|".join(parts)


def constant_reads(task: SearchTask) -> str:
    """Which reads of each stage up to the last reduction are constants the build packs for free (network
    weights, ``layout_free_buffers``), a ``1`` or ``0`` per read. A record that packs a weight tiles for a
    layout that costs nothing at inference; on an activation (an attention product's operands) the same
    packing runs at every call. ViT-B/16's attention products, seeded from Winograd products of the nearest
    FLOPs (constant weights), started at 0.65 and 0.35 ms; from attention products of other sizes at 0.40
    and 0.22 ms (AMD EPYC Zen 5, 2 threads)."""
    dag = task.compute_dag
    stages = dag.stages
    last = max((k for k, stage in enumerate(stages) if stage.is_reduction), default=len(stages) - 1)
    return "|".join("".join("1" if buffer in dag.layout_free else "0" for buffer in stage.block.read_buffers())
                    for stage in stages[:last + 1])


def core_signature(sig: str) -> str:
    """``sig`` without the stages between its last reduction stage and its output stage, which are spatial
    (an element-wise epilogue the sketch inlines): ConvNeXt's ``matmul, add, multiply, add`` (bias, layer
    scale, residual) and Swin-T's ``matmul, add`` (bias) have one core signature."""
    parts = sig.split("|")
    last = _last_reduction(parts)
    return "|".join(parts[:last + 1] + parts[-1:]) if last >= 0 else sig


def _last_reduction(parts: Sequence[str]) -> int:
    """The index of the last stage with a reduction loop among a signature's parts (-1: none)."""
    return max((k for k, p in enumerate(parts[:-1]) if _reduces(p)), default=-1)


def _reduces(part: str) -> bool:
    """True when the stage of a signature's part has a reduction loop."""
    return "R" in part.rsplit(":", 2)[1]


class Kinship(enum.IntEnum):
    """How the steps recorded on one task carry over to another, closest first."""

    SAME = 0  # the same signature: the steps apply as recorded (splits re-fitted)
    EPILOGUE = 1  # the same core signature: the task's epilogue stages are inlined, the record's dropped
    CACHE_WRITE = 2  # the task ends at the record's last reduction: a cache write stands for its epilogue

    @staticmethod
    def of(recorded: str, own: str) -> Optional["Kinship"]:
        """The kinship of the signatures ``recorded`` and ``own`` (None: the steps do not carry over)."""
        if recorded == own:
            return Kinship.SAME
        if core_signature(recorded) == core_signature(own):
            return Kinship.EPILOGUE
        src, dst = recorded.split("|"), own.split("|")
        if _reduces(dst[-1]) and src[:_last_reduction(src) + 1] == dst:
            return Kinship.CACHE_WRITE
        return None


class _StageMap:
    """Stage ids of the task a record was tuned on -> stage ids of a task of the same core signature, kept
    up to date as steps add stages (a cache, an rfactor). The source's epilogue stages map to none (its
    steps on them must be inlines, which are dropped); ``extra`` are the task's, inlined before replay."""

    def __init__(self, source: str, stages: int):
        src = source.split("|")
        last = _last_reduction(src)
        self.ids: list[Optional[int]] = [*range(last + 1), *([None] * (len(src) - last - 2)), stages - 1]
        self.extra = list(range(last + 1, stages - 1))

    def dropped(self, stage_id: int) -> bool:
        """True for the recorded task's epilogue stages, which this task has not."""
        return 0 <= stage_id < len(self.ids) and self.ids[stage_id] is None

    def __getitem__(self, stage_id: int) -> int:
        mapped = self.ids[stage_id] if 0 <= stage_id < len(self.ids) else None
        if mapped is None:
            raise StepError(f"stage {stage_id} of the recorded task has no counterpart in this one")
        return mapped

    def added(self, step: Step) -> None:
        """``step`` (already applied to both) added a stage at its ``stage_id + NEW_STAGE``."""
        offset = type(step).NEW_STAGE
        if offset is None:
            return
        at = self[step.stage_id] + offset
        self.ids = [i + 1 if i is not None and i >= at else i for i in self.ids]
        self.ids.insert(step.stage_id + offset, at)


def refit(task: SearchTask, steps: Sequence[Step], source: Optional[SearchTask] = None) -> State:
    """``steps`` applied to ``task``, each split's lengths re-fitted to the loop it now splits: from the
    innermost part out, the divisor of what is left of the extent nearest the recorded length. A spatial
    split other than its stage's last (vectorized) one may instead be fitted to one of the extent's
    :func:`~ansor.state.transform_steps.split.padded_extents`, where that comes nearer the recorded
    lengths: ViT-B/16's 197 rows (a prime) take BERT's 128-row tiles as tiles of 200 rows, not one row.
    The last one's innermost part, the vector, is fitted to whole vectors of ``task``'s target where the
    extent has them: a record of 72 channels (MobileNet-V3) or of AVX2 vectors kept 8 lanes of AVX-512's 16.

    ``source`` is the task the steps were recorded on. A step that names an argument (a layout rewrite, a
    cache read) then names the one ``task``'s stage reads at the same place: models name their arguments
    differently (BERT's attention product reads ``B`` where ViT's reads ``permute_dims``). When ``source``
    has another element-wise epilogue (the same :func:`core_signature`), ``task``'s epilogue stages are
    inlined first and the steps are moved to the stages they correspond to; when ``task`` ends at
    ``source``'s last reduction, a cache write of it first adds the stage that takes the epilogue's steps.

    Raises :class:`~ansor.errors.StepError` when a step does not fit ``task``.
    """
    state, spatial = _refit(task, steps, source, frozenset(), frozenset())
    last = {stage_id: k for k, stage_id in spatial}
    if not last:
        return state
    paddable = frozenset(k for k, stage_id in spatial if last[stage_id] != k)
    return _refit(task, steps, source, paddable, frozenset(last.values()))[0]


def _refit(task: SearchTask, steps: Sequence[Step], source: Optional[SearchTask], paddable: frozenset[int],
           vectors: frozenset[int]) -> tuple[State, list[tuple[int, int]]]:
    """The re-fitted state, with the ``(step index, stage id)`` of every split of a spatial loop; the
    splits at indices in ``paddable`` may be fitted to a padded extent, those in ``vectors`` keep whole
    vectors."""
    state = task.compute_dag.init_state()
    origin = source.compute_dag.init_state() if source is not None else None
    stages = None
    recorded, own = (signature(source), signature(task)) if source is not None else ("", "")
    kinship = Kinship.of(recorded, own)
    if kinship == Kinship.EPILOGUE:
        stages = _StageMap(recorded, len(state.stages))
        for stage_id in stages.extra:
            state.compute_inline(stage_id)
    elif kinship == Kinship.CACHE_WRITE:
        state.cache_write(len(state.stages) - 1, "local")
        stages = _StageMap(recorded, len(state.stages))
    at: list[Optional[int]] = []  # where each recorded step is in ``state.steps`` (None: dropped)
    spatial = []
    for k, step in enumerate(steps):
        if stages is not None:
            if stages.dropped(step.stage_id) and isinstance(step, ComputeInlineStep):
                origin.apply(step)
                at.append(None)
                continue
            moved = _moved(step, stages, at)
        else:
            moved = step
        fitted = moved
        if isinstance(step, SplitStep) and None not in step.lengths:
            it = state.checked_iter(moved.stage_id, step.iter_id)
            if it.kind == IterKind.SPATIAL:
                spatial.append((k, step.stage_id))
            if it.extent is not None and it.extent != step.extent:
                vector_bytes = task.hardware_params.vector_unit_bytes
                lanes = state.vector_lanes(moved.stage_id, vector_bytes) if k in vectors else 1
                fitted = replace(moved, extent=it.extent, lengths=_fit_lengths(it.extent, step, k in paddable, lanes))
        elif origin is not None and isinstance(step, (LayoutRewriteStep, CacheReadStep)):
            fitted = replace(moved, buffer=_same_read(origin, state, step.stage_id, moved.stage_id, step.buffer))
        if origin is not None:
            origin.apply(step)
        at.append(len(state.steps))
        state.apply(fitted)
        if stages is not None:
            stages.added(step)
    return state, spatial


def _moved(step: Step, stages: _StageMap, at: Sequence[Optional[int]]) -> Step:
    """``step`` with its stage ids mapped by ``stages`` and its step ids by ``at``."""
    fields = {f.name for f in dataclasses.fields(step)}
    changes: dict = {"stage_id": stages[step.stage_id]}
    if "target_stage_id" in fields:
        changes["target_stage_id"] = stages[step.target_stage_id]
    if "reader_stage_ids" in fields:
        changes["reader_stage_ids"] = tuple(stages[r] for r in step.reader_stage_ids)
    for name in ("src_step_id", "src_step_ids"):
        if name in fields:
            ids = getattr(step, name)
            moved = [at[i] if 0 <= i < len(at) else None for i in (ids if isinstance(ids, tuple) else (ids,))]
            if None in moved:
                raise StepError(f"{type(step).__name__} follows a step that has no counterpart in this task")
            changes[name] = tuple(moved) if isinstance(ids, tuple) else moved[0]
    return replace(step, **changes)


def _same_read(origin: State, state: State, origin_stage: int, stage_id: int, buffer: str) -> str:
    """The buffer stage ``stage_id`` of ``state`` reads where stage ``origin_stage`` of ``origin`` reads
    ``buffer``."""
    recorded = origin.checked_stage(origin_stage).block.read_buffers()
    reads = state.checked_stage(stage_id).block.read_buffers()
    if buffer in recorded and recorded.index(buffer) < len(reads):
        return reads[recorded.index(buffer)]
    return buffer


def _fit_lengths(extent: int, step: SplitStep, paddable: bool, lanes: int = 1) -> tuple[int, ...]:
    """``step``'s lengths fitted to ``extent`` or, if ``paddable``, to whichever of its padded extents
    they fit with the least distance (the sum of the parts' log ratios, the outer part's included). With
    ``lanes`` dividing ``extent``, the innermost length is first rounded to whole vectors of ``lanes``."""
    recorded = (-(-step.extent // math.prod(step.lengths)), *step.lengths)
    wanted = list(step.lengths)
    if wanted and extent % lanes == 0 and wanted[-1] % lanes:
        wanted[-1] = lanes * max(1, round(wanted[-1] / lanes))
    best, best_distance = (), math.inf
    for padded in (extent, *(padded_extents(extent) if paddable else ())):
        left, fitted = padded, []
        for length in reversed(wanted):
            d = min(divisors(left), key=lambda d: (abs(math.log(d / length)), d))
            fitted.append(d)
            left //= d
        lengths = tuple(reversed(fitted))
        parts = (-(-extent // math.prod(lengths)), *lengths)
        distance = sum(abs(math.log(a / b)) for a, b in zip(parts, recorded))
        if distance < best_distance:
            best, best_distance = lengths, distance
    return best


class IndexEntry(NamedTuple):
    """What a database's index holds of one workload."""

    signature: str
    flops: float
    constants: str  # constant_reads


class ScheduleDatabase:
    """A shipped log and its index: each workload's :func:`signature`, FLOPs and :func:`constant_reads`, so
    that a task reads the records of the few workloads it may take steps from, not the whole log (every
    workload line holds a PrimFunc: reading all of them costs a second)."""

    def __init__(self, path: Path, index: dict[str, IndexEntry]):
        self.path = path
        self.index = index
        self._records: dict[str, list[Record]] = {}

    @staticmethod
    def read(path: Path) -> "ScheduleDatabase":
        """The database of the log ``path`` with its index ``<path>.index``; raises
        :class:`~ansor.errors.RecordError` when the index is missing or malformed."""
        index_path = path.with_name(path.name + INDEX_SUFFIX)
        try:
            data = json.loads(index_path.read_text())
            index = {str(k): IndexEntry(str(sig), float(flops), str(constants))
                     for k, (sig, flops, constants) in data["workloads"].items()}
        except OSError as err:
            raise RecordError(f"{index_path}: cannot read ({err.strerror or err})") from None
        except (ValueError, KeyError, TypeError, AttributeError):
            raise RecordError(f"{index_path}: not a schedule database index") from None
        return ScheduleDatabase(path, index)

    @staticmethod
    def write_index(records: Sequence[Record], path: Path) -> None:
        """Write the index of the log ``path`` holding ``records``."""
        workloads = {}
        for rec in records:
            if rec.workload_key not in workloads:
                workloads[rec.workload_key] = [signature(rec.task), rec.task.compute_dag.flop_ct,
                                               constant_reads(rec.task)]
        path.with_name(path.name + INDEX_SUFFIX).write_text(json.dumps({"workloads": workloads}, indent=1))

    def records(self, key: str) -> list[Record]:
        """The valid records of workload ``key``, fastest first."""
        if key not in self._records:
            recs = [r for r in load_records(self.path, workload_key=key) if r.result.ok]
            self._records[key] = sorted(recs, key=lambda r: r.result.mean_cost)
        return self._records[key]

    def seeds(self, task: SearchTask, limit: int = SEEDS_PER_TASK) -> list[State]:
        """Up to ``limit`` states for ``task``: its workload's records, else refitted neighbours'."""
        here = host_machine(physical_cores())
        if task.workload_key in self.index:
            own = self.records(task.workload_key)
            candidates = sorted(own, key=lambda r: hardware_distance(task, r, here))
        else:
            sig, flops, constants = signature(task), max(task.compute_dag.flop_ct, 1.0), constant_reads(task)
            kin = {k: kinship for k, e in self.index.items() if (kinship := Kinship.of(e.signature, sig)) is not None}
            closest = min(kin.values(), default=None)
            same = [k for k, kinship in kin.items() if kinship == closest]
            keys = sorted(same, key=lambda k: (self.index[k].constants != constants,
                                               abs(math.log(max(self.index[k].flops, 1.0) / flops))))
            candidates = [best_of(recs, task, here) for recs in map(self.records, keys[:limit]) if recs]
        states: list[State] = []
        seen: set = set()
        for rec in candidates:
            try:
                state = refit(task, rec.steps, rec.task)
            except StepError:
                continue
            if state.key() not in seen:
                seen.add(state.key())
                states.append(state)
            if len(states) == limit:
                break
        return states


def hardware_distance(task: SearchTask, record: Record, here: MachineFacts) -> tuple[bool, bool, bool, bool]:
    """How far the hardware ``record`` was tuned for is from ``task``'s, for sorting records nearest first
    (a stable sort keeps them fastest first within each step): another vector width changes the code, another
    CPU its caches and latencies, another core count the parallel split; last, a record measured on another
    machine than ``here`` (the same target's code run on another CPU: Zen 5 ran the AVX2 training logs).
    A record of another machine stays a seed, only a later one."""
    mine, theirs = task.hardware_params, record.task.hardware_params
    return (theirs.vector_unit_bytes != mine.vector_unit_bytes,
            record.task.target.attrs.get("mcpu", "") != task.target.attrs.get("mcpu", ""),
            theirs.num_cores != mine.num_cores,
            record.machine != here)


def best_of(records: Sequence[Record], task: SearchTask, here: MachineFacts) -> Record:
    """The fastest of ``records`` (sorted fastest first) tuned on the hardware nearest ``task``'s."""
    return min(records, key=lambda r: hardware_distance(task, r, here))


def seed_states(task: SearchTask, limit: int = SEEDS_PER_TASK) -> list[State]:
    """The shipped database's first programs for ``task`` (none when nothing is shipped for its kind)."""
    path = shipped_file(task.target, SCHEDULES_SUFFIX)
    if path is None:
        return []
    database = _shipped(path)
    return database.seeds(task, limit) if database is not None else []


@lru_cache(maxsize=None)
def _shipped(path: Path) -> Optional[ScheduleDatabase]:
    """The shipped database, read once per process; ``None`` (with a warning) when it cannot be read."""
    try:
        return ScheduleDatabase.read(path)
    except AnsorError as err:
        logger.warning("shipped schedule database not used: %s", err)
        return None
