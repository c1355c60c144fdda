"""scripts/fp32_unchanged.py: per-task fingerprints of fp32 programs that tell two programs' machine code apart
and are the same when nothing changed; bad input is one ``error:`` line, exit 2."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # compiles a network's tasks, and runs the script in subprocesses

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "fp32_unchanged.py"
AVX2, AVX512 = "llvm -mcpu=znver3 -num-cores=2", "llvm -mcpu=znver5 -num-cores=2"


def _script():
    spec = importlib.util.spec_from_file_location("fp32_unchanged", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_fingerprints_tell_other_code_apart():
    fingerprints = _script().fingerprints
    avx2 = fingerprints("tiny-cnn", AVX2, {})
    assert len(avx2) == 7 and all(" default=" in line and line.endswith(" best=-") for line in avx2), avx2
    avx512 = fingerprints("tiny-cnn", AVX512, {})
    defaults = lambda lines: [line.split(" default=")[1] for line in lines]  # noqa: E731
    assert sum(a != b for a, b in zip(defaults(avx2), defaults(avx512))) >= 1, (avx2, avx512)


def test_bad_input_is_one_line_and_exit_2():
    for args, says in ((["--network", "no-such-net"], "valid names: resnet-50"),
                       (["--network", "tiny-cnn", "--target", AVX2, "--base", "no-such-commit"], "not a commit")):
        proc = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=300,
                              cwd=ROOT)
        errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
        assert proc.returncode == 2 and len(errors) == 1 and says in errors[0], proc.stderr[-2000:]
        assert "Traceback" not in proc.stderr


def test_against_this_commit_in_a_worktree_that_is_removed_after():
    def worktrees() -> str:
        return subprocess.run(["git", "-C", str(ROOT), "worktree", "list"], capture_output=True, text=True).stdout

    if subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True).returncode != 0:
        pytest.skip("not a git checkout: --base needs the repository's history")
    before = worktrees()
    proc = subprocess.run([sys.executable, str(SCRIPT), "--base", "HEAD", "--network", "tiny-cnn", "--target", AVX2],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode in (0, 1) and "7 fp32 tasks (0 with a tuned record)" in proc.stdout, proc.stderr[-2000:]
    assert worktrees() == before
    clean = not subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--", "ansor"],
                               capture_output=True, text=True).stdout.strip()
    if clean:  # this checkout's ansor is HEAD's: another process must give the same lines (assembly, not IR text)
        assert proc.returncode == 0 and "the same at HEAD and here" in proc.stdout, proc.stdout[-3000:]
