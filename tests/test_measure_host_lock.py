"""Two tuners on one machine, each with its own embedded Ray: neither times while the other builds or times."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

# Slow tier: two tuners in subprocesses, each with its own Ray.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]

TUNER = textwrap.dedent("""
    import json, logging, os, sys, time
    from ansor.measure import MeasureInput, ProgramMeasurer
    from ansor.task.search_task import SearchTask

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    me, other, out = sys.argv[1:]
    task = SearchTask.from_workload("matmul-128")
    inputs = []
    for f in [4, 8, 16, 32]:
        s = task.compute_dag.init_state()
        s.split(0, 0, [f])
        s.annotate(0, 0, "parallel")
        inputs.append(MeasureInput(task, s))
    with ProgramMeasurer(min_repeat_ms=30, slow_factor=float("inf")) as m:
        open(me, "w").close()  # Ray is up: wait for the other tuner, then both measure at once
        deadline = time.monotonic() + 120
        while not os.path.exists(other) and time.monotonic() < deadline:
            time.sleep(0.05)
        spans = []
        for _ in range(2):
            m.measure(inputs)
            spans += [[s.kind, s.start, s.end] for s in m.spans]
    json.dump(spans, open(out, "w"))
""")


def overlaps(a, b) -> bool:
    return a[1] < b[2] and b[1] < a[2]


def test_two_tuners_never_time_while_the_other_works(tmp_path):
    script = tmp_path / "tuner.py"
    script.write_text(TUNER)
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["ANSOR_HOST_LOCK"] = str(tmp_path / "host.lock")  # this test's "machine": both tuners share it
    procs = [subprocess.Popen([sys.executable, str(script), str(tmp_path / f"ready{i}"),
                               str(tmp_path / f"ready{1 - i}"), str(tmp_path / f"spans{i}.json")],
                              env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for i in (0, 1)]
    outputs = [p.communicate(timeout=400)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outputs
    a, b = (json.loads((tmp_path / f"spans{i}.json").read_text()) for i in (0, 1))
    # Both really measured at the same time (their batches interleave), so the lock had work to do ...
    assert max(s[1] for s in a) > min(s[1] for s in b) and max(s[1] for s in b) > min(s[1] for s in a)
    assert any("waiting to" in out for out in outputs), outputs
    # ... and no run of one tuner overlaps any build or run of the other.
    for mine, theirs in ((a, b), (b, a)):
        for run in (s for s in mine if s[0] in ("run", "reference")):
            clash = [s for s in theirs if overlaps(run, s)]
            assert not clash, (run, clash)
