#!/usr/bin/env python
"""Inject every fault the measurement stack claims to survive, for real, and print one table (not a test).

Each row is one fault: whether the run survived it (the faulty part failed as it should and nothing else
did), how many finished measurements did not reach the log or were not resumed ("records lost"), and how
many healthy trials the fault cost ("trials wasted": healthy candidates without a valid result, states
measured twice after a resume). The last line reads ``N of M faults survived, K records lost``; the exit
status is 0 only when every fault was survived and no record was lost.

Faults: a hanging kernel, a segfaulting kernel, a hanging build, a memory-hungry build, a killed build
worker, a killed runner, a lost node (``ray.cluster_utils.Cluster``), the tuner SIGKILLed mid-round then
``--resume``, the local Ray killed under the tuner then ``--resume``, corrupt and hostile log lines read
by ``--resume``, and two tuners started on one log (the second must be refused). It takes a few minutes;
run it on a quiet machine (``nice`` is fine).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import psutil

from fault_programs import big_copy, crashing, endless  # scripts/bench/, next to this script

ROOT = Path(__file__).resolve().parents[2]
TUNE_TEST = ROOT / "scripts" / "tune_test.py"


@dataclass
class Row:
    fault: str
    survived: bool
    lost: int
    wasted: int
    note: str


# ------------------------------------------------------------------------------------------ faulty programs
def healthy(n: int) -> list:
    """``n`` distinct, valid matmul-128 tilings (each takes ~0.3 s to time with ``min_repeat_ms=100``)."""
    from ansor.measure import MeasureInput
    from ansor.task.search_task import SearchTask
    task = SearchTask.from_workload("matmul-128")
    out = []
    for f in [2, 4, 8, 16, 32, 64, 128][:n]:
        s = task.compute_dag.init_state()
        s.split(0, 0, [f])
        s.annotate(0, 0, "parallel")
        out.append(MeasureInput(task, s))
    return out


def faulty(func, unroll: bool = False):
    from ansor.measure import MeasureInput
    from ansor.task.search_task import SearchTask
    task = SearchTask(func)
    state = task.compute_dag.init_state()
    if unroll:
        state.annotate(0, 0, "unroll")
    return MeasureInput(task, state)


# ------------------------------------------------------------------------------------------ measurer faults
def measure_with_fault(name: str, tmp: Path, bad, expect: Optional[str], measurer_args: dict,
                       during: Optional[Callable[[threading.Event], None]] = None) -> Row:
    """Measure [bad, 3 healthy] with a log; ``expect``: the error the bad candidate must get (None: ok).

    ``during(first_result)`` runs in a thread meanwhile (to kill a process once the batch is under way).
    """
    from ansor.measure import ErrorNo, ProgramMeasurer
    from ansor.log.records import RecordWriter, load_records

    log = tmp / f"{name.replace(' ', '_')}.json"
    seen = []
    first = threading.Event()
    thread = threading.Thread(target=during, args=(first,), daemon=True) if during else None
    if thread:
        thread.start()
    inputs = ([bad] if bad is not None else []) + healthy(3)

    def record(inps, results):
        seen.extend(results)
        first.set()

    with RecordWriter(log) as writer, ProgramMeasurer(callbacks=[writer.write, record], **measurer_args) as m:
        results = m.measure(inputs)
    if thread:
        thread.join(60)
    logged = len(load_records(log)) if log.exists() else 0
    good = results[1:] if bad is not None else results
    wasted = sum(not r.ok for r in good)
    ok_bad = True
    note = ""
    if bad is not None:
        got = ErrorNo(results[0].error_no).name
        ok_bad = (results[0].ok if expect is None else got == expect)
        first_line = results[0].error_msg.strip().splitlines()[0][:90] if results[0].error_msg.strip() else ""
        note = f"faulty candidate: {got} {first_line}"
    failed = [r for r in good if not r.ok]
    if failed:
        note += f" healthy candidate failed: {ErrorNo(failed[0].error_no).name} {failed[0].error_msg[:150]}"
    return Row(name, ok_bad and wasted == 0, len(seen) - logged, wasted, note)


def kill_process_titled(title: str, killed: list) -> Callable[[threading.Event], None]:
    """A ``during`` hook: after the first result, SIGKILL the first process whose title starts with ``title``."""
    def hook(first: threading.Event) -> None:
        first.wait(300)
        deadline = time.monotonic() + 30
        while not killed and time.monotonic() < deadline:
            for p in psutil.process_iter(["cmdline"]):
                if " ".join(p.info["cmdline"] or []).startswith(title):
                    p.kill()
                    killed.append(p.pid)
                    break
            time.sleep(0.005)
    return hook


def measurer_faults(tmp: Path) -> list[Row]:
    from ansor.measure.ray_session import RaySession
    session = RaySession.open()  # one local Ray for all these measurers (each would start its own)
    try:
        return _measurer_faults(tmp)
    finally:
        session.close()


def _measurer_faults(tmp: Path) -> list[Row]:
    fast = {"build_timeout": 4.0, "run_timeout": 3.0, "reference_timeout": 3.0, "min_repeat_ms": 100}
    rows = [
        measure_with_fault("hanging kernel", tmp, faulty(endless), "RUN_TIMEOUT", fast),
        measure_with_fault("segfaulting kernel", tmp, faulty(crashing), "RUNTIME_DEVICE", fast),
        measure_with_fault("hanging build", tmp, faulty(big_copy, unroll=True), "BUILD_TIMEOUT", fast),
        measure_with_fault("memory-hungry build", tmp, faulty(big_copy, unroll=True), "COMPILE_HOST",
                           {**fast, "build_timeout": 120.0, "build_memory_gib": 0.75}),
    ]
    killed: list = []
    # Builds of matmul-128 are short: kill the worker of the first build seen after the batch started.
    row = measure_with_fault("killed build worker", tmp, None, None,
                             {**fast, "slow_factor": float("inf")},
                             during=_kill_first_build(killed))
    row.survived = row.survived and bool(killed)
    row.note = f"killed {len(killed)} build worker(s){row.note}"
    rows.append(row)
    killed = []
    row = measure_with_fault("killed runner", tmp, None, None, {**fast, "slow_factor": float("inf")},
                             during=kill_process_titled("ray::Runner.run", killed))
    row.survived = row.survived and bool(killed)
    row.note = f"killed {len(killed)} runner(s) mid-run{row.note}"
    rows.append(row)
    return rows


def _kill_first_build(killed: list) -> Callable[[threading.Event], None]:
    def hook(_: threading.Event) -> None:
        deadline = time.monotonic() + 120
        while not killed and time.monotonic() < deadline:
            for p in psutil.process_iter(["cmdline"]):
                if " ".join(p.info["cmdline"] or []).startswith("ray::_build_remote"):
                    p.kill()
                    killed.append(p.pid)
                    break
            time.sleep(0.002)
    return hook


def lost_node(tmp: Path) -> Row:
    import ray
    from ray.cluster_utils import Cluster

    from ansor.measure import ErrorNo, ProgramMeasurer
    from ansor.measure.ray_session import loopback_only
    from ansor.log.records import RecordWriter, load_records

    log = tmp / "lost_node.json"
    seen = []
    with loopback_only():
        cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False,
                                                                 "object_store_memory": 100 * 2 ** 20})
        worker = cluster.add_node(num_cpus=1, object_store_memory=100 * 2 ** 20)
        cluster.wait_for_nodes()
        try:
            def remove_after_two(inps, results):
                seen.extend(results)
                if len(seen) == 2:
                    cluster.remove_node(worker)

            with RecordWriter(log) as writer, \
                    ProgramMeasurer(cluster.address, min_repeat_ms=100, slow_factor=float("inf"),
                                    callbacks=[writer.write, remove_after_two]) as m:
                results = m.measure(healthy(7))
                after = m.measure(healthy(2))
        finally:
            if ray.is_initialized():
                ray.shutdown()
            cluster.shutdown()
    blamed = [r for r in results + after if not r.ok and r.error_no != ErrorNo.INFRA_ERROR]
    logged = len(load_records(log))
    wasted = sum(not r.ok for r in results + after)
    return Row("lost node", not blamed and all(r.ok for r in after), len(seen) - logged, wasted,
               f"{sum(r.retriable for r in results)} INFRA_ERROR, {len(blamed)} blamed on the candidate")


# ----------------------------------------------------------------------------------------- tuner processes
def user_env() -> dict:
    return {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}


def tune(log: Path, *extra: str, trials: int = 16, seed: int = 0, **popen) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(TUNE_TEST), "--wkl", "matmul-128", "--n-trials", str(trials),
                             "--per-round", "8", "--cost-model", "random", "--seed", str(seed), "--log-file",
                             str(log), *extra], env=user_env(), cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **popen)


def steps_in(log: Path) -> list[str]:
    """The step lists of every complete record line (a torn last line is not a measurement)."""
    if not log.exists():
        return []
    text = log.read_text(errors="replace")
    out = []
    for line in text[: text.rfind("\n") + 1].splitlines():
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if isinstance(obj, dict) and "i" in obj:
            out.append(json.dumps(obj["i"][1][1]))
    return out


def wait_for_records(proc: subprocess.Popen, log: Path, n: int, timeout: float = 300) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        if len(steps_in(log)) >= n:
            return True
        time.sleep(0.1)
    return False


def resume_and_count(log: Path, before: list[str], trials: int) -> tuple[bool, int, int, str]:
    """Resume to ``trials``; (exit 0, records lost, states measured twice, note)."""
    proc = tune(log, "--resume", trials=trials)
    out, err = proc.communicate(timeout=600)
    after = steps_in(log)
    lost = sum(1 for s in set(before) if s not in set(after))
    twice = len(after) - len(set(after))
    note = "" if proc.returncode == 0 else err.strip().splitlines()[-1][:120] if err.strip() else "failed"
    return proc.returncode == 0, lost, twice, note


def sigkill_tuner(tmp: Path) -> Row:
    log = tmp / "sigkill.json"
    proc = tune(log, trials=64, start_new_session=True)
    caught = wait_for_records(proc, log, 10)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    before = steps_in(log)
    ok, lost, twice, note = resume_and_count(log, before, len(before) + 8)
    return Row("SIGKILL of the tuner mid-round, then --resume", caught and ok and lost == 0 and twice == 0, lost,
               twice, note or f"{len(before)} records before the kill")


def ray_killed(tmp: Path) -> Row:
    log = tmp / "ray_killed.json"
    proc = tune(log, trials=64)
    caught = wait_for_records(proc, log, 10)
    raylets = [p for p in psutil.Process(proc.pid).children(recursive=True) if p.name() == "raylet"]
    for p in raylets:
        p.kill()
    try:
        _, err = proc.communicate(timeout=180)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
        return Row("local Ray killed under the tuner, then --resume", False, 0, 0, "the tuner hung")
    before = steps_in(log)
    ok, lost, twice, note = resume_and_count(log, before, len(before) + 8)
    last = err.strip().splitlines()[-1][:100] if err.strip() else f"exit {proc.returncode}"
    return Row("local Ray killed under the tuner, then --resume", caught and bool(raylets) and ok and lost == 0
               and twice == 0, lost, twice, note or f"tuner ended: {last}")


HOSTILE_LINES = [
    '{"i": [["matmul-128", "{}", [2',                      # torn line
    "\x00\xff\xfe garbage \x01",                            # binary noise
    "[1, 2, 3]",                                            # JSON, not an object
    '{"v": "ansor-0.1", "i": "not a list", "r": 5}',         # wrong shape
    '{"i": [["matmul-128", "x", [1e999]], [[], []]], "r": [[1e999], 0, 0, 0], "v": "ansor-0.1"}',
    "[" * 100000 + "]" * 100000,                            # nesting that blows a recursive parser's stack
    '{"workload": "evil", "prim_func": "{\\"root\\": 1, \\"nodes\\": [{\\"type_key\\": \\"runtime.PackedFunc\\"}]}", '
    '"desc": "", "v": "ansor-0.1"}',
    '{"i": [["matmul-128", "T", [2, 32, 64, 0, 0, 0, 0, 0]], [[], [["SP", 99, 99, 128, [4], 1]]]], '
    '"r": [[0.001], 0, 0.1, 0.0], "v": "ansor-0.1"}',         # steps that do not fit the program
    '{"pad": "' + "x" * 5_000_000 + '"}',                    # a 5 MB line
]


def hostile_log(tmp: Path) -> Row:
    log = tmp / "hostile.json"
    first = tune(log, trials=8)
    first.communicate(timeout=600)
    good = steps_in(log)
    target = json.loads(log.read_text().splitlines()[-1])["i"][0][1]
    with open(log, "a", encoding="utf-8", errors="surrogateescape") as f:
        for line in HOSTILE_LINES:
            f.write(line.replace('"T"', json.dumps(target)) + "\n")
    proc = tune(log, "--resume", trials=len(good) + 4)
    out, err = proc.communicate(timeout=600)
    resumed = 0
    for line in out.splitlines():
        if "resumed)" in line:
            resumed = int(line.split("(")[1].split()[0])
    lost = max(0, len(good) - resumed)
    note = (err.strip().splitlines()[-1][:120] if proc.returncode and err.strip()
            else f"{resumed} of {len(good)} good records resumed past {len(HOSTILE_LINES)} bad lines")
    return Row("corrupt and hostile log lines, then --resume", proc.returncode == 0 and lost == 0, lost, 0, note)


def two_tuners_one_log(tmp: Path) -> Row:
    """Two tuners started on one log at once: one writes it, the other is refused with one line (exit 2)
    before it measures anything; every record of the one that ran is in the log, no line is torn."""
    from ansor.log.records import load_records
    log = tmp / "shared.json"
    procs = [tune(log, trials=8, seed=seed) for seed in (1, 2)]
    errs = [p.communicate(timeout=600)[1] for p in procs]
    codes = sorted(p.returncode for p in procs)
    refusal = [e.strip().splitlines()[-1] for p, e in zip(procs, errs) if p.returncode == 2 and e.strip()]
    lines = log.read_text().splitlines() if log.exists() else []
    broken = 0
    for line in lines:
        try:
            json.loads(line)
        except ValueError:
            broken += 1
    handler = _WarningCounter()
    logging.getLogger("ansor").addHandler(handler)
    try:
        records = load_records(log)
    finally:
        logging.getLogger("ansor").removeHandler(handler)
    refused = codes == [0, 2] and bool(refusal) and "being written by another tuner" in refusal[0]
    expected = 8 if refused else 16  # both may also run one after the other (the first done before the second)
    lost = max(0, expected - len(records))
    twice = len(records) - len({json.dumps([str(s) for s in r.steps]) for r in records})
    ok = codes in ([0, 2], [0, 0]) and broken == 0 and handler.count == 0 and lost == 0
    note = (f"{len(records)} records, {broken} broken lines, {handler.count} warnings on load; "
            + (f"the second: {refusal[0][:90]}" if refused else f"exit codes {codes}"))
    return Row("two tuners on one log", ok, lost, twice, note)


class _WarningCounter(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.count += 1


# ------------------------------------------------------------------------------------------------ report
#: Each group of faults in the order they run, with the words that select it with --only.
_GROUPS = ((("kernel", "build", "worker", "runner"), measurer_faults), (("node",), lost_node),
           (("SIGKILL",), sigkill_tuner), (("Ray",), ray_killed), (("hostile", "corrupt"), hostile_log),
           (("two",), two_tuners_one_log))
_GROUP_WORDS = tuple(w for words, _ in _GROUPS for w in words)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", default=None, metavar="WORD", choices=_GROUP_WORDS,
                        help="run only the groups of faults named by these words: " + ", ".join(_GROUP_WORDS))
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    os.environ.pop("RAY_ADDRESS", None)
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="ansor-faults-") as tmp:
        for words, run in _GROUPS:
            if args.only and not set(words) & set(args.only):
                continue
            t0 = time.time()
            try:
                got = run(Path(tmp))
            except Exception as err:  # a fault that takes the harness down is not survived
                got = Row(run.__name__.replace("_", " "), False, 0, 0, f"{type(err).__name__}: {err}"[:120])
            rows.extend(got if isinstance(got, list) else [got])
            print(f"... {run.__name__} done in {time.time() - t0:.0f} s", file=sys.stderr, flush=True)
    width = max(len(r.fault) for r in rows)
    print(f"{'fault':<{width}} | survived | records lost | trials wasted | note")
    print(f"{'-' * width}-+----------+--------------+---------------+-----")
    for r in rows:
        print(f"{r.fault:<{width}} | {'yes' if r.survived else 'no':<8} | {r.lost:>12} | {r.wasted:>13} | {r.note}")
    survived = sum(r.survived for r in rows)
    lost = sum(r.lost for r in rows)
    print(f"{survived} of {len(rows)} faults survived, {lost} records lost")
    return 0 if survived == len(rows) and lost == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
