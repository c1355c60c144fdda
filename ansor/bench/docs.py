"""Benchmark figures written into the repository's markdown by the benchmarks themselves, never by hand.

A generated section sits between two HTML comments that name it, ``<!-- generated: KEY -->`` and
``<!-- end: KEY -->``; writing a section replaces the one with the same key, or appends it. Keys combine the
benchmark and the CPU kind, so ``docs/benchmarks.md`` keeps the latest figures of each machine kind while
the history stays in git. Each section opens with its provenance: date, CPU, versions, the command.
"""

from __future__ import annotations

import datetime
import platform
import re
import shlex
import sys
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Sequence

#: Packages whose versions every section records (missing ones are left out).
VERSIONED = ("ansor", "apache-tvm", "onnxruntime", "openvino", "torch", "numpy")

HEADER = """# Benchmark figures

Written by the benchmark scripts (`ansor bench --write-docs .`), one section per benchmark and CPU kind; a
rerun on the same kind of CPU replaces its section. Figures belong to the CPU they were measured on: compare
ratios within one section (one run), not across sections. Older figures are in this file's git history.
"""


@dataclass(frozen=True)
class Provenance:
    """Where and how figures were measured."""

    date: str
    cpu: str
    versions: str
    command: str

    @staticmethod
    def here(cpu: str, argv: Sequence[str] | None = None, script: str | None = None) -> "Provenance":
        """Today, this environment's versions, and the command: ``ansor bench`` with ``argv`` (default: this
        process's arguments), or ``python SCRIPT`` with them for a script under ``scripts/bench/``."""
        versions = [f"Python {platform.python_version()}"]
        for name in VERSIONED:
            try:
                versions.append(f"{name} {metadata.version(name)}")
            except metadata.PackageNotFoundError:
                continue
        flags = portable(list(sys.argv[1:] if argv is None else argv))
        if script:
            command = shlex.join(["python", script, *flags])
        else:
            if flags[:1] == ["bench"]:  # run as `ansor bench ...`, not as scripts/bench/bench_network.py
                flags = flags[1:]
            command = shlex.join(["ansor", "bench", *flags])
        return Provenance(datetime.date.today().isoformat(), cpu, ", ".join(versions), command)

    def markdown(self) -> str:
        return f"- date: {self.date}\n- {self.cpu}\n- versions: {self.versions}\n- command: `{self.command}`\n"


#: The repository's root: a path under it is written relative to it.
REPO_ROOT = Path(__file__).resolve().parents[2]
#: Flags whose directory a reader picks: written as the name of a directory in the repository's root.
_WORK_FLAGS = {"--work-dir": "bench-work", "--write-docs": "."}


def portable(argv: Sequence[str], root: Path = REPO_ROOT) -> list[str]:
    """``argv`` as a reader reruns it from the repository's root: paths under it relative to it,
    ``--write-docs`` the root itself, ``--work-dir`` a directory there, and any other absolute path its
    file name (an ONNX file the zoo benchmark exports keeps its name: ``bench-work/vit_b_16.onnx``)."""
    out: list[str] = []
    flag = ""
    for arg in argv:
        if flag in _WORK_FLAGS:
            out.append(_WORK_FLAGS[flag])
        elif arg.startswith("/"):
            path = Path(arg)
            try:
                out.append(str(path.resolve().relative_to(root)))
            except ValueError:
                out.append(f"{_WORK_FLAGS['--work-dir']}/{path.name}")
        else:
            out.append(arg)
        flag = arg if arg.startswith("--") else ""
    return out


def section_key(benchmark: str, cpu: str) -> str:
    """A stable key of one benchmark on one kind of CPU: the model name and LLVM's name of the CPU, without
    spaces (Zen 3 and Zen 5 machines both report the model "AMD EPYC")."""
    model = cpu.removeprefix("CPU: ").split(" (")[0]
    llvm = re.search(r"\(LLVM ([\w.-]+)", cpu)
    kind = re.sub(r"[^A-Za-z0-9]+", "-", model + (f" {llvm.group(1)}" if llvm else "")).strip("-").lower()
    return f"{benchmark}:{kind or 'cpu'}"


def _markers(key: str) -> tuple[str, str]:
    return f"<!-- generated: {key} -->", f"<!-- end: {key} -->"


def read_section(path: Path, key: str) -> str:
    """The body of the generated section ``key`` of the markdown file at ``path`` ("" when there is none)."""
    begin, end = _markers(key)
    text = path.read_text() if path.exists() else ""
    found = re.search(re.escape(begin) + r"(.*?)" + re.escape(end), text, re.S)
    return found.group(1) if found else ""


def write_section(path: Path, key: str, body: str, header: str = HEADER) -> None:
    """Replace (or append) the generated section ``key`` of the markdown file at ``path``."""
    begin, end = _markers(key)
    text = path.read_text() if path.exists() else header
    block = f"{begin}\n{body.rstrip()}\n{end}"
    pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.S)
    text = pattern.sub(lambda _: block, text, count=1) if pattern.search(text) else f"{text.rstrip()}\n\n{block}\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text if text.endswith("\n") else text + "\n")


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]], align: str = "") -> str:
    """A GitHub markdown table; ``align``: one of ``<>`` per column (default left)."""
    marks = [("---:" if a == ">" else "---") for a in (align or "<" * len(header))]
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(marks) + " |"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)
