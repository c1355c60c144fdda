"""Progress of a tuning run on a terminal: measure callbacks that count results and draw them.

:class:`Tally` counts what finished (trials and best time per task, failures, unchecked and infrastructure
results); :class:`TrialBar` shows one task as a tqdm bar (``scripts/tune_test.py``); :class:`TaskTable`
shows a network's tasks as a table redrawn after each measurement (``scripts/tune_network.py``). Both are
measure callbacks (``TuningOptions.measure_callbacks``) and write to a stream, stderr by default.
"""

from __future__ import annotations

import math
import shutil
import sys
import time
from typing import Any, Optional, Sequence, TextIO

from ..log.measurement import MeasureInput, MeasureResult
from .tables import format_table


class Tally:
    """Counts of the results of a run, by task (``keys``: the tasks' workload keys, in display order)."""

    def __init__(self, keys: Sequence[str]):
        self.index = {key: i for i, key in enumerate(keys)}
        self.trials = [0] * len(keys)
        self.best = [math.inf] * len(keys)  # seconds
        self.used = self.resumed = self.errors = 0
        self.unchecked = self.infra = 0  # of this run's measurements (MeasureResult.checked, .retriable)

    def add(self, key: str, result: MeasureResult, counts: bool = True) -> None:
        """One result of the task ``key``; ``counts``: it uses the trial budget (a database's do not)."""
        i = self.index.get(key)
        if i is None:
            return
        self.trials[i] += 1
        self.used += counts
        if result.ok:
            self.best[i] = min(self.best[i], result.mean_cost)
        else:
            self.errors += 1

    def measured(self, inputs: Sequence[MeasureInput], results: Sequence[MeasureResult]) -> None:
        """Measure callback: results of this run."""
        for inp, res in zip(inputs, results):
            self.add(inp.task.workload_key, res)
            self.unchecked += not res.checked
            self.infra += res.retriable

    def notes(self) -> list[str]:
        """``note: ...`` lines on results that deserve a second look (unchecked, infrastructure failures)."""
        out = []
        if self.unchecked:
            out.append(f"note: {self.unchecked} of this run's measurements ran without a correctness check (the "
                       "reference program failed; marked unchecked in the log)")
        if self.infra:
            out.append(f"note: {self.infra} of this run's measurements failed for infrastructure reasons "
                       "(INFRA_ERROR; measured again after --resume)")
        return out


class TrialBar(Tally):
    """One task's progress as a tqdm bar: trials done, best GFLOPS, failures. Use as a context manager."""

    def __init__(self, task: Any, n_trials: int, stream: Optional[TextIO] = None):
        super().__init__([task.workload_key])
        self.task = task
        from tqdm import tqdm
        self.bar = tqdm(total=n_trials, unit="trial", desc=task.workload_key, dynamic_ncols=True,
                        file=stream or sys.stderr)

    def resumed_from(self, n: int) -> None:
        """``on_resume`` callback: ``n`` measurements of the log count towards the budget."""
        self.bar.update(min(n, self.bar.total))

    def measured(self, inputs: Sequence[MeasureInput], results: Sequence[MeasureResult]) -> None:
        super().measured(inputs, results)
        best = self.task.flop_ct / self.best[0] / 1e9 if self.best[0] < math.inf else 0.0
        self.bar.set_postfix_str(f"best {best:.1f} GFLOPS, errors {self.errors}")
        self.bar.update(len(results))

    def __enter__(self) -> "TrialBar":
        return self

    def __exit__(self, *exc: object) -> None:
        self.bar.close()


class TaskTable(Tally):
    """The per-task table of a network: name, shape, weight, trials, best latency, and the estimated total.

    ``tasks`` have ``workload_key``, ``name`` (``"op shape"``), ``weight`` and ``task`` (a
    :class:`~ansor.networks.NetworkTask`). On a terminal the table is redrawn in place after every
    measurement, with a tqdm progress line under it. When the stream is a file or a pipe, each round prints
    one line, and the whole table every :data:`EVERY` rounds.
    """

    EVERY = 10

    def __init__(self, tasks: Sequence[Any], n_trials: int, stream: Optional[TextIO] = None):
        super().__init__([t.workload_key for t in tasks])
        self.tasks = list(tasks)
        self.n_trials = n_trials
        self.rounds = 0
        self.stream = stream or sys.stderr
        # Redraw in place only on a terminal tall enough for the whole table.
        self.tty = self.stream.isatty() and len(self.tasks) + 6 < shutil.get_terminal_size((100, 24)).lines
        self._drawn = 0
        self._live = False
        self.t0 = time.time()

    # -- data
    def load(self, records: Sequence[Any]) -> None:
        """Count measurements already in logs (what ``--eval-only`` applies): one record per state."""
        for rec in records:
            self.add(rec.workload_key, rec.result)
        self.resumed = self.used

    def add_history(self, resumed: dict, reused: dict) -> None:
        """``on_history`` callback: resumed records count towards the budget, a database's do not."""
        for records, counts in ((resumed, True), (reused, False)):
            for key, recs in records.items():
                for rec in recs:
                    self.add(key, rec.result, counts)
        self.resumed = self.used

    def measured(self, inputs: Sequence[MeasureInput], results: Sequence[MeasureResult]) -> None:
        super().measured(inputs, results)
        if self.tty and self._live:
            self._draw()

    def round_done(self, rnd: Any) -> None:
        """``on_round`` callback of the task scheduler: a round ended."""
        self.rounds += 1
        if self.tty:
            self._draw()
            return
        name = self.tasks[rnd.task_index].name
        print(f"round {self.rounds:4d}  trials {rnd.trials_total:5d}/{self.n_trials}  task {rnd.task_index:3d} "
              f"{name[:60]:<60}  best {_ms(self.best[rnd.task_index])} ms  estimated total {self.total_text()}  "
              f"({rnd.seconds:.1f} s)", file=self.stream, flush=True)
        if self.rounds % self.EVERY == 0:
            print("\n".join(self.render()), file=self.stream, flush=True)

    def total(self) -> tuple[float, int]:
        """Weighted sum of the best latencies (ms) over the measured tasks, and how many are measured."""
        done = [i for i, b in enumerate(self.best) if b < math.inf]
        return sum(self.tasks[i].weight * self.best[i] for i in done) * 1e3, len(done)

    def total_text(self) -> str:
        total, done = self.total()
        if done == len(self.tasks):
            return f"{total:.3f} ms"
        return f"- ({done}/{len(self.tasks)} tasks measured)"

    # -- drawing
    def render(self, final: bool = False) -> list[str]:
        rows = []
        for i, t in enumerate(self.tasks):
            op, _, shape = t.name.partition(" ")
            best = self.best[i]
            gflops = f"{t.task.flop_ct / best / 1e9:.1f}" if best < math.inf and t.task.flop_ct else "-"
            rows.append((str(i), op, shape, str(t.weight), str(self.trials[i]), _ms(best), gflops))
        lines = format_table(("ID", "Task", "Shape", "Weight", "Trials", "Best (ms)", "GFLOPS"), rows,
                             "><<>>>>")
        total, done = self.total()
        if done == len(self.tasks):
            lines.append(f"Estimated total latency: {total:.3f} ms (sum of weight x best latency)")
        else:
            lines.append(f"Estimated total latency: - ({len(self.tasks) - done} of {len(self.tasks)} tasks not "
                         f"measured yet{f'; measured ones: {total:.3f} ms' if done else ''})")
        if self.tty and not final:
            lines.append(self._meter())
        return lines

    def _meter(self) -> str:
        from tqdm import tqdm
        width = shutil.get_terminal_size((100, 24)).columns if self.tty else 100
        return tqdm.format_meter(min(self.used, self.n_trials), self.n_trials, time.time() - self.t0,
                                 ncols=width, unit="trial", initial=self.resumed,
                                 postfix=f"round {self.rounds}, {self.errors} failed")

    def start(self) -> None:
        self.t0 = time.time()
        self._live = True
        if self.tty:
            self._draw()
        else:
            print("\n".join(self.render()), file=self.stream, flush=True)

    def stop(self) -> None:
        self._live = False
        if self.tty and self._drawn:  # erase the live table: the final one goes to stdout
            self.stream.write(f"\x1b[{self._drawn}F\x1b[J")
            self.stream.flush()
            self._drawn = 0

    def _draw(self) -> None:
        lines = self.render()
        out = []
        if self._drawn:  # move back to the table's first line and clear below
            out.append(f"\x1b[{self._drawn}F\x1b[J")
        out.append("\n".join(lines) + "\n")
        self.stream.write("".join(out))
        self.stream.flush()
        self._drawn = len(lines)


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.4f}" if seconds < math.inf else "-"
