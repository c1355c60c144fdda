"""Shared fixtures: one local Ray instance per test module that needs one (starting Ray takes ~4 s), the
machine to itself for every test marked ``timing`` when pytest-xdist runs tests side by side, and the longest
modules collected first."""

import atexit
import contextlib
import fcntl
import itertools
import os
import tempfile

import psutil
import pytest

# TVM's CPU runtime, started in a test's own process without TVM_NUM_THREADS, runs one thread on a 2-core
# machine and pins the whole process to core 0; every process it starts later (its Ray, the scripts under
# test) inherits that, so a worker of the suite ran the rest of its modules on one core. All cores instead.
os.environ.setdefault("TVM_NUM_THREADS", str(psutil.cpu_count(logical=False) or os.cpu_count() or 1))


def _remove(path: str) -> None:
    with contextlib.suppress(OSError):
        os.remove(path)


# Under pytest-xdist each worker is a machine of its own to ansor's measurement lock (ansor/measure/host_lock.py):
# with the machine's one lock a worker's timings waited on the others' builds (a 14 s test took 59 s; the first
# pass 500 -> 477 s on 2 Zen 3 cores). Tests asserting on speeds run alone (``timing``, below).
if os.environ.get("PYTEST_XDIST_WORKER") and "ANSOR_HOST_LOCK" not in os.environ:
    os.environ["ANSOR_HOST_LOCK"] = os.path.join(
        tempfile.gettempdir(), f"ansor-tests-{os.environ.get('PYTEST_XDIST_TESTRUNUID', '')}-"
                               f"{os.environ['PYTEST_XDIST_WORKER']}.measure.lock")
    atexit.register(_remove, os.environ["ANSOR_HOST_LOCK"])


#: Modules whose tests together take minutes (end-to-end tuning runs in subprocesses), longest first: collected
#: before the rest, since pytest-xdist's ``loadscope`` hands whole modules to its workers in collection order,
#: and a long module started last is the run's tail (test_tune_network, ~4 minutes alone, ended a first pass
#: two minutes after every other module).
LONG_MODULES = ("test_tune_network", "test_tune_test_script", "test_tune_network_kill", "test_tutorial", "test_measure_signals",
                "test_measure_host_lock", "test_relax_api", "test_measure_infra")


def pytest_configure(config):
    """Keep :data:`LONG_MODULES` first under pytest-xdist: its ``loadscope`` re-sorts modules by their number
    of tests unless told not to (pytest-xdist 3.8), which put test_tune_network (12 tests) behind modules of
    hundreds of quick ones."""
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(config, items):
    """:data:`LONG_MODULES` first, in that order; every other module, and every module's tests, in their own."""
    rank = {name: i for i, name in enumerate(LONG_MODULES)}
    items.sort(key=lambda item: rank.get(item.module.__name__.rpartition(".")[2], len(rank)))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Under pytest-xdist, a ``timing`` test runs alone on the machine: it asserts on measured speeds, which
    another worker's compilation would move. Every other test (its fixtures' setup and teardown included)
    holds a shared lock that a timing test takes exclusively; a gate taken first keeps new shared holders out
    while a timing test waits (flock is not fair)."""
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if run is None:  # one process: nothing runs beside the test
        return (yield)
    exclusive = item.get_closest_marker("timing") is not None
    base = os.path.join(tempfile.gettempdir(), f"ansor-tests-{run}")
    with open(base + ".gate", "a") as gate, open(base + ".lock", "a") as lock:
        fcntl.flock(gate, fcntl.LOCK_EX)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        finally:
            if not exclusive:
                fcntl.flock(gate, fcntl.LOCK_UN)
        try:
            return (yield)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
            fcntl.flock(gate, fcntl.LOCK_UN)


@pytest.fixture(scope="module")
def local_ray():
    """An embedded Ray on this machine, listening on 127.0.0.1 only; measurers created inside reuse it."""
    from ansor.measure.ray_session import RaySession

    session = RaySession.open()
    assert session.owns_cluster, "a Ray connection was left open by an earlier test module"
    yield session
    session.close()


@pytest.fixture(scope="session")
def matmul_inputs():
    """Makes ``n`` distinct tilings of a matmul task's block (stage 0: i, j, k), outer loop parallel."""
    from ansor.log.measurement import MeasureInput

    def make(task, n: int) -> list:
        inputs = []
        for f, g in itertools.islice(itertools.product([4, 8, 16, 32], [4, 8, 16, 32]), n):
            s = task.compute_dag.init_state()
            s.split(0, 0, [f])
            s.split(0, 2, [g])
            s.annotate(0, 0, "parallel")
            inputs.append(MeasureInput(task, s))
        return inputs

    return make


#: Calls a script's ``main(argv)`` for each argv in one process: importing TVM once instead of once a case.
_MAIN_PER_CASE = """
import contextlib, importlib.util, io, json, sys, traceback
spec = importlib.util.spec_from_file_location("script_under_test", sys.argv[1])
script = importlib.util.module_from_spec(spec)
spec.loader.exec_module(script)
results = []
for argv in json.loads(sys.stdin.read()):
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            code = script.main(argv)
        except SystemExit as exit:  # argparse's own errors
            code = exit.code
        except BaseException:
            traceback.print_exc()
            code = None
    results.append([code, err.getvalue()])
print(json.dumps(results))
"""


@pytest.fixture(scope="session")
def run_main_per_case():
    """``run(script, cases, cwd)`` -> ``[(exit code, stderr)]``: each argv through the script's real ``main``,
    all in one fresh process (a user's environment: no Ray variables)."""
    import json
    import os
    import subprocess
    import sys

    def run(script, cases: list[list[str]], cwd) -> list[tuple[int, str]]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
        proc = subprocess.run([sys.executable, "-c", _MAIN_PER_CASE, str(script)], input=json.dumps(cases),
                              capture_output=True, text=True, timeout=600, env=env, cwd=cwd)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return [tuple(r) for r in json.loads(proc.stdout.splitlines()[-1])]

    return run
