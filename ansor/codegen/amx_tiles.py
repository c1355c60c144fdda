"""AMX kernels that keep their tiles: one tile configuration per thread, and the accumulator tile kept in its
register across the reduction. A rewrite of the TIR that TVM hands LLVM (:mod:`ansor.codegen` runs it).

The tile product intrinsic (``tile_16x16x32`` of :mod:`ansor.state.tensor_intrin`) is one self-contained
call: it fills a 64-byte tile configuration and loads it (``ldtilecfg``), loads the accumulator tile C, A
and B, multiplies (``tdpbf16ps``) and stores C back. That is correct wherever TensorIR places the call, but
each 16x16x32 product (16 K flops) then moves the configuration and C's 1 KB through memory twice, and
TensorIR has no way to say that a value lives in a tile register between two calls. So, on the lowered
kernel:

- the configuration is loaded once before the outermost serial loop nest that holds tile instructions (in
  a parallel loop, inside its body: a tile configuration belongs to a thread), and every copy the calls
  made is dropped;
- a loop whose body loads the accumulator tile first and stores it last, at an address the loop does not
  move (a reduction loop directly around the call), loads it before the loop and stores it after;
- in unrolled calls, a store of the accumulator followed by a load of it from the same address is dropped.

A kernel whose tile instructions come in any other shape is left as it is (each call is correct alone).
"""

from __future__ import annotations

import enum
import logging
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Optional

import tvm
from tvm import sym
from tvm.tirx import analysis

logger = logging.getLogger("ansor")

_LLVM_INTRIN = "tirx.call_llvm_intrin"
#: The tile the intrinsic accumulates in (tiles 1 and 2 hold A and B).
ACCUMULATOR = 0


class TileOp(enum.Enum):
    """The AMX instructions the tile product intrinsic calls, by their LLVM names."""

    CONFIG = "llvm.x86.ldtilecfg"
    LOAD = "llvm.x86.tileloadd64"
    STORE = "llvm.x86.tilestored64"
    DOT = "llvm.x86.tdpbf16ps"


@lru_cache(maxsize=None)
def _op_ids() -> dict[int, TileOp]:
    return {int(tvm.target.codegen.llvm_lookup_intrinsic_id(op.value)): op for op in TileOp}


class _Unexpected(Exception):
    """The kernel's tile instructions are not in a shape the rewrite knows: compile it unchanged."""


@dataclass(frozen=True)
class _Call:
    op: TileOp
    args: tuple  # the LLVM intrinsic's operands

    @property
    def tile(self) -> Optional[int]:
        """The tile a load or store moves."""
        return int(self.args[0]) if self.op in (TileOp.LOAD, TileOp.STORE) else None


def tile_call(stmt: tvm.tirx.Stmt) -> Optional[_Call]:
    """The AMX instruction ``stmt`` is, if it is one."""
    if not isinstance(stmt, tvm.tirx.Evaluate) or not isinstance(stmt.value, tvm.ir.Call):
        return None
    call = stmt.value
    if call.op.name != _LLVM_INTRIN or not isinstance(call.args[0], tvm.tirx.IntImm):
        return None
    op = _op_ids().get(int(call.args[0].value))
    return None if op is None else _Call(op, tuple(call.args[1:]))


def children_of(stmt: tvm.tirx.Stmt) -> list[tvm.tirx.Stmt]:
    """The statements ``stmt`` holds (0.27's Bind and DeclBuffer scope over the rest of their SeqStmt)."""
    if isinstance(stmt, tvm.tirx.SeqStmt):
        return list(stmt.seq)
    if isinstance(stmt, tvm.tirx.IfThenElse):
        return [stmt.then_case] + ([stmt.else_case] if stmt.else_case is not None else [])
    if isinstance(stmt, (tvm.tirx.For, tvm.tirx.AttrStmt, tvm.tirx.While)):
        return [stmt.body]
    return []


def _calls(stmt: tvm.tirx.Stmt) -> list[_Call]:
    """Every AMX instruction in ``stmt``, in program order."""
    call = tile_call(stmt)
    return [call] if call else [c for child in children_of(stmt) for c in _calls(child)]


def _seq(items: list[tvm.tirx.Stmt]) -> tvm.tirx.Stmt:
    flat: list[tvm.tirx.Stmt] = []
    for item in items:
        flat += list(item.seq) if isinstance(item, tvm.tirx.SeqStmt) else [item]
    return flat[0] if len(flat) == 1 else tvm.tirx.SeqStmt(flat)


def _with_body(loop: tvm.tirx.For, body: tvm.tirx.Stmt) -> tvm.tirx.For:
    return tvm.tirx.For(loop.loop_var, loop.min, loop.extent, loop.kind, body, loop.thread_binding,
                        loop.annotations, loop.step)


def rebuild(stmt: tvm.tirx.Stmt, children: list[tvm.tirx.Stmt]) -> tvm.tirx.Stmt:
    """``stmt`` holding ``children`` in place of its own (:func:`children_of`)."""
    if isinstance(stmt, tvm.tirx.SeqStmt):
        return _seq(children)
    if isinstance(stmt, tvm.tirx.IfThenElse):
        return tvm.tirx.IfThenElse(stmt.condition, children[0], children[1] if len(children) > 1 else None)
    if isinstance(stmt, tvm.tirx.For):
        return _with_body(stmt, children[0])
    if isinstance(stmt, tvm.tirx.AttrStmt):
        return tvm.tirx.AttrStmt(stmt.node, stmt.attr_key, stmt.value, children[0])
    raise _Unexpected(f"a {type(stmt).__name__} holds tile instructions")


def _free_vars(node) -> set[str]:
    return {v.name for v in analysis.undefined_vars(node, [])}


def _pure(expr: tvm.tirx.PrimExpr) -> bool:
    """An integer computation of scalar variables (no memory read: its value cannot change in a loop that
    writes memory)."""
    return all(isinstance(v.ty, tvm.ir.PrimType) and "handle" not in str(v.ty)
               for v in analysis.undefined_vars(expr, []))


# ------------------------------------------------------------------------------------------ configuration
def _config_buffer(stmt: tvm.tirx.Stmt) -> Optional[str]:
    """The name of the buffer variable an ``ldtilecfg`` reads its configuration from."""
    call = tile_call(stmt)
    if call is None or call.op is not TileOp.CONFIG:
        return None
    address = call.args[0]
    if not (isinstance(address, tvm.ir.Call) and address.op.name == "tirx.address_of"
            and isinstance(address.args[0], tvm.ir.TensorLoad)):
        raise _Unexpected("ldtilecfg of a computed address")
    return address.args[0].source.name


def _fills(stmt: tvm.tirx.Stmt, buffer: str) -> bool:
    """Whether ``stmt`` only writes constants into ``buffer`` (its bytes of the configuration)."""
    if isinstance(stmt, tvm.tirx.BufferStore):
        return stmt.buffer.name == buffer and _free_vars(stmt) <= {buffer}
    if isinstance(stmt, tvm.tirx.For) and stmt.kind != tvm.tirx.ForKind.PARALLEL:
        return _free_vars(stmt) <= {buffer} and all(_fills(c, buffer) for c in children_of(stmt))
    if isinstance(stmt, tvm.tirx.SeqStmt):
        return all(_fills(c, buffer) for c in stmt.seq)
    return False


def _config_buffers(stmt: tvm.tirx.Stmt) -> set[str]:
    return {b for item in _statements(stmt) if (b := _config_buffer(item)) is not None}


def _statements(stmt: tvm.tirx.Stmt) -> list[tvm.tirx.Stmt]:
    return [stmt] + [s for child in children_of(stmt) for s in _statements(child)]


def _strip_config(stmt: tvm.tirx.Stmt, buffers: set[str], found: list[tvm.tirx.Stmt]) -> tvm.tirx.Stmt:
    """``stmt`` without the configuration's fills and loads; the first configuration met goes to ``found``
    (its fills, then its ``ldtilecfg``)."""
    if isinstance(stmt, tvm.tirx.SeqStmt):
        items = []
        for item in stmt.seq:
            if _config_buffer(item) is not None or any(_fills(item, b) for b in buffers):
                if not any(_config_buffer(f) is not None for f in found):
                    found.append(item)
                continue
            items.append(_strip_config(item, buffers, found))
        return _seq(items) if items else tvm.tirx.Evaluate(0)
    if _config_buffer(stmt) is not None:
        raise _Unexpected("an ldtilecfg alone in a loop")
    children = children_of(stmt)
    if not children or not _calls(stmt):
        return stmt
    return rebuild(stmt, [_strip_config(c, buffers, found) for c in children])


# ------------------------------------------------------------------------------------------ accumulators
@dataclass
class _Residency:
    """Moves accumulator loads and stores out of the loops and unrolled runs that do not need them."""

    analyzer: sym.Analyzer = field(default_factory=sym.Analyzer)

    def stmt(self, stmt: tvm.tirx.Stmt) -> tvm.tirx.Stmt:
        if isinstance(stmt, tvm.tirx.Bind):
            self.analyzer.bind(stmt.var, stmt.value)
            return stmt
        children = children_of(stmt)
        if not children or not _calls(stmt):
            return stmt
        rebuilt = rebuild(stmt, [self.stmt(c) for c in children])
        if isinstance(rebuilt, tvm.tirx.SeqStmt):
            return self._drop_round_trips(list(rebuilt.seq))
        if isinstance(rebuilt, tvm.tirx.For) and rebuilt.kind in (tvm.tirx.ForKind.SERIAL,
                                                                   tvm.tirx.ForKind.UNROLLED):
            return self._hoist(rebuilt)
        return rebuilt

    def _same_place(self, a: _Call, b: _Call) -> bool:
        """Two loads or stores of one tile at the same address and row stride."""
        if a.tile != b.tile:
            return False
        (pa, sa), (pb, sb) = a.args[1:], b.args[1:]
        if not all(isinstance(p, tvm.ir.Call) and p.op.name == "tirx.address_of" for p in (pa, pb)):
            return False
        la, lb = pa.args[0], pb.args[0]
        return (la.source.same_as(lb.source) and len(la.indices) == len(lb.indices)
                and all(self.analyzer.can_prove_equal(x, y) for x, y in zip(la.indices, lb.indices))
                and self.analyzer.can_prove_equal(sa, sb))

    def _drop_round_trips(self, items: list[tvm.tirx.Stmt]) -> tvm.tirx.Stmt:
        """Drop each accumulator store that the next tile instruction reloads from the same place."""
        out: list[tvm.tirx.Stmt] = []
        pending: Optional[int] = None  # the index in ``out`` of a store not followed by a tile instruction yet
        for item in items:
            call = tile_call(item)
            if call is not None and pending is not None:
                stored = tile_call(out[pending])
                if call.op is TileOp.LOAD and self._same_place(stored, call):
                    del out[pending]
                    pending = None
                    continue
                pending = None
            elif pending is not None and not isinstance(item, tvm.tirx.Bind):
                pending = None
            out.append(item)
            if call is not None and call.op is TileOp.STORE and call.tile == ACCUMULATOR:
                pending = len(out) - 1
        return _seq(out)

    def _hoist(self, loop: tvm.tirx.For) -> tvm.tirx.Stmt:
        """``loop`` with its accumulator loaded before it and stored after it, where its body loads it
        first and stores it last at a place the loop does not move; else ``loop`` unchanged."""
        items = list(loop.body.seq) if isinstance(loop.body, tvm.tirx.SeqStmt) else [loop.body]
        first = next((k for k, item in enumerate(items) if not isinstance(item, tvm.tirx.Bind)), None)
        if first is None or first == len(items) - 1:
            return loop
        load, store = tile_call(items[first]), tile_call(items[-1])
        if not (load and store and load.op is TileOp.LOAD and store.op is TileOp.STORE
                and load.tile == ACCUMULATOR and self._same_place(load, store)):
            return loop
        middle = items[first + 1:-1]
        if any(c.op in (TileOp.LOAD, TileOp.STORE, TileOp.CONFIG) and c.tile in (ACCUMULATOR, None)
               for item in middle for c in _calls(item)):
            return loop
        accumulator = load.args[1].args[0].source.name
        if any(accumulator in _free_vars(item) for item in middle):
            return loop  # the loop reads or writes the accumulator's memory: it must stay up to date
        moving, outside = {loop.loop_var.name}, []
        inside = []
        for bind in items[:first]:
            if _free_vars(bind.value) & moving or not _pure(bind.value):
                moving.add(bind.var.name)
                inside.append(bind)
            else:
                outside.append(bind)
        place = [*load.args[1].args[0].indices, load.args[2], *store.args[1].args[0].indices, store.args[2]]
        if any(_free_vars(x) & moving for x in place):
            return loop
        return _seq([*outside, items[first], _with_body(loop, _seq([*inside, *middle])), items[-1]])


# ------------------------------------------------------------------------------------------ the rewrite
def _keep(stmt: tvm.tirx.Stmt) -> tvm.tirx.Stmt:
    """Rewrite every outermost serial loop nest that holds tile instructions (see the module docstring)."""
    children = children_of(stmt)
    if not children or not _calls(stmt):
        return stmt
    if isinstance(stmt, tvm.tirx.For) and not any(
            isinstance(s, tvm.tirx.For) and s.kind == tvm.tirx.ForKind.PARALLEL for s in _statements(stmt)):
        buffers, found = _config_buffers(stmt), []
        if not buffers <= _free_vars(stmt):
            raise _Unexpected("a tile configuration allocated inside its loops")
        stripped = _strip_config(stmt, buffers, found)
        if not found:
            raise _Unexpected("tile instructions without a configuration")
        return _seq([*found, _Residency().stmt(stripped)])
    return rebuild(stmt, [_keep(c) for c in children])


def keep_tiles(func: tvm.tirx.PrimFunc) -> tvm.tirx.PrimFunc:
    """``func`` with its AMX tile configuration loaded once per thread and its accumulator tiles kept across
    reductions (the module docstring); unchanged if it has no tile instructions or they are in another shape."""
    if not any(c.op is TileOp.CONFIG for c in _calls(func.body)):
        return func
    try:
        return func.with_body(_keep(func.body))
    except _Unexpected as why:
        logger.debug("AMX kernel compiled as TensorIR placed its calls: %s", why)
        return func


def keep_tiles_in(mod: tvm.IRModule) -> tvm.IRModule:
    """:func:`keep_tiles` on every PrimFunc of ``mod`` (a new module where any changed)."""
    changed = {gv: new for gv, func in mod.functions.items()
               if isinstance(func, tvm.tirx.PrimFunc) and (new := keep_tiles(func)) is not func}
    if not changed:
        return mod
    out = mod.clone()
    for gv, func in changed.items():
        out.update_func(gv, func)
    return out
