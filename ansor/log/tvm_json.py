"""Load a TVM object graph (``tvm.ir.save_json`` text) from an untrusted file without crashing the process.

TVM's loader trusts its input: it decodes a node by recursing into the nodes it references, so a reference
cycle or a chain a few thousand nodes deep overflows the C++ stack and the process dies (SIGSEGV), and a
few node types (``ffi.Module``) load code. A log or model file is data from anywhere, so the graph is
checked here first, with the same field reflection TVM's loader uses to tell references from plain
numbers:

* ``root_index`` and ``nodes`` present, at most :data:`MAX_NODES` nodes;
* every node an object with a known, allowed ``type`` and ``data`` of the shape that type needs;
* every reference an index of an *earlier* node. ``tvm.ir.save_json`` writes children before parents,
  so a real graph always passes, and no cycle can be written this way;
* no None where the program needs a value (a container element, a field whose type is not optional):
  TVM's loader accepts the null, and the next pass that walks the program dereferences it;
* the longest reference chain from the root at most :data:`MAX_DEPTH` nodes.

Then the checked graph, not the original text, goes to ``tvm.ir.load_json``, so what TVM parses is
exactly what was checked.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import tvm
from tvm_ffi import core as ffi_core

#: Most nodes a graph may have (the largest task of the built-in networks has ~700).
MAX_NODES = 200_000
#: Longest reference chain accepted. TVM's loader recurses once per level: on an 8 MiB stack it crashed
#: at 2,000 nested ``Add`` nodes (not at 1,500) and at 3,000 nested arrays (not at 2,500). The deepest
#: task of the built-in networks (resnet3d-18) is 26 levels deep.
MAX_DEPTH = 500
_INT64 = 2 ** 63

# Static type indices of TVM's FFI (tvm/ffi/c_api.h): fields of these types hold values, not references.
_POD_FIELD_TYPES = frozenset((0, 1, 2, 3, 5))  # None, int, bool, float, DataType
_SEQUENCES = frozenset(("ffi.Array", "ffi.List"))
_MAPS = frozenset(("ffi.Map", "ffi.Dict"))
_SCALARS = {"None": (type(None),), "bool": (bool,), "int": (int,), "float": (int, float),
            "DataType": (str,), "ffi.String": (str,), "ffi.Bytes": (str,)}
#: Types a program never holds and that load code or look up functions by name when decoded.
_FORBIDDEN = frozenset(("ffi.Module", "ffi.Function", "ffi.Error", "ffi.OpaquePyObject", "ir.EnvFunc"))


class GraphError(ValueError):
    """A graph that must not reach TVM's loader; the message says why."""


def load_checked(graph: Any) -> Any:
    """Check a parsed ``save_json`` graph (the result of ``json.loads``) and load it with TVM.

    Raises :class:`GraphError` for a graph the checks reject and whatever TVM raises for one it refuses.
    """
    check_graph(graph)
    return tvm.ir.load_json(json.dumps(graph))


def check_graph(graph: Any) -> None:
    """Raise :class:`GraphError` unless ``graph`` is safe to give to TVM's loader (see module notes)."""
    if not isinstance(graph, dict):
        raise GraphError("not a JSON object")
    root, nodes = graph.get("root_index"), graph.get("nodes")
    if type(root) is not int or not isinstance(nodes, list):
        raise GraphError("needs an integer root_index and a list of nodes")
    if not 0 <= root < len(nodes):
        raise GraphError(f"root_index {root} is not a node (there are {len(nodes)})")
    if len(nodes) > MAX_NODES:
        raise GraphError(f"{len(nodes)} nodes, more than the {MAX_NODES} accepted")
    metadata = graph.get("metadata", {})
    if not isinstance(metadata, dict) or not all(_flat(v) for v in metadata.values()):
        raise GraphError("metadata must be an object of plain values")
    checker = _Checker(nodes)
    for i, node in enumerate(nodes):
        checker.check(i, node)
        if i <= root and checker.depth[i] > MAX_DEPTH:
            raise GraphError(f"node {i} is {checker.depth[i]} references deep, more than the {MAX_DEPTH} accepted")


@dataclass(frozen=True)
class _ObjectType:
    """What the check needs to know of an object type's fields (from TVM's reflection)."""

    refs: frozenset[str]  # fields that hold a node index
    nullable: frozenset[str]  # of those, the ones that may hold the None node
    decodes_itself: bool  # the type has its own JSON decoder, which sees only its own data


class _Checker:
    """Checks nodes in order, remembering which are None and how deep each one's references go."""

    def __init__(self, nodes: list) -> None:
        self.nodes = nodes
        self.is_none: list[bool] = []
        self.depth: list[int] = []

    def check(self, i: int, node: Any) -> None:
        refs = self._references(i, node)
        for ref, may_be_none in refs:
            if type(ref) is not int or not 0 <= ref < i:
                raise GraphError(f"node {i} ({node['type']}) refers to {ref!r}, not an earlier node")
            if self.is_none[ref] and not may_be_none:
                # TVM accepts the null, then the first pass that walks the program dereferences it.
                raise GraphError(f"node {i} ({node['type']}) holds None where a value is required")
        self.is_none.append(node["type"] == "None")
        self.depth.append(1 + max((self.depth[r] for r, _ in refs), default=0))

    def _references(self, i: int, node: Any) -> list[tuple[Any, bool]]:
        """(node index, may it be the None node) for each reference of node ``i``, after checking its shape."""
        if not isinstance(node, dict) or not isinstance(node.get("type"), str):
            raise GraphError(f"node {i} is not an object with a string type")
        kind, data = node["type"], node.get("data")
        if kind in _SEQUENCES or kind in _MAPS:
            if not isinstance(data, list) or (kind in _MAPS and len(data) % 2):
                raise GraphError(f"node {i} ({kind}) needs a list of node indices (in pairs for a map)")
            return [(ref, False) for ref in data]  # no real program has a None element (none of 153 has)
        if kind in _SCALARS:
            if kind != "None" and type(data) not in _SCALARS[kind]:
                raise GraphError(f"node {i} ({kind}) has data of type {type(data).__name__}")
            return []
        if kind in ("Device", "ffi.Shape"):
            if not isinstance(data, list) or not all(type(v) is int and -_INT64 <= v < _INT64 for v in data):
                raise GraphError(f"node {i} ({kind}) needs a list of integers")
            return []
        info = _object_type(i, kind)
        if info.decodes_itself:
            if not _flat(data):
                raise GraphError(f"node {i} ({kind}) has nested data")
            return []
        if not isinstance(data, dict) or not all(_flat(v) for v in data.values()):
            raise GraphError(f"node {i} ({kind}) needs an object of field values")
        return [(data[name], name in info.nullable) for name in info.refs if name in data]


def _object_type(i: int, kind: str) -> _ObjectType:
    known = _OBJECT_TYPES.get(kind)
    if known is None:
        if kind in _FORBIDDEN:
            raise GraphError(f"node {i} has type {kind}, which a program never holds")
        index = ffi_core._object_type_key_to_index(kind)  # None for an unknown key; registers nothing
        if index is None or index < 64:
            raise GraphError(f"node {i} has unknown type {kind[:80]!r}")
        known = _OBJECT_TYPES[kind] = _reflect(kind, index)
    return known


def _reflect(kind: str, index: int) -> _ObjectType:
    refs: set[str] = set()
    nullable: set[str] = set()
    info = ffi_core._lookup_or_register_type_info_from_type_key(kind)
    while info is not None:
        for f in info.fields:
            if f.field_static_type_index in _POD_FIELD_TYPES:
                continue
            refs.add(f.name)
            schema = json.loads(f.metadata.get("type_schema", '{"type": "Any"}')).get("type")
            if schema in _NULLABLE_SCHEMAS:
                nullable.add(f.name)
        info = info.parent_type_info
    return _ObjectType(frozenset(refs), frozenset(nullable),
                       ffi_core._lookup_type_attr(index, "__data_from_json__") is not None)


#: Field types that may hold None: optional ones, and the two that real programs leave null although their
#: type does not say so (``span`` everywhere, ``ir.Call.attrs``; surveyed on the 153 built-in programs).
_NULLABLE_SCHEMAS = frozenset(("Optional", "Any", "ir.Span", "ir.Attrs"))
_OBJECT_TYPES: dict[str, _ObjectType] = {}


def _flat(value: Any) -> bool:
    """A JSON scalar, or a list of scalars: the most nesting any node's field has."""
    if isinstance(value, list):
        return all(not isinstance(v, (list, dict)) for v in value)
    return not isinstance(value, dict)
