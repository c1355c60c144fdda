"""scripts/bench/bench_ranking.py: the shipped model's ranking of a held-out log, beside a model trained on other
logs alone, with the repeats' agreement; its refusals are one ``error:`` line and exit status 2."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "bench" / "bench_ranking.py"
#: Records of two ViT-B/16 tasks, 96 each, measured on AVX-512: one task's records train, the other's are ranked.
LOG = ROOT / "tests" / "data" / "held_out_vit.json"


def split_by_task(tmp_path: Path) -> list[Path]:
    """The log as one file per task (each with its workload line): a training log and a held-out one."""
    lines: dict[str, list[str]] = {}
    for line in LOG.read_text().splitlines():
        obj = json.loads(line)
        lines.setdefault(obj.get("workload") or obj["i"][0][0], []).append(line)
    paths = []
    for k, (_, task_lines) in enumerate(sorted(lines.items())):
        paths.append(tmp_path / f"task{k}.json")
        paths[-1].write_text("\n".join(task_lines) + "\n")
    return paths


def test_shipped_and_trained_models_rank_a_held_out_log(tmp_path):
    train, held_out = split_by_task(tmp_path)
    proc = subprocess.run([sys.executable, str(SCRIPT), str(held_out), "--train", str(train)], capture_output=True,
                          text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {}
    for line in proc.stdout.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 9 and cells[1] == held_out.name:
            rows[cells[0]] = cells
    trained = "trained on 96 programs (state, pack-sum-rank)"
    assert set(rows) == {"shipped", trained}, proc.stdout
    for cells in rows.values():
        assert cells[3:5] == ["96", "1"]  # programs, tasks
        assert all(0 <= float(c) <= 1 for c in cells[5:])
    # The repeats' agreement is the log's, whichever model ranks it (an AVX-512 log: its records have 1-3 runs).
    assert rows["shipped"][8] == rows[trained][8]
    assert re.search(rf"^\| {re.escape(trained)} \| {held_out.name} \|( [\d.]+ \(\d+\) \|){{4}}$", proc.stdout, re.M)


@pytest.fixture(scope="module")
def refusals(run_main_per_case, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ranking")
    train, held_out = split_by_task(tmp)
    cases = [[str(tmp / "missing.json")], [str(held_out), "--train", str(held_out), str(train)],
             [str(held_out), "--train", str(train), "--features", "nosuch"]]
    return run_main_per_case(SCRIPT, cases, tmp)


@pytest.mark.parametrize("case, needle", [(0, "no such log: "), (1, "a held-out log is also a training log"),
                                          (2, "invalid choice: 'nosuch'")])
def test_bad_input_is_one_line_and_exit_2(refusals, case, needle):
    code, stderr = refusals[case]
    errors = [line for line in stderr.splitlines() if "error:" in line]
    assert code == 2 and len(errors) == 1 and needle in errors[0], stderr
