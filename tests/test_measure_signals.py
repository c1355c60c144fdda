"""Signals and the measurer: Ctrl-C in the middle of a batch (the tuning process exits promptly, leaves no
Ray process behind, and the results its callback already wrote stay on disk), and a tuner that ignores
SIGINT (its batches must not wait for their CPU holds to be killed)."""

import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time

import psutil
import pytest

from ansor.log.records import load_records

# Slow tier: SIGINT sent to tuners in subprocesses that each start a Ray.
pytestmark = pytest.mark.slow

SCRIPT = textwrap.dedent("""
    import sys
    from ansor.log.records import RecordWriter
    from ansor.measure import MeasureInput, ProgramMeasurer
    from ansor.task.search_task import SearchTask

    task = SearchTask.from_workload("matmul-128")
    inputs = []
    for f in [2, 4, 8, 16, 32, 64, 128, 1]:
        for g in [8, 16]:
            s = task.compute_dag.init_state()
            s.split(0, 0, [f])
            s.split(0, 2, [g])
            inputs.append(MeasureInput(task, s))
    try:
        # Every candidate timed in full (~1 s each), so the batch is still running when SIGINT comes.
        with RecordWriter(sys.argv[1]) as writer, ProgramMeasurer(min_repeat_ms=300, slow_factor=float("inf"),
                                                                  callbacks=[writer.write]) as m:
            print("measuring", flush=True)
            m.measure(inputs)
    except KeyboardInterrupt:
        sys.exit(130)
    sys.exit(3)  # the batch must not have finished before the interrupt
""")


def records_in(path) -> int:
    return len(load_records(path)) if os.path.exists(path) else 0


def test_ctrl_c_mid_batch_exits_promptly_and_cleanly(tmp_path):
    log = tmp_path / "log.json"
    script = tmp_path / "tune.py"
    script.write_text(SCRIPT)
    # A private temp root: every file and socket of this Ray session lives under it, so any process of the
    # session names it on its command line. Short, because Ray's socket paths must stay under 108 bytes.
    root = tempfile.mkdtemp(prefix="sig", dir="/tmp")
    env = {**os.environ, "TMPDIR": root}
    env.pop("RAY_ADDRESS", None)
    # A child inherits an ignored SIGINT across exec, and Python then never raises KeyboardInterrupt; an
    # earlier test in this pytest process (Ray's driver setup) may leave it ignored. A user's shell does not.
    proc = subprocess.Popen([sys.executable, str(script), str(log)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 120
        while records_in(log) < 2 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert proc.poll() is None, proc.stdout.read()
        assert records_in(log) >= 2, "no result was written in time"
        family = psutil.Process(proc.pid).children(recursive=True)
        names = " ".join(p.name() for p in family)
        assert "raylet" in names and "gcs_server" in names, names

        proc.send_signal(signal.SIGINT)
        sent = time.monotonic()
        code = proc.wait(timeout=60)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
    output = proc.stdout.read()
    assert code == 130, output
    # About 2.5 s on a quiet 2-core host; the bound leaves room for a loaded one. A batch run to its end
    # instead is caught by the record count below, a hang by the wait above.
    assert took < 20, f"took {took:.1f} s to exit after SIGINT"

    time.sleep(1)  # the raylet's workers may take a moment to notice their raylet is gone
    left = [p for p in family if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert not left, [p.cmdline() for p in left]
    strays = [p.info["cmdline"] for p in psutil.process_iter(["cmdline"]) if root in " ".join(p.info["cmdline"] or [])]
    assert not strays, strays
    assert not os.listdir(root), "the Ray temp dir was not removed"
    os.rmdir(root)

    written = load_records(log)
    assert 2 <= len(written) < 16
    assert all(r.result.ok for r in written)


HOLDS = textwrap.dedent("""
    import signal, time
    from ansor.measure.ray_session import RaySession
    from ansor.measure.runner import RunConfig
    from ansor.measure.runner_pool import RunnerPool

    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    session = RaySession.open()
    pool = RunnerPool(RunConfig())
    took = []
    for _ in range(4):  # the first starts the hold's worker; the others should find it again
        start = time.monotonic()
        with pool.reserve():
            pass
        took.append(time.monotonic() - start)
    pool.close()
    session.close()
    print(max(took[1:]))
""")


def test_cpu_holds_end_promptly_when_the_tuner_ignores_sigint(tmp_path):
    """A tuner started under ``nohup`` or with ``&`` in a script ignores SIGINT, and so do Ray's workers it
    starts. Ray's cancel of the run phase's CPU hold is a KeyboardInterrupt, which such a worker never
    saw: each batch waited RELEASE_TIMEOUT, killed the hold's worker and started a new one (4.2 s a batch
    against 0.3)."""
    from ansor.measure.runner_pool import RELEASE_TIMEOUT

    script = tmp_path / "holds.py"
    script.write_text(HOLDS)
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    proc = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300,
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    assert proc.returncode == 0, proc.stderr[-3000:]
    # About 0.1 s a hold on a quiet host. A hold that misses its cancel waits out RELEASE_TIMEOUT before it is
    # killed, so the bound tells the two apart with room for a loaded host.
    assert float(proc.stdout.split()[-1]) < RELEASE_TIMEOUT, proc.stdout
