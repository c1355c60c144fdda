"""docs/tutorial.md runs end to end: its Python blocks, in order, with 4 trials per tuning call.

The blocks are joined into one script and run as a user would run it (a fresh process, a local Ray);
the block that starts with ``# fresh process`` runs afterwards in its own process, without ansor on the
path, against the model the tutorial exported.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TUTORIAL = ROOT / "docs" / "tutorial.md"
FRESH = "# fresh process"


def blocks() -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", TUTORIAL.read_text(), re.S | re.M)


def test_tutorial_has_every_part():
    code = "\n".join(blocks())
    for call in ("ansor.tune(", "ansor.apply_best(", "ansor.print_best(", "ansor.tune_task(task, options",
                 "ansor.relax.extract_tasks(", "ansor.relax.tune_relax(", "ansor.relax.compile_relax(",
                 "ansor.relax.export(", "ansor.Database(", ".distill("):
        assert call in code, call
    assert sum(b.startswith(FRESH) for b in blocks()) == 1


@pytest.mark.slow
def test_tutorial_runs_end_to_end(tmp_path):
    main = [b for b in blocks() if not b.startswith(FRESH)]
    fresh = [b for b in blocks() if b.startswith(FRESH)]
    script = tmp_path / "tutorial.py"
    script.write_text("\n\n".join(main))
    env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "TUTORIAL_TRIALS": "4",
           "TUTORIAL_DIR": str(tmp_path / "work"), "PYTHONPATH": str(ROOT)}
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert re.search(r"best \d+\.\d+ ms \(\d+\.\d GFLOPS\) after 4 trials", proc.stdout), proc.stdout
    assert "4 new, 4 from the log" in proc.stdout
    assert "1 task from the database" in proc.stdout

    no_ansor = {k: v for k, v in env.items() if k != "PYTHONPATH"}
    child = fresh[0] + "\nimport sys\nassert 'ansor' not in sys.modules\n"
    run = subprocess.run([sys.executable, "-c", child], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                         env={**no_ansor, "MODEL_DIR": str(tmp_path / "work" / "deploy")})
    assert run.returncode == 0, run.stderr[-3000:]
    assert "without ansor" in run.stdout
