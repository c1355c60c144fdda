"""scripts/tune_test.py as a user runs it: bad input, a short real tuning run, and --resume."""

import ipaddress
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

# Slow tier: scripts/tune_test.py in subprocesses: real tuning runs, Ray, SIGINT.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "tune_test.py"


def user_env() -> dict:
    """The environment of a user who never heard of Ray's settings: none of its variables set."""
    return {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}


def run(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout,
                          env=user_env(), cwd=ROOT)


def is_loopback(ip: str) -> bool:
    addr = ipaddress.ip_address(ip.split("%")[0])
    mapped = getattr(addr, "ipv4_mapped", None)
    return (mapped or addr).is_loopback


#: The files a record timed by a runner crosses from the script to the log, in call order: those on the stack
#: when the writer appends it (docs/design.md lists them; a new hop on the way fails here). Other records take
#: shorter ways: a failed build is logged from the build's callback, a slow candidate of a task's first batch
#: with its probe run, both without the runners' file.
PATH_TO_A_RECORD = [
    "scripts/tune_test.py",
    "ansor/cli/main.py",
    "ansor/cli/commands/tune_op.py",
    "ansor/cli/running.py",
    "ansor/tuning/loop.py",
    "ansor/measure/measurer.py",
    "ansor/measure/runner_pool.py",
    "ansor/log/records.py",
]

#: Runs a script with the stack of every append to a log recorded: the last line of its output lists them.
_STACKS_AT_APPENDS = """
import json, runpy, sys, traceback
from ansor.log import records

append, stacks = records.RecordWriter._append, []


def traced(self, data):
    stacks.append([frame.filename for frame in traceback.extract_stack()])
    return append(self, data)


records.RecordWriter._append = traced
sys.argv = sys.argv[1:]
try:
    runpy.run_path(sys.argv[0], run_name="__main__")
except SystemExit as done:
    assert not done.code, done.code
print(json.dumps(stacks))
"""


def run_sampling_listeners(*args: str, timeout: int = 300) -> tuple[subprocess.CompletedProcess, set, set]:
    """Run the script; while it runs, every 0.5 s collect the listening sockets of its process tree (a sweep
    of Ray's ~10 processes costs ~90 ms of CPU: every 0.2 s it took a third of a core from the suite). The
    script runs under :data:`_STACKS_AT_APPENDS`, so the last line of its output lists the stack of each
    append to its log.

    Returns the finished process and the sets of (process name, ip, port) listening on loopback and
    elsewhere. Sockets are read per process, so nothing else on the machine is counted.
    """
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen([sys.executable, "-c", _STACKS_AT_APPENDS, str(SCRIPT), *args], stdout=out,
                                stderr=err, text=True, env=user_env(), cwd=ROOT)
        local, exposed = set(), set()
        deadline = time.monotonic() + timeout
        try:
            root = psutil.Process(proc.pid)
            while proc.poll() is None and time.monotonic() < deadline:
                try:
                    family = [root, *root.children(recursive=True)]
                except psutil.Error:
                    break
                for p in family:
                    try:
                        name, conns = p.name(), p.net_connections(kind="inet")
                    except psutil.Error:  # it ended between the listing and the look
                        continue
                    for c in conns:
                        listening = c.status == psutil.CONN_LISTEN or (c.type == socket.SOCK_DGRAM and not c.raddr)
                        if listening:
                            (local if is_loopback(c.laddr.ip) else exposed).add((name, c.laddr.ip, c.laddr.port))
                time.sleep(0.5)
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        out.seek(0), err.seek(0)
        return subprocess.CompletedProcess(proc.args, proc.returncode, out.read(), err.read()), local, exposed


BAD_INPUT = [
    (["--wkl", "matmul-foo"], "matmul-N"),
    (["--n-trials", "0"], "--n-trials 64"),
    (["--n-trials", "-3"], "--n-trials 64"),
    (["--target", "llvm -mcpu"], "examples:"),
    (["--target", '{"kind": "llvm"'], "not valid JSON"),
    (["--target", "nosuchkind"], "examples:"),
    (["--target", "llvm -mcpu='x"], "No closing quotation"),
    (["--target", "llvm -mcpu=x"], "valid -mcpu values"),
    (["--target", "llvm -mtriple=nosuch-linux-gnu"], "valid architectures: aarch64"),
    (["--target", "llvm -num-cores=0"], "num-cores must be a positive integer"),
    (["--seed", "-1"], "--seed must be an integer from 0"),
    (["--wkl", "matmul-99999999999999999999"], "too large"),
    (["--build-memory-gib", "0"], "--build-memory-gib 8"),
]


@pytest.fixture(scope="module")
def bad_input_runs(run_main_per_case):
    return run_main_per_case(SCRIPT, [args for args, _ in BAD_INPUT], ROOT)


@pytest.mark.parametrize("case", range(len(BAD_INPUT)), ids=[" ".join(a) for a, _ in BAD_INPUT])
def test_bad_input_is_one_line_and_exit_2(case, bad_input_runs):
    needle = BAD_INPUT[case][1]
    code, stderr = bad_input_runs[case]
    assert code == 2, stderr
    lines = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and needle in lines[0], stderr
    assert "Traceback" not in stderr


def test_unreachable_ray_address_fails_in_seconds(tmp_path):
    start = time.monotonic()
    proc = run("--wkl", "matmul-64", "--ray-address", "127.0.0.1:1", "--log-file", str(tmp_path / "x.json"),
               timeout=120)
    took = time.monotonic() - start
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2 and len(lines) == 1 and "cannot join the Ray cluster at 127.0.0.1:1" in lines[0], \
        proc.stderr
    assert "Traceback" not in proc.stderr
    assert took < 60  # Ray alone retries an unreachable GCS for about a minute, after start-up


def test_ctrl_c_before_tuning_is_exit_130(tmp_path):
    """SIGINT while the script is still importing TVM and parsing the target: a short message, status 130."""
    proc = subprocess.Popen([sys.executable, str(SCRIPT), "--wkl", "matmul-64", "--log-file", str(tmp_path / "x.json")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=user_env(), cwd=ROOT,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 60
        while proc.poll() is None and time.monotonic() < deadline:  # interrupt once TVM is being loaded
            with open(f"/proc/{proc.pid}/maps") as maps:
                if "libtvm" in maps.read():
                    break
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert "interrupted" in err and "Traceback" not in err


def test_unreadable_log_is_exit_2(tmp_path):
    proc = run("--wkl", "matmul-64", "--log-file", str(tmp_path), "--resume", timeout=120)
    assert proc.returncode == 2 and "is a directory" in proc.stderr and "Traceback" not in proc.stderr


def test_help_explains_every_flag():
    out = run("--help", timeout=60).stdout
    for flag in ("--wkl", "--n-trials", "--target", "--log-file", "--resume", "--seed", "--ray-address",
                 "--cost-model", "--load-model", "--per-round", "--build-memory-gib"):
        assert flag in out
    assert "127.0.0.1 only" in out and "token authentication" in out  # what joining a cluster trusts


def _steps_of(log: Path) -> list[str]:
    rows = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    return [json.dumps(r["i"][1][1]) for r in rows if "i" in r]


@pytest.fixture(scope="module")
def first_run(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess, set, set]:
    """A short run into a database, watched: its listening sockets, and the stack of each append to its log."""
    db = tmp_path_factory.mktemp("first-run") / "db"
    proc, local, exposed = run_sampling_listeners("--wkl", "matmul-64", "--n-trials", "8", "--per-round", "4",
                                                  "--database", str(db), "--cost-model", "random")
    return db, proc, local, exposed


def test_short_run_listens_on_loopback_only_then_resume_measures_nothing_twice(first_run, tmp_path):
    """A run into a database, resumed by its log file, then rerun on a spent budget: nothing measured twice."""
    db, first, local, exposed = first_run
    assert first.returncode == 0, first.stderr[-2000:]
    # Ray's servers (GCS, raylet, workers, agents) were seen, and none of them listened beyond loopback.
    names = {name for name, _, _ in local | exposed}
    assert {"gcs_server", "raylet"} <= names, names
    assert not exposed, sorted(exposed)
    assert "Best program:" in first.stdout and "GFLOPS" in first.stdout
    assert "Lowered TIR" in first.stdout
    log = db / "matmul-64.json"  # the log defaults to DIR/<workload>.json
    assert len(_steps_of(log)) == 8
    second = run("--wkl", "matmul-64", "--n-trials", "12", "--per-round", "4", "--log-file", str(log),
                 "--resume", "--cost-model", "random")
    assert second.returncode == 0, second.stderr[-2000:]
    steps = _steps_of(log)
    assert len(steps) == 12  # 8 resumed + 4 new
    assert len(set(steps)) == 12  # nothing measured twice
    assert "(8 resumed)" in second.stdout
    other = tmp_path / "other.json"
    spent = run("--wkl", "matmul-64", "--n-trials", "12", "--database", str(db), "--log-file", str(other))
    assert spent.returncode == 0, spent.stderr[-2000:]
    assert "(12 resumed)" in spent.stdout and "Best program:" in spent.stdout
    assert not other.exists() or _steps_of(other) == []


def test_a_record_crosses_at_most_eight_files_of_ours(first_run):
    _, proc, _, _ = first_run
    assert proc.returncode == 0, proc.stderr[-2000:]
    ways: list[list[str]] = []  # the distinct ways of the run's records through our files
    for stack in json.loads(proc.stdout.splitlines()[-1]):
        files: list[str] = []
        for name in stack:
            path = Path(name).resolve()
            ours = path.is_relative_to(ROOT) and path.relative_to(ROOT).parts[0] in ("ansor", "scripts")
            if ours and str(path.relative_to(ROOT)) not in files:
                files.append(str(path.relative_to(ROOT)))
        if files not in ways:
            ways.append(files)
    assert PATH_TO_A_RECORD in ways, ways
    assert all(len(files) <= 8 for files in ways), ways
