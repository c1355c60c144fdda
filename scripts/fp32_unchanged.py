"""Check: fp32 networks compile to the same machine code as at an earlier commit (``--precision`` defaults
to fp32 and must stay bit for bit what it was; issue 56).

  python scripts/fp32_unchanged.py --base 56b7044                     # built-in networks, two targets
  python scripts/fp32_unchanged.py --base 56b7044 --network mobilenet-v2 \
      --target "llvm -mcpu=znver3 -num-cores=2" --log bench-work/pretrained/mobilenet-v2-cold.json

For each network and target, at this checkout and at ``--base`` (a ``git worktree`` of it, removed after),
one line per fp32 task: its workload key and weight, its sketch count, the keys of 6 programs sampled with
a fixed seed, and a hash of the assembly of its default schedule and of the best record of ``--log`` for it
(LLVM's assembly is deterministic; its IR text is not). Any line that differs is printed, exit 1; the same
lines everywhere mean the same tasks, the same search space and the same code for every tuned record, so no
fp32 latency of those networks can have moved. Nothing is timed; it runs on any machine (the targets are explicit).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any, Mapping

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's ansor, whichever one is installed
DEFAULT_TARGETS = ("llvm -mcpu=znver3 -num-cores=2", "llvm -mcpu=znver5 -num-cores=2")
DEFAULT_NETWORKS = ("resnet-50", "mobilenet-v2", "bert")
SAMPLES = 6


def _digest(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()[:12]


def fingerprints(network: str, target: str, best: Mapping[str, Any]) -> list[str]:
    """One line per fp32 task of ``network`` on ``target`` (see the module docstring); ``best``: the logs'
    best record by workload key."""
    from ansor import codegen
    from ansor.networks.default_schedule import default_state
    from ansor.networks.extract import extract
    from ansor.networks.registry import get_network
    from ansor.sketch.search_space import generate_sketches, sample_initial_population
    from ansor.task import program

    def assembly(task, state) -> str:
        return _digest(codegen.compile(program.schedule(task, state), task.target).mod.inspect_source("asm"))

    lines = []
    for t in extract(get_network(network), target).tasks:
        task = t.task
        sketches = generate_sketches(task)
        sampled = [s.key() for s in sample_initial_population(task, sketches, SAMPLES, random.Random(0))]
        record = best.get(task.workload_key)
        lines.append(f"{target} | {network} {task.workload_key} x{t.weight} sketches={len(sketches)} "
                     f"sampled={_digest(repr(sampled))} default={assembly(task, default_state(task))} "
                     f"best={assembly(task, record.state) if record else '-'}")
    return lines


def _commit(base: str) -> str:
    """The commit ``base`` names in this repository (checked before anything is compiled)."""
    found = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--verify", "--quiet", f"{base}^{{commit}}"],
                           capture_output=True, text=True)
    if found.returncode != 0:
        raise ValueError(f"--base {base}: not a commit of {ROOT}")
    return found.stdout.strip()


def _at_base(commit: str, argv: list[str]) -> list[str]:
    """This script's lines at ``commit``: a copy of it run in a temporary worktree, on that tree's ansor."""
    with tempfile.TemporaryDirectory(prefix="ansor-base-") as tmp:
        tree = Path(tmp) / "tree"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-f", str(tree), commit],
                       capture_output=True, check=True)
        try:
            (tree / "scripts").mkdir(exist_ok=True)
            script = shutil.copy(__file__, tree / "scripts" / "_fp32_unchanged_here.py")
            path = os.pathsep.join(p for p in (str(tree), os.environ.get("PYTHONPATH")) if p)
            run = subprocess.run([sys.executable, script, *argv], cwd=tree, capture_output=True, text=True,
                                 env=dict(os.environ, PYTHONPATH=path))
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], capture_output=True)
            subprocess.run(["git", "-C", str(ROOT), "worktree", "prune"], capture_output=True)
    if run.returncode != 0:
        raise ValueError(f"at {commit[:12]}: {(run.stderr.strip().splitlines() or ['failed'])[-1]}")
    return run.stdout.splitlines()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base", help="commit to compare with (without it: print this checkout's lines)")
    p.add_argument("--network", nargs="+", default=list(DEFAULT_NETWORKS), help="built-in networks")
    p.add_argument("--target", nargs="+", default=list(DEFAULT_TARGETS), help="explicit LLVM targets")
    p.add_argument("--log", nargs="*", default=[], help="tuning logs whose best records are compiled too")
    args = p.parse_args(argv)
    from ansor.errors import AnsorError

    logs = [str(Path(log).resolve()) for log in args.log]
    try:
        commit = _commit(args.base) if args.base else ""
        from ansor.log.records import best_records, load_records

        best = best_records(load_records(logs)) if logs else {}
        lines = [line for target in args.target for network in args.network
                 for line in fingerprints(network, target, best)]
        rest = ["--network", *args.network, "--target", *args.target] + (["--log", *logs] if logs else [])
        base = _at_base(commit, rest) if commit else []
    except (AnsorError, ValueError, OSError, RuntimeError, subprocess.SubprocessError) as err:  # TVM's: RuntimeError
        print(f"error: {err}", file=sys.stderr)
        return 2
    if not commit:
        print("\n".join(lines))
        return 0
    only_base, only_here = Counter(base) - Counter(lines), Counter(lines) - Counter(base)
    for line in sorted(only_base.elements()):
        print("base: " + line)
    for line in sorted(only_here.elements()):
        print("here: " + line)
    changed = sum(only_here.values()) + sum(only_base.values())
    tuned = sum(1 for line in lines if not line.endswith("best=-"))
    print(f"{len(lines)} fp32 tasks ({tuned} with a tuned record): "
          f"{'the same' if not changed else f'{changed} lines differ'} at {args.base} and here")
    return 1 if changed else 0


if __name__ == "__main__":
    sys.exit(main())
