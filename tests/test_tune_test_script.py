"""scripts/tune_test.py as a user runs it: bad input, a short real tuning run, and --resume."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "tune_test.py"


def run(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    env.pop("RAY_ADDRESS", None)
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout,
                          env=env, cwd=ROOT)


@pytest.mark.parametrize("args, needle", [
    (["--wkl", "matmul-foo"], "matmul-N"),
    (["--n-trials", "0"], "--n-trials 64"),
    (["--n-trials", "-3"], "--n-trials 64"),
    (["--target", "llvm -mcpu"], "examples:"),
    (["--target", '{"kind": "llvm"'], "not valid JSON"),
    (["--target", "nosuchkind"], "examples:"),
])
def test_bad_input_is_one_line_and_exit_2(args, needle):
    proc = run(*args, timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and needle in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr


def test_unreadable_log_is_exit_2(tmp_path):
    proc = run("--wkl", "matmul-64", "--log-file", str(tmp_path), "--resume", timeout=120)
    assert proc.returncode == 2 and "is a directory" in proc.stderr and "Traceback" not in proc.stderr


def test_help_explains_every_flag():
    out = run("--help", timeout=60).stdout
    for flag in ("--wkl", "--n-trials", "--target", "--log-file", "--resume", "--seed", "--ray-address",
                 "--cost-model", "--load-model", "--per-round"):
        assert flag in out


def _steps_of(log: Path) -> list[str]:
    rows = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    return [json.dumps(r["i"][1][1]) for r in rows if "i" in r]


def test_short_run_then_resume_measures_nothing_twice(tmp_path):
    log = tmp_path / "mm.json"
    first = run("--wkl", "matmul-64", "--n-trials", "8", "--per-round", "4", "--log-file", str(log),
                "--cost-model", "random")
    assert first.returncode == 0, first.stderr[-2000:]
    assert "Best program:" in first.stdout and "GFLOPS" in first.stdout
    assert "Lowered TIR" in first.stdout
    assert len(_steps_of(log)) == 8
    second = run("--wkl", "matmul-64", "--n-trials", "12", "--per-round", "4", "--log-file", str(log),
                 "--resume", "--cost-model", "random")
    assert second.returncode == 0, second.stderr[-2000:]
    steps = _steps_of(log)
    assert len(steps) == 12  # 8 resumed + 4 new
    assert len(set(steps)) == 12  # nothing measured twice
    assert "(8 resumed)" in second.stdout


def test_database_dir_holds_the_log_and_a_spent_budget_measures_nothing(tmp_path):
    db = tmp_path / "db"
    first = run("--wkl", "matmul-64", "--n-trials", "4", "--per-round", "4", "--database", str(db),
                "--cost-model", "random")
    assert first.returncode == 0, first.stderr[-2000:]
    assert len(_steps_of(db / "matmul-64.json")) == 4  # the log defaults to DIR/<workload>.json
    other = tmp_path / "other.json"
    second = run("--wkl", "matmul-64", "--n-trials", "4", "--database", str(db), "--log-file", str(other))
    assert second.returncode == 0, second.stderr[-2000:]
    assert "(4 resumed)" in second.stdout and "Best program:" in second.stdout
    assert not other.exists() or _steps_of(other) == []
