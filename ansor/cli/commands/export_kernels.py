"""``ansor export-kernels``: export the best kernel of every workload in a tuning log, with an index of
what was exported (also ``scripts/export_kernels.py``).

Examples
--------
  ansor export-kernels logs/matmul-512.json --out kernels/
  ansor export-kernels logs/resnet-50-b1.json --out kernels/ --target "cuda -arch=sm_80"
  nvcc -arch=sm_80 -c kernels/matmul-512.cu          # the CUDA source compiles on its own

For each workload (and target) the log holds a valid record of, the fastest record is replayed and built:

  <name>.cu          CUDA C of the kernels (cuda targets)
  <name>.ll, <name>.s  LLVM IR and assembly (CPU targets)
  <name>.tir.py      TVMScript of the scheduled PrimFunc (every target)
  index.json         one entry per workload: key, target, argument shapes and dtypes, measured latency,
                     and for CUDA the launch dimensions of each kernel (grid and block from the thread
                     bindings; vthreads are folded into the threads' work by TVM)

Exit status 2 means bad input: a missing or unreadable log, or a log without a single valid record.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
from pathlib import Path

logger = logging.getLogger("ansor")


NAME = "export-kernels"
SUMMARY = "write the best kernel of each workload in a log as source (CUDA C, LLVM IR, TVMScript)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from ...arguments import ExistingFile, OutputDir, Text

    parser.add_argument("log", metavar="LOG", type=ExistingFile("a tuning log", "logs/matmul-512.json"),
                        help="JSON-lines tuning log written by ansor tune-op or ansor tune")
    parser.add_argument("--out", required=True, metavar="DIR", type=OutputDir("an output folder", "kernels/"),
                        help="folder to write the kernels and index.json into (created if missing; files of the "
                             "same names are replaced)")
    parser.add_argument("--target", default=None, metavar="T", type=Text("a target", "llvm"),
                        help="export only records measured for this target ('llvm -mcpu=znver5 -num-cores=2', "
                             "'cuda -arch=sm_80', a JSON dict, ...); default: every target in the log")
    parser.add_argument("--workload", default=None, metavar="KEY", type=Text("a workload key", "matmul-512"),
                        help="export only this workload key (e.g. matmul-512); default: every workload")
    parser.add_argument("-v", "--verbose", action="store_true", help="log what is exported")


def execute(args: argparse.Namespace) -> int:
    from ..running import run_main
    return run_main(run, args)


def run(args: argparse.Namespace) -> int:
    from ...errors import RecordError
    from ...log.records import load_records

    log = Path(args.log)
    records = load_records(log, workload_key=args.workload, target=args.target)
    best: dict[tuple[str, str], object] = {}
    for rec in records:
        if not rec.result.ok:
            continue
        key = (rec.workload_key, rec.task.target_str)
        if key not in best or rec.result.mean_cost < best[key].result.mean_cost:  # type: ignore[attr-defined]
            best[key] = rec
    if not best:
        which = f" of workload {args.workload!r}" if args.workload else ""
        where = f" for target {args.target!r}" if args.target else ""
        raise RecordError(f"{log} holds no valid record{which}{where} ({len(records)} records read; a record is "
                          "valid when its measurement succeeded)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    names = _file_names(list(best))
    index = [export_record(rec, out, names[key]) for key, rec in best.items()]
    (out / "index.json").write_text(json.dumps(index, indent=2) + "\n")
    print(f"exported {len(index)} kernel(s) to {out} (index: {out / 'index.json'})")
    return 0


def _file_names(keys: list[tuple[str, str]]) -> dict[tuple[str, str], str]:
    """A file stem per (workload, target): the workload key, plus the target kind if a key has several."""
    safe = {k: re.sub(r"[^A-Za-z0-9._-]", "_", k[0]) for k in keys}
    counts: dict[str, int] = {}
    for stem in safe.values():
        counts[stem] = counts.get(stem, 0) + 1
    names, used = {}, set()
    for key, stem in safe.items():
        name = stem
        if counts[stem] > 1:
            kind = json.loads(key[1]).get("kind", "target") if key[1].startswith("{") else key[1].split()[0]
            name = f"{stem}-{kind}"
            n = 1
            while name in used:
                n += 1
                name = f"{stem}-{kind}{n}"
        used.add(name)
        names[key] = name
    return names


def export_record(rec, out: Path, name: str) -> dict:
    """Build ``rec``'s program, write its source files under ``out`` and return its index entry."""
    from ... import codegen
    from ...task.program import arg_specs
    from ...errors import AnsorError
    from ...target import device_kind
    from ...version import writer

    task = rec.task
    try:
        mod = task.compute_dag.replay(rec.steps).mod
        executable = codegen.compile(mod, task.target)
    except AnsorError:
        raise
    except Exception as err:  # TVM raises several error types; the log was valid when measured
        raise AnsorError(f"{task.workload_key}: the best record no longer builds ({type(err).__name__}: "
                         f"{str(err).strip().splitlines()[-1] if str(err).strip() else ''})") from None
    files = {"tvmscript": f"{name}.tir.py"}
    (out / files["tvmscript"]).write_text(mod["main"].script() + "\n")
    entry: dict = {
        "writer": writer(),
        "workload_key": task.workload_key,
        "target": task.target_str,
        "args": [{"name": p.name, "shape": list(shape), "dtype": dtype}
                 for p, (shape, dtype) in zip(task.func.params, arg_specs(task))],
        "latency_s": rec.result.mean_cost,
        "costs_s": list(rec.result.costs),
        "gflops": task.flop_ct / rec.result.mean_cost / 1e9 if rec.result.mean_cost > 0 else None,
    }
    kind = device_kind(task.target)
    kernels = executable.mod.imports[0] if kind.device_module else executable.mod
    for key, suffix, fmt in kind.kernel_files:
        files[key] = f"{name}.{suffix}"
        (out / files[key]).write_text(kernels.inspect_source(fmt))
    if kind.device_module:
        from ...sketch.gpu_verify import launch_dims
        entry["launch"] = launch_dims(rec.state)
    entry["files"] = files
    logger.info("exported %s (%s): %s", task.workload_key, task.target_str, ", ".join(files.values()))
    return entry

