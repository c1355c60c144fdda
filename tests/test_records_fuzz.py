"""Fuzzing the log reader: 1,200 mutated copies of a real log through load, resume and evaluation.

The base logs are written by RecordWriter from real states (sketches of matmul-64, hand-made states of
matmul-32, the default schedules of tiny-cnn's tasks). Each copy gets one to three seeded mutations: byte
flips, truncation, deep nesting, huge and non-finite numbers, values of the wrong type, node graphs with
cycles, forward references, deep chains or forbidden types, bad costs, duplicated, dropped and reordered
lines, junk bytes, overlong lines. Whatever happens, loading returns (no exception), every warning names
the file and line, and every record line that survived untouched (with its workload line) still loads.
"""

import json
import logging
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ansor.log import records as records_module
from ansor.cost_model import RandomModel
from ansor.log.measurement import MAX_COST, ErrorNo, MeasureInput, MeasureResult
from ansor.log.records import RecordWriter, load_records
from ansor.task.search_task import SearchTask
from ansor.sketch.policy import SketchPolicy
from ansor.tuning import TuningOptions, auto_schedule, feed_history

ROOT = Path(__file__).resolve().parents[1]
SEED = 16
N_LOGS = 1200
LINE_LIMIT = 64 * 1024  # MAX_LINE_BYTES during the fuzz, so an overlong line costs little to build


# ------------------------------------------------------------------------------------------- base logs
def _ok(cost: float, checked: bool = True) -> MeasureResult:
    return MeasureResult((cost, cost * 1.05), ErrorNo.NO_ERROR, all_cost=0.4, timestamp=1.7e9, checked=checked)


@pytest.fixture(scope="module")
def tasks():
    return {"matmul-64": SearchTask.from_workload("matmul-64"), "matmul-32": SearchTask.from_workload("matmul-32")}


@pytest.fixture(scope="module")
def base_log(tmp_path_factory, tasks) -> list[bytes]:
    """A real log: 6 sketch states of matmul-64 (one failed, one unchecked) and 2 states of matmul-32."""
    big, small = tasks["matmul-64"], tasks["matmul-32"]
    states = SketchPolicy(big, RandomModel(seed=0), seed=0).next_batch(6)
    assert len(states) == 6
    smalls = []
    for f in (4, 8):
        s = small.compute_dag.init_state()
        s.split(0, 0, [f])
        s.annotate(0, 0, "parallel")
        smalls.append(s)
    path = tmp_path_factory.mktemp("fuzz") / "base.json"
    results = [_ok(1e-4 * (i + 1)) for i in range(6)]
    results[2] = MeasureResult((MAX_COST,), ErrorNo.RUNTIME_DEVICE, all_cost=0.4, timestamp=1.7e9)
    results[4] = _ok(5e-5, checked=False)
    with RecordWriter(path) as writer:
        writer.write([MeasureInput(big, s) for s in states[:4]], results[:4])
        writer.write([MeasureInput(small, s) for s in smalls], [_ok(2e-5), _ok(3e-5)])
        writer.write([MeasureInput(big, s) for s in states[4:]], results[4:])
    lines = path.read_bytes().splitlines(keepends=True)
    assert len(lines) == 10 and len(load_records(path)) == 8
    return lines


# ------------------------------------------------------------------------------------------- mutations
_NUMBER = re.compile(rb"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")
_HUGE = [b"1e999", b"-1e999", b"9" * 400, b"NaN", b"Infinity", b"-Infinity", b"2e308", b"9223372036854775808",
         b"-1", b"0", b"1e-400", b"-0.0", b"4.0", b"true", b'"7"', b"null"]
_WRONG = ["44", [1, [2]], {"a": 1}, True, False, None, 1.5, "", [], -7, 2 ** 70, "parallel", [None], float("nan")]


def _record_lines(lines: list[bytes]) -> list[int]:
    return [i for i, line in enumerate(lines) if line.startswith(b'{"i"')] or [0]


def _workload_lines(lines: list[bytes]) -> list[int]:
    return [i for i, line in enumerate(lines) if line.startswith(b'{"workload"')] or [0]


def flip_bytes(rng, lines):
    data = bytearray(b"".join(lines))
    for _ in range(rng.randint(1, 8)):
        data[rng.randrange(len(data))] = rng.randrange(256)
    return bytes(data).splitlines(keepends=True)


def truncate(rng, lines):
    data = b"".join(lines)
    return data[: rng.randrange(len(data))].splitlines(keepends=True)


def deep_nesting(rng, lines):
    opener = rng.choice([b"[", b'{"a":', b'[{"i":', b'{"v":"ansor-0.1","i":['])
    lines.insert(rng.randrange(len(lines) + 1), opener * rng.choice([900, 5000, 100_000]) + b"\n")
    return lines


def huge_number(rng, lines):
    i = rng.choice(_record_lines(lines))
    found = list(_NUMBER.finditer(lines[i]))
    if found:
        m = rng.choice(found)
        lines[i] = lines[i][: m.start()] + rng.choice(_HUGE) + lines[i][m.end():]
    return lines


def _leaves(value, path=()):
    """Paths to every scalar and list inside a parsed line (iterative: an earlier mutation may have nested
    the line deeper than Python's recursion limit)."""
    out, todo = [], [(value, path)]
    while todo:
        value, path = todo.pop()
        if isinstance(value, dict):
            todo.extend((v, path + (k,)) for k, v in value.items())
            continue
        out.append(path)
        if isinstance(value, list):
            todo.extend((v, path + (k,)) for k, v in enumerate(value))
    return out


def wrong_type(rng, lines):
    i = rng.choice(_record_lines(lines) + _workload_lines(lines))
    try:
        obj = json.loads(lines[i])
    except ValueError:
        return lines
    paths = [p for p in _leaves(obj) if p]
    for _ in range(rng.randint(1, 2)):
        path = rng.choice(paths)
        holder = obj
        for k in path[:-1]:
            holder = holder[k]
        try:
            holder[path[-1]] = rng.choice(_WRONG)
        except (TypeError, IndexError, KeyError):
            pass
        paths = [p for p in _leaves(obj) if p]
    lines[i] = json.dumps(obj).encode() + b"\n"
    return lines


def _graph_refs(node):
    data = node.get("data")
    if isinstance(data, list):
        return [("list", k) for k, v in enumerate(data) if isinstance(v, int)]
    if isinstance(data, dict):
        return [("dict", k) for k, v in data.items() if isinstance(v, int) and not isinstance(v, bool)]
    return []


def mutate_graph(rng, lines):
    i = rng.choice(_workload_lines(lines))
    try:
        obj = json.loads(lines[i])
        graph = json.loads(obj["prim_func"])
        nodes = graph["nodes"]
    except (ValueError, KeyError, TypeError):
        return lines
    kind = rng.randrange(8)
    if kind <= 2:  # a reference to the node itself, a later node (a cycle once it points back), or anything
        with_refs = [k for k, n in enumerate(nodes) if isinstance(n, dict) and _graph_refs(n)]
        if with_refs:
            k = rng.choice(with_refs)
            where, slot = rng.choice(_graph_refs(nodes[k]))
            nodes[k]["data"][slot] = [k, rng.randrange(k, len(nodes)), rng.randrange(-5, 3 * len(nodes))][kind]
    elif kind == 3:  # a reference chain far deeper than TVM's loader can recurse
        depth = rng.choice([600, 3000])
        base = len(nodes)
        nodes.append({"type": "ffi.Array", "data": []})
        nodes.extend({"type": "ffi.Array", "data": [base + j]} for j in range(depth))
        graph["root_index"] = len(nodes) - 1
    elif kind == 4:
        graph["root_index"] = rng.choice([-1, len(nodes), "0", None, 2 ** 64, 0])
    elif kind == 5:
        k = rng.randrange(len(nodes))
        nodes[k]["type"] = rng.choice(["ffi.Module", "ir.EnvFunc", "no.SuchType", 7, "ffi.Array", "ffi.Map", "int"])
    elif kind == 6:  # a reference to another earlier node: a type mismatch, or another (valid) program
        with_refs = [k for k, n in enumerate(nodes) if isinstance(n, dict) and _graph_refs(n) and k > 0]
        if with_refs:
            k = rng.choice(with_refs)
            where, slot = rng.choice(_graph_refs(nodes[k]))
            nodes[k]["data"][slot] = rng.randrange(k)
    else:
        del nodes[rng.randrange(len(nodes)):]
    obj["prim_func"] = json.dumps(graph)
    lines[i] = json.dumps(obj).encode() + b"\n"
    return lines


def bad_cost(rng, lines):
    i = rng.choice(_record_lines(lines))
    try:
        obj = json.loads(lines[i])
        slot = rng.randrange(4)
        obj["r"][slot] = rng.choice([[float("nan")], [-1.0], [0.0], [], [float("inf")], ["x"], float("nan"),
                                     -3.0, 99, True, [1e-3] * 20_000])
    except (ValueError, KeyError, TypeError, IndexError):
        return lines
    lines[i] = json.dumps(obj).encode() + b"\n"
    return lines


def duplicate_lines(rng, lines):
    if rng.random() < 0.3:
        return lines + lines
    for _ in range(rng.randint(1, 4)):
        lines.insert(rng.randrange(len(lines) + 1), rng.choice(lines))
    return lines


def drop_or_move(rng, lines):
    line = lines.pop(rng.randrange(len(lines)))
    if rng.random() < 0.5 and line.endswith(b"\n"):
        lines.insert(rng.randrange(len(lines) + 1), line)
    return lines


def junk(rng, lines):
    blob = rng.choice([rng.randbytes(rng.randint(1, 300)), b"\xff\xfe\x00\x00",
                       b"\x00" * 100, b"\xe2\x82", b"{}", b"[]", b'{"v": "ansor-0.1"}', b'{"workload": 1}',
                       b"x" * (LINE_LIMIT + 10)])
    lines.insert(rng.randrange(len(lines) + 1), blob + b"\n")
    return lines


MUTATIONS = [flip_bytes, truncate, deep_nesting, huge_number, wrong_type, mutate_graph, bad_cost, duplicate_lines,
             drop_or_move, junk]


def mutate(rng: random.Random, lines: list[bytes]) -> bytes:
    out = list(lines)
    for _ in range(rng.randint(1, 3)):
        out = rng.choice(MUTATIONS)(rng, out) or [b"\n"]
    return b"".join(out)


# ------------------------------------------------------------------------------------------- checks
@pytest.fixture(scope="module")
def identities(base_log, tmp_path_factory) -> dict[bytes, tuple]:
    """(key, steps, costs) of each base record line, and the key of each workload line."""
    path = tmp_path_factory.mktemp("ids") / "base.json"
    path.write_bytes(b"".join(base_log))
    loaded = iter(load_records(path))
    out = {}
    for line in base_log:
        if line.startswith(b'{"i"'):
            rec = next(loaded)
            out[line.rstrip(b"\n")] = (rec.workload_key, rec.steps, rec.result.costs)
        else:
            out[line.rstrip(b"\n")] = json.loads(line)["workload"]
    return out


def _overwrite(path: Path, data: bytes) -> None:
    """Replace a file's content in place: truncating it first costs ~1 ms a time on a journaling disk."""
    with open(path, "r+b" if path.exists() else "wb") as f:
        f.write(data)
        f.truncate()


def _intact_expectations(identities: dict[bytes, tuple], data: bytes) -> set[tuple]:
    """Identities of the base records whose line, and whose key's workload line, are still intact."""
    present = [identities[line] for line in set(data.split(b"\n")) if line in identities]
    intact_keys = {v for v in present if isinstance(v, str)}
    return {v for v in present if isinstance(v, tuple) and v[0] in intact_keys}


@pytest.mark.slow
def test_mutated_logs_load_resume_and_keep_every_intact_record(tmp_path, base_log, identities, tasks, caplog,
                                                               monkeypatch):
    monkeypatch.setattr(records_module, "MAX_LINE_BYTES", LINE_LIMIT)
    caplog.set_level(logging.WARNING, logger="ansor")
    rng = random.Random(SEED)
    policies = {k: SketchPolicy(t, RandomModel(), seed=0) for k, t in tasks.items()}
    model = RandomModel()
    loaded_total = noticed = 0
    path = tmp_path / "log.json"
    for n in range(N_LOGS):
        data = mutate(rng, base_log)
        _overwrite(path, data)
        caplog.clear()
        recs = load_records(path)
        for message in (r.getMessage() for r in caplog.records if r.name == "ansor"):
            assert re.match(rf"{re.escape(str(path))}:\d+: ", message), (n, message)
        missing = _intact_expectations(identities, data) - {(r.workload_key, r.steps, r.result.costs) for r in recs}
        assert not missing, (n, missing, data[:2000])
        for rec in recs:  # what loads is what the format allows
            assert rec.result.ok == (rec.result.error_no == 0)
            assert all(c > 0 for c in rec.result.costs) or not rec.result.ok
        loaded_total += len(recs)
        noticed += bool(caplog.records)
        if n % 10 == 0:  # resume: the policy and the model learn whatever loaded, unfit steps are left out
            for key, task in tasks.items():
                mine = [r for r in recs if r.workload_key == key]
                history = feed_history(task, mine, policies[key], model)
                assert history.count <= len(mine)
    assert loaded_total > N_LOGS  # the intact records kept loading
    assert noticed > N_LOGS // 2  # and most mutations were noticed


class _Stop(Exception):
    """Raised where the resume path ends and tuning would begin."""


class _StopMeasurer:
    """Stops tuning instead of measuring: the test is about what resume loads, not about timing."""

    def measure(self, inputs):
        raise _Stop


def test_resume_path_on_mutated_logs(tmp_path, base_log, identities, tasks):
    """auto_schedule's own resume (load, filter by target, feed), stopped where the first round would start."""
    rng = random.Random(SEED + 1)
    task = tasks["matmul-64"]
    for n in range(12):
        path = tmp_path / f"resume{n}.json"
        data = mutate(rng, base_log)
        path.write_bytes(data)
        expect = {e for e in _intact_expectations(identities, data) if e[0] == "matmul-64"}
        resumed: list[int] = []

        def stop(count: int) -> None:
            resumed.append(count)
            raise _Stop

        with pytest.raises(_Stop):
            auto_schedule(task, TuningOptions(num_measure_trials=1000), measurer=_StopMeasurer(),
                          model=RandomModel(), resume_from=str(path), on_resume=stop)
        if expect:  # without intact records nothing resumes and the measurer is where it stops
            assert resumed and resumed[0] >= len({e[1] for e in expect})


@pytest.fixture(scope="module")
def network_log(tmp_path_factory) -> list[bytes]:
    """tiny-cnn's default schedules, each written twice, for the host target (evaluate_networks runs them)."""
    from ansor.networks import default_candidates, extract, get_network
    from ansor.target import parse_target

    extraction = extract(get_network("tiny-cnn", 1), parse_target("host"))
    path = tmp_path_factory.mktemp("net") / "tiny-cnn-b1.json"
    with RecordWriter(path) as writer:
        for t in extraction.tasks:
            for state in default_candidates(t.task):
                writer.write([MeasureInput(t.task, state)] * 2, [_ok(2e-4), _ok(1e-4)])
    return path.read_bytes().splitlines(keepends=True)


@pytest.mark.slow
def test_evaluate_networks_on_mutated_logs(tmp_path, network_log):
    """The real script on two mutated network logs in one run: a table, no traceback, no crash."""
    rng = random.Random(SEED + 2)
    logs = []
    for n in range(2):
        log = tmp_path / f"m{n}" / "tiny-cnn-b1.json"
        log.parent.mkdir()
        log.write_bytes(mutate(rng, network_log))
        logs.append(log)
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "evaluate_networks.py"), *map(str, logs),
                           "--repeat", "1", "--target", "host"], capture_output=True, text=True, timeout=300,
                          cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert proc.stdout.count("tiny-cnn") == 2, proc.stdout
