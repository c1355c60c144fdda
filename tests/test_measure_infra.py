"""Failures of the machinery are not the candidate's: retried, else INFRA_ERROR (never learned from, proposed
again); and a build that needs more memory than its cap fails with a message saying so.

Every fault is real: CPUs really held by another task, a runner process really SIGKILLed mid-run (as the
kernel's OOM killer would), an unrolled loop that really makes TVM allocate past the cap.
"""

import os
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
import ray

from ansor.measure import ErrorNo, MeasureInput, MeasureResult, ProgramMeasurer, program_results
from ansor.measure.builder import RayBuilder
from ansor.task.search_task import SearchTask

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts" / "bench"))
from fault_programs import big_copy  # noqa: E402  (shared with scripts/bench/fault_report.py)

# Slow tier: faults of the machinery (held CPUs, a SIGKILLed runner, a memory cap) on a real Ray.
pytestmark = pytest.mark.slow


@ray.remote
def hold_cpus(held: str, release: str) -> None:
    """Holds its CPUs from when it writes ``held`` until ``release`` exists (at most a minute)."""
    Path(held).touch()
    deadline = time.monotonic() + 60
    while not os.path.exists(release) and time.monotonic() < deadline:
        time.sleep(0.05)


@pytest.mark.timing
def test_a_build_that_gets_no_worker_is_an_infrastructure_failure(local_ray, matmul_inputs, tmp_path):
    """Someone else's work holds every CPU: the build never starts, is submitted again, then is INFRA_ERROR."""
    task = SearchTask.from_workload("matmul-64")
    cpus = int(ray.cluster_resources()["CPU"])
    held, release = tmp_path / "held", tmp_path / "release"
    blocker = hold_cpus.options(num_cpus=cpus).remote(str(held), str(release))
    deadline = time.monotonic() + 60
    while not held.exists() and time.monotonic() < deadline:  # the blocker holds the CPUs
        time.sleep(0.05)
    assert held.exists(), "the blocker never started"
    try:
        start = time.monotonic()
        [result] = RayBuilder(start_timeout=1.0).build([(task, matmul_inputs(task, 1)[0].state)])
        elapsed = time.monotonic() - start
    finally:
        release.touch()
    assert result.error_no == ErrorNo.INFRA_ERROR and "2 times" in result.error_msg, result.error_msg
    # Two attempts of 1 s, nothing charged to the candidate. The upper bound allows 4x for a loaded host and
    # still fails a builder that ignores start_timeout (its default is WORKER_START_TIMEOUT, 120 s).
    assert 2.0 <= elapsed < 8.0, elapsed
    ray.get(blocker)
    # The search neither remembers such a candidate as measured nor learns from it.
    inp = matmul_inputs(task, 1)
    failed = MeasureResult((1e10,), result.error_no, result.error_msg)
    assert failed.retriable and program_results(inp, [failed]) == ([], [])


def runner_processes() -> list:
    return [p for p in psutil.process_iter(["cmdline"])
            if " ".join(p.info["cmdline"] or []).startswith("ray::Runner.run")]


def test_a_runner_killed_mid_run_costs_the_candidate_nothing(local_ray, matmul_inputs):
    """SIGKILL the runner while it times a candidate: the candidate runs again on a fresh runner and is fine."""
    task = SearchTask.from_workload("matmul-128")
    first_done, killed = threading.Event(), []

    def killer() -> None:  # after the first result, kill the runner timing the next candidate (~0.5 s each)
        first_done.wait(120)
        deadline = time.monotonic() + 10
        while not killed and time.monotonic() < deadline:
            for p in runner_processes():
                p.kill()
                killed.append(p.pid)
            time.sleep(0.01)

    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    with ProgramMeasurer(min_repeat_ms=150, slow_factor=float("inf"),
                         callbacks=[lambda i, r: first_done.set()]) as m:
        results = m.measure(matmul_inputs(task, 3))
    thread.join()
    assert killed, "no runner was caught running"
    assert all(r.ok for r in results), [r.error_msg for r in results]


def test_a_build_past_its_memory_cap_fails_saying_so(local_ray):
    """Fully unrolling 2^20 iterations makes TVM allocate gigabytes; under a 0.75 GiB cap it must stop."""
    task = SearchTask(big_copy)
    state = task.compute_dag.init_state()
    state.annotate(0, 0, "unroll")
    with ProgramMeasurer(build_memory_gib=0.75, build_timeout=60) as m:
        [result] = m.measure([MeasureInput(task, state)])
        healthy = m.measure([MeasureInput(task, task.compute_dag.init_state())])[0]
    assert result.error_no == ErrorNo.COMPILE_HOST, (result.error_no, result.error_msg)
    assert "build exceeded the 0.8 GiB memory cap" in result.error_msg, result.error_msg  # 0.75, one decimal
    assert healthy.ok, healthy.error_msg  # the next build works: the cap cost one candidate
