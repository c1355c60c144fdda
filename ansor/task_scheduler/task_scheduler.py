"""Spend a network's trial budget where end-to-end latency gains most (Ansor's gradient task scheduler).

The objective is the weighted sum of task latencies (weight = how often a subgraph occurs). After one
warm-up round per task (its ``first`` programs alone when it has any, else a searched round), each round
tunes the task whose estimated gradient of the objective with respect to its trials is most negative:

    grad_i = w_i * (alpha * backward_i + (1 - alpha) * forward_i)

``backward_i`` is the latency change over the task's last ``backward_window`` rounds; ``forward_i`` is an
optimistic guess of the next round's change: the lower of "latency falls like 1/rounds" and "the latency
at 1/``beta`` of the throughput of the best similar task" (same op tag). A task whose best latency has not
improved for ``early_stopping`` trials stops receiving rounds.

Unlike Ansor, the gradient of a task that stopped improving halves with every ``stall_half_life`` trials
since its last gain. The 1/rounds guess never learns that a task has plateaued: in a 10-minute BERT-base
run the QKV dense task got 586 trials after its last gain (the FFN up-projection 536) while the attention
products, the layer norm and the softmax got 32-64 trials each, though each gains 19-46 % more at 192.

Where the shipped database seeded most tasks, each task it had no seeds for (``first`` holds its default
schedule alone) gets one searched round after its warm-up, before the gradient decides: the seeds stand
in for the searched first round Ansor gives every task, and the gradient can promise a task no more than
its whole latency, which for a small one never wins. In 2-minute ViT-B/16 runs three seedless transposes
kept default schedules 2-4x slower than one searched round finds (0.9 ms of 89). Only while the seedless
tasks are at most :data:`MAX_UNSEEDED_SHARE` of the network: a searched round for every task took
DenseNet-121's whole 10-minute run (docs/networks.md), and the database seeds 70 of its 142 tasks.

:class:`Allocator` is the pure decision logic (tested on synthetic latency curves);
:func:`schedule_tasks` makes it the schedule of the tuning loop (:func:`ansor.tuning.run_rounds`) with real
policies, one shared cost model and a measurer.
"""

from __future__ import annotations

import logging
import random
import time
from dataclasses import dataclass, field
from typing import Callable, Mapping, Optional, Sequence

from ..state.loop_state import State
from ..log.measurement import MAX_COST
from ..log.records import Record
from ..task.search_task import SearchTask
from ..sketch.policy import SearchParams, SketchPolicy
from ..tuning import Round, feed_history, run_rounds

logger = logging.getLogger("ansor")

STALL_HALF_LIFE = 128  # trials; see the module docstring
#: Seedless tasks get a searched round after their warm-up only while they are at most this share of the
#: tasks: their rounds then cost at most half of a searched round for every task (module docstring).
MAX_UNSEEDED_SHARE = 1 / 3


@dataclass
class TaskState:
    """What the allocator knows about one task."""

    weight: float
    flop_ct: float
    tag: str = ""
    rounds: int = 0
    trials: int = 0
    best_cost: float = MAX_COST
    history: list[float] = field(default_factory=list)  # best cost after each round
    trials_at_best: int = 0
    dead: bool = False
    unseeded: bool = False  # gets a searched round right after its warm-up (see the module docstring)

    @property
    def stalled_trials(self) -> int:
        """Trials measured since the task's best latency last fell."""
        return self.trials - self.trials_at_best


class Allocator:
    """Chooses the next task to tune. ``strategy``: "gradient" (Ansor's) or "round-robin".

    ``stall_half_life``: trials without gain that halve a task's gradient; None keeps Ansor's rule. A run
    resumed from a log starts every task's count afresh (the log's order of gains is not replayed).
    """

    def __init__(self, tasks: Sequence[TaskState], strategy: str = "gradient", alpha: float = 0.2,
                 beta: float = 2.0, backward_window: int = 3, early_stopping: Optional[int] = None,
                 seed: int = 0, stall_half_life: Optional[int] = STALL_HALF_LIFE):
        if strategy not in ("gradient", "round-robin"):
            raise ValueError(f"unknown strategy {strategy!r}; valid: gradient, round-robin")
        self.tasks = list(tasks)
        self.strategy = strategy
        self.alpha, self.beta, self.window = alpha, beta, backward_window
        self.early_stopping = early_stopping
        self.stall_half_life = stall_half_life
        self.rng = random.Random(seed)
        self._next_rr = 0

    def objective(self) -> float:
        return sum(t.weight * t.best_cost for t in self.tasks)

    def record(self, index: int, trials: int, best_cost: float) -> None:
        """A round of ``trials`` measurements of task ``index`` ended with ``best_cost`` (its best so far)."""
        t = self.tasks[index]
        t.rounds += 1
        t.trials += trials
        if best_cost < t.best_cost:
            t.best_cost = best_cost
            t.trials_at_best = t.trials
        t.history.append(t.best_cost)
        if self.early_stopping is not None and t.stalled_trials >= self.early_stopping:
            t.dead = True
            logger.info("task %d stops: no gain in its last %d trials", index, self.early_stopping)

    def gradients(self) -> list[Optional[float]]:
        """d(objective)/d(rounds of task i), estimated; None for dead tasks."""
        out: list[Optional[float]] = []
        for t in self.tasks:
            if t.dead:
                out.append(None)
                continue
            if t.rounds == 0:
                out.append(float("-inf"))
                continue
            backward = 0.0
            if t.rounds > self.window:
                backward = (t.history[-1] - t.history[-1 - self.window]) / self.window
            g_next = t.best_cost - t.best_cost / t.rounds
            similar = [s for s in self.tasks if s.tag and s.tag == t.tag and s.best_cost < MAX_COST]
            if t.tag and len(similar) > 1:
                best_flops = max(s.flop_ct / s.best_cost for s in similar)
                g_next = min(g_next, self.beta * t.flop_ct / best_flops)
            forward = g_next - t.best_cost
            grad = t.weight * (self.alpha * backward + (1 - self.alpha) * forward)
            if self.stall_half_life:
                grad *= 0.5 ** (t.stalled_trials / self.stall_half_life)
            out.append(grad)
        return out

    def next_task(self) -> Optional[int]:
        """The task to tune next, or None when every task has stopped."""
        alive = [i for i, t in enumerate(self.tasks) if not t.dead]
        if not alive:
            return None
        unvisited = [i for i in alive if self.tasks[i].rounds == 0]
        if unvisited:
            return unvisited[0]
        unsearched = [i for i in alive if self.tasks[i].unseeded and self.tasks[i].rounds == 1]
        if unsearched:
            return unsearched[0]
        if self.strategy == "round-robin":
            for _ in range(len(self.tasks)):
                i = self._next_rr % len(self.tasks)
                self._next_rr += 1
                if not self.tasks[i].dead:
                    return i
        grads = self.gradients()
        live = [(g, i) for i, g in enumerate(grads) if g is not None]
        if max(g for g, _ in live) == min(g for g, _ in live):
            return self.rng.choice([i for _, i in live])
        return min(live)[1]


@dataclass
class SchedulerRound:
    """One round, for progress tables: which task, how it stands, and the estimated total latency."""

    task_index: int
    trials_total: int
    best_costs: list[float]
    objective: float
    seconds: float
    search_s: float = 0.0  # of ``seconds``: proposing the round's programs (the model retrains here, when asked)
    train_s: float = 0.0  # of ``seconds``: handing the results to the policy and the model


def unseeded_tasks(first_sizes: Sequence[int]) -> list[bool]:
    """Which tasks get a searched round right after their warm-up, by the number of programs each one's
    warm-up measures (its default schedule, then its seeds): those with one program, where others have
    seeds and such tasks are at most :data:`MAX_UNSEEDED_SHARE` of them (see the module docstring)."""
    unseeded = [n == 1 for n in first_sizes]
    searched = any(n > 1 for n in first_sizes) and sum(unseeded) <= MAX_UNSEEDED_SHARE * len(first_sizes)
    return [searched and u for u in unseeded]


def schedule_tasks(tasks: Sequence[SearchTask], weights: Sequence[float], n_trials: int, measurer, model,
                   per_round: int = 16, strategy: str = "gradient", early_stopping: Optional[int] = None,
                   seed: int = 0, search: Optional[SearchParams] = None,
                   on_round: Optional[Callable[[SchedulerRound], None]] = None,
                   first: Optional[Sequence[Sequence[State]]] = None, time_limit: Optional[float] = None,
                   history: Optional[Mapping[str, Sequence[Record]]] = None,
                   tuned_elsewhere: Optional[Mapping[str, Sequence[Record]]] = None) -> Allocator:
    """Tune several tasks with one budget, one cost model and one measurer; returns the final allocator.

    ``first[i]``: states of task ``i`` measured in its first round, which holds nothing else. A network
    passes each task's default schedule, so a tuned task is never slower than its untuned build, then the
    database's seeds.
    ``time_limit``: seconds after which no new round starts (the trial budget may end it first).
    ``history`` (records by workload key, e.g. the run's own log) continues this run: it counts towards
    ``n_trials``. ``tuned_elsewhere`` (a database's records of other runs) teaches the policies, the model
    and the allocator, but its tasks get no rounds and its records do not count.
    """
    firsts = list(first) if first is not None else [()] * len(tasks)
    states = [TaskState(float(w), t.flop_ct, tag=_tag(t), unseeded=u)
              for t, w, u in zip(tasks, weights, unseeded_tasks([len(f) for f in firsts]))]
    alloc = Allocator(states, strategy=strategy, early_stopping=early_stopping, seed=seed)
    policies = [SketchPolicy(t, model, seed=seed + i, params=search, first=f)
                for i, (t, f) in enumerate(zip(tasks, firsts))]
    schedule = _AllocatorSchedule(alloc, time_limit, on_round)
    by_key: dict[str, list[Record]] = {k: list(v) for k, v in (history or {}).items()}
    used = _feed(tasks, policies, alloc, model, by_key) if by_key else 0
    elsewhere = {k: v for k, v in (tuned_elsewhere or {}).items() if v and not by_key.get(k)}
    if elsewhere:
        _feed(tasks, policies, alloc, model, elsewhere)
        for i, task in enumerate(tasks):
            alloc.tasks[i].dead = alloc.tasks[i].dead or task.workload_key in elsewhere
    run_rounds(tasks, policies, model, measurer.measure, n_trials, used, per_round, schedule)
    return alloc


class _AllocatorSchedule:
    """The allocator as the tuning loop's :class:`~ansor.tuning.RoundSchedule`: it picks each round's task,
    and no round starts ``time_limit`` seconds after this object was made (the history's feeding counts)."""

    def __init__(self, alloc: Allocator, time_limit: Optional[float],
                 on_round: Optional[Callable[[SchedulerRound], None]]):
        self.alloc = alloc
        self.time_limit = time_limit
        self.on_round = on_round
        self.start = time.perf_counter()

    def next_task(self, trials: int) -> Optional[int]:
        if self.time_limit is not None and time.perf_counter() - self.start >= self.time_limit:
            logger.info("time limit of %.0f s reached after %d trials", self.time_limit, trials)
            return None
        return self.alloc.next_task()

    def round_done(self, index: int, rnd: Round, trials: int) -> None:
        alloc = self.alloc
        best = min([r.mean_cost for r in rnd.results if r.ok] + [alloc.tasks[index].best_cost])
        alloc.record(index, len(rnd.inputs), best)
        if self.on_round:
            self.on_round(SchedulerRound(index, trials, [t.best_cost for t in alloc.tasks], alloc.objective(),
                                         rnd.seconds, rnd.search_s, rnd.train_s))

    def exhausted(self, index: int, trials: int) -> None:
        self.alloc.tasks[index].dead = True


def _tag(task: SearchTask) -> str:
    """Tasks with the same op kind (e.g. every fused conv2d) count as similar for the forward estimate."""
    name = task.desc.split(" ")[0]
    return "conv2d" if "conv2d" in name else ("dense" if "matmul" in name or "dense" in name else "")


def _feed(tasks: Sequence[SearchTask], policies: list[SketchPolicy], alloc: Allocator, model,
          by_key: Mapping[str, Sequence[Record]]) -> int:
    """Replay records into the policies, the model and the allocator; returns how many distinct states fed
    a task (a state measured twice counts once; records that do not fit a task's program are left out)."""
    used = 0
    for i, task in enumerate(tasks):
        records = by_key.get(task.workload_key, [])
        if not records:
            continue
        history = feed_history(task, records, policies[i], model)
        if history.count:
            alloc.record(i, history.count, min(history.best_cost, MAX_COST))
            used += history.count
    logger.info("%d records of %d tasks from earlier runs", used, sum(1 for t in tasks if by_key.get(t.workload_key)))
    return used
