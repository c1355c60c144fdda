"""scripts/tune_network.py killed with SIGKILL mid-run, then resumed: nothing measured is lost or measured again.

A module of its own so that pytest-xdist (``--dist loadscope``) runs it beside test_tune_network.py's shared
tuning run; the helpers that run the scripts are that module's.
"""

import os
import re
import shutil
import signal
import subprocess
import sys
import time

import psutil
import pytest

from test_tune_network import ROOT, SCRIPTS, env, records, run

# Slow tier: a real tuning run in a subprocess, killed, then resumed.
pytestmark = pytest.mark.slow


def _descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def _kill_run(proc: subprocess.Popen) -> None:
    """SIGKILL the script's process group, then every Ray process it started (by pid), then Ray's files."""
    family = _descendants(proc.pid)
    temp_dirs = {m for p in family for m in re.findall(r"/[^\s=,]*ansor-ray-[^/\s=,]+", " ".join(_cmdline(p)))}
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    deadline = time.time() + 20
    while time.time() < deadline:
        left = [p for p in family if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        left += [p for p in psutil.process_iter() if p.pid != os.getpid() and p not in left
                 and any(d in " ".join(_cmdline(p)) for d in temp_dirs)]
        if not left:
            break
        for p in left:
            try:
                p.kill()
            except psutil.Error:
                pass
        time.sleep(0.5)
    else:
        pytest.fail(f"Ray processes of the killed run are still alive: {[p.pid for p in left]}")
    for d in temp_dirs:
        shutil.rmtree(d, ignore_errors=True)


def _cmdline(p: psutil.Process) -> list[str]:
    try:
        return p.cmdline()
    except psutil.Error:
        return []


def test_kill_9_then_resume_loses_and_repeats_nothing(tmp_path):
    log = tmp_path / "tiny-cnn-b1.json"
    out, err = open(tmp_path / "out.txt", "w"), open(tmp_path / "err.txt", "w")
    proc = subprocess.Popen([sys.executable, str(SCRIPTS / "tune_network.py"), "--network", "tiny-cnn",
                             "--n-trials", "200", "--per-round", "2", "--cost-model", "random", "--log-file",
                             str(log)], stdout=out, stderr=err, env=env(), cwd=ROOT, start_new_session=True)
    try:
        deadline = time.time() + 180
        while time.time() < deadline and proc.poll() is None:
            if log.exists() and len(records(log)) >= 4:
                break
            time.sleep(0.2)
        assert proc.poll() is None, f"the run ended before it was killed: {(tmp_path / 'err.txt').read_text()}"
        assert log.exists() and len(records(log)) >= 4, "no records after 180 s"
    finally:
        _kill_run(proc)
        out.close()
        err.close()
    assert proc.returncode == -signal.SIGKILL
    text = log.read_text()
    complete = text[: text.rfind("\n") + 1].splitlines()  # a torn last line is not a measurement
    before = records(log)

    resumed = run("tune_network.py", "--network", "tiny-cnn", "--n-trials", len(before) + 4, "--per-round", 2,
                  "--cost-model", "random", "--log-file", log, "--resume", "--no-eval")  # the report: test_tune_network
    assert resumed.returncode == 0 and "Traceback" not in resumed.stderr, resumed.stderr[-3000:]
    assert f"resumed {len(before)} measurements" in resumed.stderr
    assert re.search(r"^tuning: 4 new trials", resumed.stderr, re.M), resumed.stderr[-2000:]
    # --no-eval: the tasks' table, no final builds
    assert "building the default and the tuned network" not in resumed.stderr
    assert "Mean inference time" not in resumed.stdout and "Estimated total latency" in resumed.stdout
    assert log.read_text().splitlines()[: len(complete)] == complete  # nothing lost or rewritten
    after = records(log)
    assert after[: len(before)] == before and len(after) == len(before) + 4
    assert len(set(after)) == len(after), "a state was measured twice"
