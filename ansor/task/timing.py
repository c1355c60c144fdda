"""How long each kind of timing runs: the repeats and the least time per repeat, in one place.

A repeat runs the program as often as fits in ``min_repeat_ms`` and reports the average; statistics are
over the repeats. Candidates are timed briefly (thousands per run); what a user reads is timed longer.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TimingPolicy:
    """``repeat`` repeats of at least ``min_repeat_ms`` each."""

    repeat: int
    min_repeat_ms: int


#: A search candidate (the runner's RunConfig): ~45 ms, its caches flushed before each run on a CPU.
CANDIDATE = TimingPolicy(repeat=3, min_repeat_ms=15)
#: A network or program as reported to the user: 2 s, so one slow repeat moves the median little.
REPORT = TimingPolicy(repeat=10, min_repeat_ms=200)
#: The network-level selection's builds, timed in turn for several rounds: ~150 ms a build a round.
SELECTION = TimingPolicy(repeat=3, min_repeat_ms=50)
#: The thread-pool probe of an export, per setting in each of its fresh processes.
POOL_PROBE = TimingPolicy(repeat=5, min_repeat_ms=100)
#: Fresh processes per setting of that probe: one process's time varies with where its threads land.
POOL_PROBE_PROCESSES = 3
