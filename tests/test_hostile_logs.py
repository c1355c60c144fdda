"""Hostile logs and model files: every bad field is one warning with its reason, never a crash or a hang.

Each case edits one line of a real log (matmul-64 states written by RecordWriter). The node graphs that
kill TVM's own loader (reference cycles, chains thousands deep) and the files that never end (/dev/zero,
a FIFO) are also read in a fresh interpreter, to show the process survives and returns.
"""

import json
import logging
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from ansor.log import records as records_module
from ansor.log import tvm_json
from ansor.cost_model import CostModelError, load_model
from ansor.errors import RecordError
from ansor.log.measurement import ErrorNo, MeasureInput, MeasureResult
from ansor.log.records import RecordWriter, load_records
from ansor.task.search_task import SearchTask


@pytest.fixture(scope="module")
def task():
    return SearchTask.from_workload("matmul-64")


@pytest.fixture(scope="module")
def log_lines(task, tmp_path_factory) -> list[str]:
    """A workload line and three records; the second record (line 3) is the one the cases edit."""
    path = tmp_path_factory.mktemp("base") / "base.json"
    with RecordWriter(path) as writer:
        for i, (outer, inner) in enumerate([(4, 2), (8, 8), (16, 4)]):
            s = task.compute_dag.init_state()
            s.split(0, 0, [outer])
            s.split(0, 2, [inner])
            s.annotate(0, 0, "parallel")
            writer.write([MeasureInput(task, s)], [MeasureResult((1e-3 * (i + 1),) * 2, ErrorNo.NO_ERROR)])
    lines = path.read_text().splitlines()
    assert '["SP", 0, 0, 64, [8], 1]' in lines[2] and '"parallel"' in lines[2]
    return lines


def warnings_of(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "ansor" and r.levelno == logging.WARNING]


def edit(field: str, value):
    """An edit that sets one field of the record object (``r.0`` is the costs, ``i.0.2`` the hardware)."""
    def apply(text: str) -> str:
        obj = json.loads(text)
        holder, keys = obj, [int(k) if k.isdigit() else k for k in field.split(".")]
        for k in keys[:-1]:
            holder = holder[k]
        holder[keys[-1]] = value
        return json.dumps(obj)
    return apply


def replace(old: str, new: str):
    def apply(text: str) -> str:
        assert old in text
        return text.replace(old, new, 1)
    return apply


RECORD_CASES = {
    "int field 1e999": (replace('"SP", 0, 0, 64, [8], 1]', '"SP", 0, 0, 1e999, [8], 1]'), "bad field extent=inf"),
    "int field as float": (replace('"SP", 0, 0, 64, [8]', '"SP", 0.0, 0, 64, [8]'), "bad field stage_id=0.0"),
    "int field as bool": (replace('"SP", 0, 0, 64, [8]', '"SP", true, 0, 64, [8]'), "bad field stage_id=True"),
    "int field as string": (replace('"SP", 0, 0, 64, [8]', '"SP", "0", 0, 64, [8]'), "bad field stage_id='0'"),
    "lengths as string": (replace("64, [8], 1]", '64, "44", 1]'), "bad field lengths='44'"),
    "lengths with a float": (replace("64, [8], 1]", "64, [8.0], 1]"), "bad field lengths=[8.0]"),
    "tag as list": (replace('["SP", 0, 0, 64, [8]', '[["SP"], 0, 0, 64, [8]'), "not a transform step"),
    "unknown annotation": (replace('"parallel"', '"sideways"'), "unknown annotation 'sideways'"),
    "NaN cost": (replace('"r": [[', '"r": [[NaN, '), "finite numbers >= 0"),
    "infinite cost": (edit("r.0", [float("inf")]), "finite numbers >= 0"),
    "negative cost": (edit("r.0", [-1e-3]), "finite numbers >= 0"),
    "zero cost of a valid record": (edit("r.0", [0.0]), "a valid record (error_no 0) needs costs > 0"),
    "no cost": (edit("r.0", []), "costs must be a list of 1 to"),
    "400-digit cost": (replace('"r": [[', '"r": [[' + "9" * 400 + ", "), "finite numbers >= 0"),
    "unknown error code": (edit("r.1", 99), "error_no 99 is not an Ansor error code"),
    "error code as bool": (edit("r.1", False), "error_no False is not an Ansor error code"),
    "infinite all_cost": (edit("r.2", float("inf")), "all_cost and timestamp"),
    "negative timestamp": (edit("r.3", -5.0), "all_cost and timestamp"),
    "hardware as strings": (edit("i.0.2", ["2", 32]), "hardware parameters"),
    "zero cores": (edit("i.0.2", [0, 32, 64]), "hardware parameters"),
    "huge hardware value": (edit("i.0.2", [2, 32, 2 ** 40]), "hardware parameters"),
    "steps not a list": (edit("i.1.1", "SP"), "steps must be a list"),
    "unchecked 2": (edit("unchecked", 2), "unchecked must be 0 or 1"),
    "node not a string": (edit("node", 5), "node must be a string"),
    "target not JSON": (edit("i.0.1", 'llvm -mcpu="'), "target"),
    "target too long": (edit("i.0.1", "x" * 5000), "the target must be a string of 1 to 4096"),
    "deep nesting": (lambda text: "[" * 100_000, "nested too deeply"),
    "deep nesting of objects": (lambda text: '{"a":' * 100_000, "nested too deeply"),
    "another version": (edit("v", "ansor-9"), "version 'ansor-9', expected 'ansor-0.1'"),
    "a list, not an object": (lambda text: "[1, 2]", "a JSON list, not an object"),
    "invalid UTF-8": (lambda text: "\udcff", "not JSON"),
}


@pytest.mark.parametrize("case", RECORD_CASES, ids=list(RECORD_CASES))
def test_bad_record_field_is_one_warning_with_its_reason(case, tmp_path, log_lines, caplog):
    change, reason = RECORD_CASES[case]
    lines = list(log_lines)
    lines[2] = change(lines[2])
    path = tmp_path / "log.json"
    path.write_bytes(("\n".join(lines) + "\n").encode("utf-8", "surrogateescape"))
    with caplog.at_level(logging.WARNING, logger="ansor"):
        records = load_records(path)
    assert [r.result.costs[0] for r in records] == [1e-3, 3e-3]
    (message,) = warnings_of(caplog)
    assert message.startswith(f"{path}:3: skipped corrupt record (") and reason in message, message


def _graph_edit(change):
    def apply(text: str) -> str:
        obj = json.loads(text)
        graph = json.loads(obj["prim_func"])
        obj["prim_func"] = json.dumps(change(graph)) if callable(change) else change
        return json.dumps(obj)
    return apply


def _set_ref(graph, to):
    """Point the first reference of an ``ffi.Array`` node at ``to(index of that node)``."""
    k = next(k for k, n in enumerate(graph["nodes"]) if n["type"] == "ffi.Array" and n["data"])
    graph["nodes"][k]["data"][0] = to(k)
    return graph


def _set_field(graph, kind, field, value):
    node = next(n for n in graph["nodes"] if n["type"] == kind)
    node["data"][field] = value
    return graph


def _chain(graph, depth):
    base = len(graph["nodes"])
    graph["nodes"] += [{"type": "ffi.Array", "data": []}] + [{"type": "ffi.Array", "data": [base + j]}
                                                             for j in range(depth)]
    graph["root_index"] = len(graph["nodes"]) - 1
    return graph


GRAPH_CASES = {
    "self reference": (lambda g: _set_ref(g, lambda k: k), "refers to"),
    "cycle through a later node": (lambda g: _set_ref(g, lambda k: len(g["nodes"]) - 1), "not an earlier node"),
    "reference out of range": (lambda g: _set_ref(g, lambda k: 10 ** 6), "refers to 1000000"),
    "chain 10,000 deep": (lambda g: _chain(g, 10_000), "references deep, more than the 500 accepted"),
    "None in an array": (lambda g: _set_ref(g, lambda k: 0), "holds None where a value is required"),
    "None as a loop body": (lambda g: _set_field(g, "tirx.For", "body", 0), "holds None where a value is required"),
    "root out of range": (lambda g: {**g, "root_index": len(g["nodes"])}, "is not a node"),
    "a module node": (lambda g: {**g, "nodes": g["nodes"] + [{"type": "ffi.Module", "data": "x"}]},
                      "ffi.Module, which a program never holds"),
    "unknown node type": (lambda g: {**g, "nodes": g["nodes"][:-1] + [{"type": "no.Such", "data": {}}]},
                          "unknown type 'no.Such'"),
    "object field nested": (lambda g: {**g, "nodes": g["nodes"][:-1] + [{"type": "ir.IntImm",
                                                                          "data": {"value": [[1]]}}]},
                            "needs an object of field values"),
    "not a PrimFunc": (lambda g: {"root_index": 1, "nodes": [{"type": "None"}, {"type": "int", "data": 3}]},
                       "holds a int, not a PrimFunc"),
    "nested 100,000 deep": ("[" * 100_000, "nested too deeply"),
    "not JSON": ("{nodes", "not JSON"),
}


@pytest.mark.parametrize("case", GRAPH_CASES, ids=list(GRAPH_CASES))
def test_unsafe_prim_func_graph_never_reaches_tvm(case, tmp_path, log_lines, caplog):
    change, reason = GRAPH_CASES[case]
    lines = list(log_lines)
    lines[0] = _graph_edit(change)(lines[0])
    path = tmp_path / "log.json"
    path.write_text("\n".join(lines) + "\n")
    with caplog.at_level(logging.WARNING, logger="ansor"):
        assert load_records(path) == []
    messages = warnings_of(caplog)
    assert messages[0].startswith(f"{path}:1: skipped corrupt record (workload 'matmul-64': cannot load prim_func (")
    assert reason in messages[0], messages[0]
    assert messages[1:] == [f"{path}:{n}: skipped corrupt record (no usable workload line for 'matmul-64' in this "
                            "file)" for n in (2, 3, 4)]


def test_unnamed_workload_must_be_the_program_its_key_hashes(tmp_path, caplog):
    """A flipped digit can leave a loadable program that is another one; a hash key gives it away."""
    task = SearchTask(SearchTask.from_workload("matmul-32").func)
    assert task.workload_key.startswith("prim_func-")
    path = tmp_path / "unnamed.json"
    s = task.compute_dag.init_state()
    s.split(0, 0, [4])
    with RecordWriter(path) as writer:
        writer.write([MeasureInput(task, s)], [MeasureResult((1e-3,), ErrorNo.NO_ERROR)])
    assert len(load_records(path)) == 1
    lines = path.read_text().splitlines()

    def grow(graph):  # the extent 32 of every loop and buffer becomes 33
        for node in graph["nodes"]:
            if node["type"] == "int" and node["data"] == 32:
                node["data"] = 33
        return graph

    path.write_text("\n".join([_graph_edit(grow)(lines[0]), lines[1]]) + "\n")
    with caplog.at_level(logging.WARNING, logger="ansor"):
        assert load_records(path) == []
    assert f"workload '{task.workload_key}': its prim_func is not the program its key names" in warnings_of(caplog)[0]


def test_graph_size_and_line_length_limits(tmp_path, log_lines, caplog, monkeypatch):
    path = tmp_path / "log.json"
    fresh = _graph_edit(lambda g: {**g, "metadata": {"case": "size"}})(log_lines[0])  # a text not loaded before
    path.write_text("\n".join([fresh] + log_lines[1:]) + "\n")
    monkeypatch.setattr(tvm_json, "MAX_NODES", 100)  # matmul-64 has 149 nodes
    with caplog.at_level(logging.WARNING, logger="ansor"):
        assert load_records(path) == []
    assert "149 nodes, more than the 100 accepted" in warnings_of(caplog)[0]
    monkeypatch.undo()

    caplog.clear()
    monkeypatch.setattr(records_module, "MAX_LINE_BYTES", len(log_lines[0]) + 10)
    path.write_text("\n".join(log_lines[:2] + ["[" + " " * 20_000 + "]"] + log_lines[2:]) + "\n")
    with caplog.at_level(logging.WARNING, logger="ansor"):
        assert len(load_records(path)) == 3
    assert warnings_of(caplog) == [f"{path}:3: skipped corrupt record (line longer than {len(log_lines[0]) + 10} "
                                   "bytes)"]
    monkeypatch.setattr(records_module, "MAX_LOG_BYTES", 1000)
    with pytest.raises(RecordError, match=f"{path} has .* more than"):
        load_records(path)


def test_files_that_never_end_are_refused(tmp_path, task):
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    for path, kind in (("/dev/zero", "a device"), (fifo, "a FIFO"), (tmp_path, "a directory")):
        with pytest.raises(RecordError, match=f"^{path} is {kind}, not a log file"):
            load_records(path)
    for path in ("/dev/null", fifo):
        with pytest.raises(RecordError, match=f"^{path} is .*, not a log file"):
            RecordWriter(path)
    for path in ("/dev/zero", fifo):
        with pytest.raises(CostModelError, match=f"^{path} is not a regular file"):
            load_model(path)


@pytest.mark.slow
def test_fresh_process_survives_graphs_that_crash_tvm(tmp_path, log_lines):
    """Cycles and deep chains crash TVM's loader (SIGSEGV), a foreign triple its feature query; checked
    first, the process lives and reports."""
    cases = {"cycle": lambda g: _set_ref(g, lambda k: k), "chain": lambda g: _chain(g, 50_000),
             "later": lambda g: _set_ref(g, lambda k: len(g["nodes"]) - 1)}
    paths = []
    for name, change in cases.items():
        path = tmp_path / f"{name}.json"
        path.write_text("\n".join([_graph_edit(change)(log_lines[0])] + log_lines[1:]) + "\n")
        paths.append(str(path))
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    # A target whose architecture LLVM does not know: asking LLVM about its CPUs would crash the process
    # (what evaluate_networks does with the target most records of a log have); its records are skipped.
    foreign = tmp_path / "foreign.json"
    odd = json.dumps({"kind": "llvm", "mtriple": "no-such-triple", "num-cores": 2})
    foreign.write_text("\n".join(log_lines[:1] + [edit("i.0.1", odd)(line) for line in log_lines[1:]]) + "\n")
    code = textwrap.dedent(f"""
        import json, sys
        from ansor.cli.targets import log_target
        from ansor.errors import RecordError
        from ansor.log.records import load_records
        counts = [len(load_records(p)) for p in {paths!r}]
        refused = []
        for p in ("/dev/zero", {str(fifo)!r}):
            try:
                load_records(p)
            except RecordError as err:
                refused.append(str(err))
        print(json.dumps([counts, refused, log_target([{str(foreign)!r}])]))
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    counts, refused, foreign_target = json.loads(proc.stdout)
    assert counts == [0, 0, 0] and len(refused) == 2 and foreign_target is None
    assert proc.stderr.count("skipped corrupt record") == 12 + len(log_lines) - 1 and "unsafe graph" in proc.stderr
    assert "LLVM does not know the architecture of -mtriple='no-such-triple'" in proc.stderr


def _model_file(path, header: str) -> None:
    with open(path, "wb") as f:
        np.savez(f, header=np.frombuffer(header.encode(), dtype=np.uint8))


@pytest.mark.parametrize("header", [
    '{"format": "ansor-cost-model", "version": 1, "kind": "random", "seed": ' + "[" * 100_000,
    '{"format": "ansor-cost-model", "version": 1, "kind": "random", "seed": ' + "[" * 900 + "]" * 900 + "}",
    '{"format": "ansor-cost-model", "version": 1, "kind": "random", "seed": 1e999}',
    '{"format": "ansor-cost-model", "version": 1, "kind": ["random"], "seed": 1}',
], ids=["nested 100,000 deep", "nested 900 deep", "seed 1e999", "kind a list"])
def test_hostile_model_header_is_one_error(tmp_path, header):
    path = tmp_path / "model.npz"
    _model_file(path, header)
    with pytest.raises(CostModelError, match=f"^{path}: (not a cost model file|damaged random cost model)"):
        load_model(path)
    _model_file(path, '{"format": "ansor-cost-model", "version": 1, "kind": "random", "seed": 3}')
    assert load_model(path).seed == 3
