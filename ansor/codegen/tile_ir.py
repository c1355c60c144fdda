"""AMX's tile instructions in the lowered TIR TVM hands LLVM: recognising them (:func:`tile_call`), walking and
rebuilding the statements that hold them, and the small TIR helpers :mod:`.amx_tiles`' rewrite is made of."""

from __future__ import annotations

import enum
import threading
from dataclasses import dataclass
from contextlib import contextmanager
from functools import lru_cache
from typing import Iterator, Optional

import tvm
from tvm.tirx import analysis

_LLVM_INTRIN = "tirx.call_llvm_intrin"


class TileOp(enum.Enum):
    """The AMX instructions the tile product intrinsic calls, by their LLVM names."""

    CONFIG = "llvm.x86.ldtilecfg"
    LOAD = "llvm.x86.tileloadd64"
    STORE = "llvm.x86.tilestored64"
    DOT = "llvm.x86.tdpbf16ps"


@lru_cache(maxsize=None)
def _op_ids() -> dict[int, TileOp]:
    return {int(tvm.target.codegen.llvm_lookup_intrinsic_id(op.value)): op for op in TileOp}


class Unexpected(Exception):
    """The kernel's tile instructions are not in a shape the rewrite knows: compile it unchanged."""


@dataclass(frozen=True)
class TileCall:
    op: TileOp
    args: tuple  # the LLVM intrinsic's operands

    @property
    def tile(self) -> Optional[int]:
        """The tile a load or store moves."""
        return int(self.args[0]) if self.op in (TileOp.LOAD, TileOp.STORE) else None


def tile_call(stmt: tvm.tirx.Stmt) -> Optional[TileCall]:
    """The AMX instruction ``stmt`` is, if it is one."""
    if not isinstance(stmt, tvm.tirx.Evaluate) or not isinstance(stmt.value, tvm.ir.Call):
        return None
    call = stmt.value
    if call.op.name != _LLVM_INTRIN or not isinstance(call.args[0], tvm.tirx.IntImm):
        return None
    op = _op_ids().get(int(call.args[0].value))
    return None if op is None else TileCall(op, tuple(call.args[1:]))


def children_of(stmt: tvm.tirx.Stmt) -> list[tvm.tirx.Stmt]:
    """The statements ``stmt`` holds (0.27's Bind and DeclBuffer scope over the rest of their SeqStmt)."""
    if isinstance(stmt, tvm.tirx.SeqStmt):
        return list(stmt.seq)
    if isinstance(stmt, tvm.tirx.IfThenElse):
        return [stmt.then_case] + ([stmt.else_case] if stmt.else_case is not None else [])
    if isinstance(stmt, (tvm.tirx.For, tvm.tirx.AttrStmt, tvm.tirx.While)):
        return [stmt.body]
    return []


def calls_in(stmt: tvm.tirx.Stmt) -> list[TileCall]:
    """Every AMX instruction in ``stmt``, in program order (memoized for the kernel being rewritten)."""
    found = memo("calls")
    if found is not None and stmt in found:
        return found[stmt]
    call = tile_call(stmt)
    calls = [call] if call else [c for child in children_of(stmt) for c in calls_in(child)]
    if found is not None:
        found[stmt] = calls  # the key holds its node: no other node can take its handle meanwhile
    return calls


#: Per thread, while a kernel is rewritten (:func:`memoizing`): what each search found, by statement.
_MEMOS = threading.local()


@contextmanager
def memoizing() -> Iterator[None]:
    """Memoize the searches of one kernel's statements (:func:`memo`) while it is rewritten."""
    _MEMOS.found = {}
    try:
        yield
    finally:
        _MEMOS.found = None


def memo(search: str) -> Optional[dict]:
    """What ``search`` found so far by statement, within :func:`memoizing` (else None: nothing is kept)."""
    found = getattr(_MEMOS, "found", None)
    return None if found is None else found.setdefault(search, {})


def seq(items: list[tvm.tirx.Stmt]) -> tvm.tirx.Stmt:
    flat: list[tvm.tirx.Stmt] = []
    for item in items:
        flat += list(item.seq) if isinstance(item, tvm.tirx.SeqStmt) else [item]
    return flat[0] if len(flat) == 1 else tvm.tirx.SeqStmt(flat)


def with_body(loop: tvm.tirx.For, body: tvm.tirx.Stmt) -> tvm.tirx.For:
    return tvm.tirx.For(loop.loop_var, loop.min, loop.extent, loop.kind, body, loop.thread_binding,
                        loop.annotations, loop.step)


def rebuild(stmt: tvm.tirx.Stmt, children: list[tvm.tirx.Stmt]) -> tvm.tirx.Stmt:
    """``stmt`` holding ``children`` in place of its own (:func:`children_of`)."""
    if isinstance(stmt, tvm.tirx.SeqStmt):
        return seq(children)
    if isinstance(stmt, tvm.tirx.IfThenElse):
        return tvm.tirx.IfThenElse(stmt.condition, children[0], children[1] if len(children) > 1 else None)
    if isinstance(stmt, tvm.tirx.For):
        return with_body(stmt, children[0])
    if isinstance(stmt, tvm.tirx.AttrStmt):
        return tvm.tirx.AttrStmt(stmt.node, stmt.attr_key, stmt.value, children[0])
    raise Unexpected(f"a {type(stmt).__name__} holds tile instructions")


def free_vars(node) -> set[str]:
    return {v.name for v in analysis.undefined_vars(node, [])}


def pure(expr: tvm.tirx.PrimExpr) -> bool:
    """An integer computation of scalar variables (no memory read: its value cannot change in a loop that
    writes memory)."""
    return all(isinstance(v.ty, tvm.ir.PrimType) and "handle" not in str(v.ty)
               for v in analysis.undefined_vars(expr, []))


def statements(stmt: tvm.tirx.Stmt) -> list[tvm.tirx.Stmt]:
    return [stmt] + [s for child in children_of(stmt) for s in statements(child)]


def items_of(stmt: tvm.tirx.Stmt) -> list[tvm.tirx.Stmt]:
    return list(stmt.seq) if isinstance(stmt, tvm.tirx.SeqStmt) else [stmt]


def is_op(stmt: tvm.tirx.Stmt, op: TileOp) -> bool:
    call = tile_call(stmt)
    return call is not None and call.op is op


def const_int(expr: tvm.tirx.PrimExpr) -> Optional[int]:
    return int(expr.value) if isinstance(expr, tvm.tirx.IntImm) else None


def evaluate(call: TileCall) -> tvm.tirx.Stmt:
    return tvm.tirx.Evaluate(tvm.tirx.call_llvm_intrin("void", call.op.value, *call.args))
