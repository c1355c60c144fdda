"""The package reads bottom-up: its import graph has no cycle, and no module imports another's private names.

A static check (``ast``, nothing imported): every ``import`` counts, including the ones inside functions,
which hide a cycle from the interpreter but not from a reader. Imports under ``if TYPE_CHECKING:`` are left
out: they name a type for a hint and never run.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path


PACKAGE = Path(__file__).resolve().parents[1] / "ansor"

#: The layers of docs/design.md, bottom-up: a module belongs to the first entry its name starts with, so the
#: folders are the layers. A module imports its own layer and the ones below, never one above.
LAYERS = (
    ("ansor.errors", "ansor.version", "ansor.torchless", "ansor.arguments", "ansor.host_cpu", "ansor.target",
     "ansor.codegen"),
    ("ansor.state",),
    ("ansor.task",),
    ("ansor.log",),
    ("ansor.measure", "ansor.cost_model", "ansor.sketch"),
    ("ansor.tuning",),
    ("ansor.task_scheduler",),
    ("ansor.networks",),
    ("ansor.relax",),
    ("ansor.cli", "ansor.bench", "ansor.__main__"),
)
#: The core (the layers under the search): the data a record is made of, which needs no Ray and no XGBoost.
CORE_LAYERS = 4
FORBIDDEN_IN_CORE = ("ray", "xgboost")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST):
    """Every import statement, at any depth, outside ``if TYPE_CHECKING:`` blocks."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and _is_type_checking(node):
            yield from (n for child in node.orelse for n in _imports(ast.Module(body=[child], type_ignores=[])))
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        yield from _imports(node)


def _base(module: str, node: ast.ImportFrom) -> str:
    """The absolute module an ``ImportFrom`` reads from."""
    if not node.level:
        return node.module or ""
    is_package = MODULES[module].name == "__init__.py"
    parts = module.split(".")
    anchor = parts if is_package else parts[:-1]
    anchor = anchor[: len(anchor) - (node.level - 1)]
    return ".".join(anchor + ([node.module] if node.module else []))


def import_edges(module: str) -> list[tuple[str, str, int]]:
    """(imported module, imported name or "", line) for each name ``module`` imports."""
    tree = ast.parse(MODULES[module].read_text(), str(MODULES[module]))
    edges = []
    for node in _imports(tree):
        if isinstance(node, ast.Import):
            edges += [(alias.name, "", node.lineno) for alias in node.names]
            continue
        base = _base(module, node)
        for alias in node.names:
            sub = f"{base}.{alias.name}"
            edges.append((sub, "", node.lineno) if sub in MODULES else (base, alias.name, node.lineno))
    return edges


def graph() -> dict[str, set[str]]:
    return {m: {target for target, _, _ in import_edges(m) if target in MODULES and target != m} for m in MODULES}


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(g[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return found


def test_the_checker_finds_a_cycle_and_function_local_imports(tmp_path):
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    tree = ast.parse("import x\nif TYPE_CHECKING:\n    import y\ndef f():\n    import z\n")
    assert [n.names[0].name for n in _imports(tree)] == ["x", "z"]


def test_no_import_cycle():
    found = cycles(graph())
    assert not found, "import cycles: " + "; ".join(" <-> ".join(c) for c in found)


def test_no_private_name_imported_across_modules():
    bad = [f"{m}:{line} imports {name} from {target}"
           for m in MODULES for target, name, line in import_edges(m)
           if target.startswith("ansor") and name.startswith("_") and not name.endswith("__") and target != m]
    assert not bad, "\n".join(bad)


def layer(module: str) -> int:
    for i, prefixes in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return i
    raise AssertionError(f"{module} is in no layer: add its folder to LAYERS here and to docs/design.md")


def test_every_module_is_in_a_layer_and_the_top_holds_few():
    assert {m: layer(m) for m in MODULES if m != "ansor"}
    top = [m for m in MODULES if m.count(".") == 1 and MODULES[m].name != "__init__.py"]
    assert len(top) <= 8, f"modules at the top of ansor/: {top}: put them in a layer's folder"


def test_imports_point_down_the_layers():
    bad = sorted({f"{m}:{line} imports {target} (a layer above)" for m in MODULES if m != "ansor"
                  for target, _, line in import_edges(m)
                  if target.startswith("ansor.") and target in MODULES and layer(target) > layer(m)})
    assert not bad, "\n".join(bad)


def test_the_core_needs_no_ray_and_no_xgboost():
    core = [m for m in MODULES if m != "ansor" and layer(m) < CORE_LAYERS]
    assert len(core) > 10
    bad = [f"{m}:{line} imports {target}" for m in core for target, _, line in import_edges(m)
           if any(target == f or target.startswith(f + ".") for f in FORBIDDEN_IN_CORE)]
    assert not bad, "\n".join(bad)


def test_nothing_inside_reaches_the_facade():
    """``import ansor`` inside the package would hide any edge behind the facade's lazy names."""
    users = {m for m in MODULES for target, _, _ in import_edges(m) if target == "ansor" and m != "ansor"}
    assert not users, sorted(users)


def test_the_search_asks_its_space_never_whether_the_target_is_a_gpu():
    """Per-target facts live in one object per kind: ``ansor.target.DeviceKind`` under the search and
    ``ansor.sketch.search_space.SearchSpace`` in it. ``is_gpu`` is defined and mapped to a kind, nowhere
    else asked; in the search only ``search_space`` looks up the target's kind."""
    sites = [f"{m}:{n}" for m, path in MODULES.items()
             for n, line in enumerate(path.read_text().splitlines(), 1) if re.search(r"\bis_gpu\b", line)]
    assert len(sites) <= 3, sites
    asking = sorted(f"{m}:{line} imports {name}" for m in MODULES if m.startswith("ansor.sketch.")
                    and m != "ansor.sketch.search_space" for target, name, line in import_edges(m)
                    if target == "ansor.target" and name in ("is_gpu", "device_kind"))
    assert not asking, "\n".join(asking)


def patched_imports(source: str) -> list[tuple[str, int]]:
    """(target, line) of each assignment to an attribute of an imported class (``SearchTask.tune = f``) or
    ``setattr`` on one: a class gaining members outside its own module. Classes are the imported names in
    CapWords (PEP 8); a module's flag set on purpose (``ray_constants.X``, restored) is not a class's member."""
    tree = ast.parse(source)
    classes = {alias.asname or alias.name for node in _imports(tree) if isinstance(node, ast.ImportFrom)
               for alias in node.names if (alias.asname or alias.name)[:1].isupper()}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr" \
                and node.args:
            targets = [ast.Attribute(value=node.args[0], attr="?")]
        else:
            continue
        for target in targets:
            root = target
            while isinstance(root, ast.Attribute):
                root = root.value
            if target is not root and isinstance(root, ast.Name) and root.id in classes:
                found.append((ast.unparse(target), node.lineno))
    return sorted(found, key=lambda item: item[1])


def test_the_patch_checker_finds_attributes_set_on_imported_classes():
    source = ("from .task import SearchTask\nfrom ray import ray_constants\nSearchTask.tune = 1\n"
              "setattr(SearchTask, 'x', 2)\nSearchTask.n += 3\nray_constants.FLAG = False\n"
              "class Mine:\n    pass\nMine.y = 4\ndef f(obj):\n    obj.z = 5\n")
    assert [t for t, _ in patched_imports(source)] == ["SearchTask.tune", "SearchTask.?", "SearchTask.n"]


def test_no_module_attaches_attributes_to_another_modules_class():
    """A reader of a class's module sees everything the class has (``ansor.tuning`` used to add
    ``SearchTask.tune`` and three more methods at import time)."""
    bad = [f"{m}:{line} sets {target}" for m in MODULES for target, line in patched_imports(MODULES[m].read_text())]
    assert not bad, "\n".join(bad)


def test_bench_and_cli_are_not_tied_both_ways():
    """``ansor bench`` is a command of the CLI, so cli imports bench; bench takes the flag types it shares
    with the CLI from ``ansor.arguments``, below both."""
    back = [f"{m}:{line} imports {target}" for m in MODULES if m.startswith("ansor.bench")
            for target, _, line in import_edges(m) if target.startswith("ansor.cli")]
    assert not back, "\n".join(back)


#: Longest comment above a constant: its reason and figure; the story of the measurement goes to
#: docs/design.md ("Why these values") or the commit.
MAX_CONSTANT_COMMENT = 3
_CONSTANT = re.compile(r"^\s*([A-Z][A-Z0-9_]*)\s*(:[^=]*)?=")


def long_constant_comments(source: str) -> list[tuple[str, int, int]]:
    """(name, line, comment lines) of each UPPER_CASE assignment with more comment lines right above it
    than :data:`MAX_CONSTANT_COMMENT`."""
    lines = source.splitlines()
    found = []
    for i, line in enumerate(lines):
        match = _CONSTANT.match(line)
        if not match:
            continue
        j = i - 1
        while j >= 0 and lines[j].strip().startswith("#"):
            j -= 1
        if i - 1 - j > MAX_CONSTANT_COMMENT:
            found.append((match.group(1), i + 1, i - 1 - j))
    return found


def test_the_comment_checker_counts_the_lines_above_a_constant():
    source = "#: a\n#: b\n#: c\n#: d\nLIMIT = 4\n#: short\nOTHER: int = 2\nx = 1\n"
    assert long_constant_comments(source) == [("LIMIT", 5, 4)]


def test_no_constant_has_a_comment_longer_than_three_lines():
    bad = [f"{m}:{line} {name} has {n} comment lines" for m in MODULES
           for name, line, n in long_constant_comments(MODULES[m].read_text())]
    assert not bad, "\n".join(bad)
