"""AMX kernels that keep their tiles: one tile configuration per thread, accumulator tiles kept in their
registers across the reduction, up to four of them side by side. A rewrite of the TIR that TVM hands LLVM
(:mod:`ansor.codegen` runs it for targets with AMX).

The tile product intrinsic (``tile_16x16x32`` of :mod:`ansor.state.tensor_intrin`, or one of fewer rows) is
one self-contained call: it fills a 64-byte tile configuration and loads it (``ldtilecfg``), loads the
accumulator tile C (tile 0), A (1 or 4) and B (2 or 6), multiplies (``tdpbf16ps``) and stores C back. That
is correct wherever TensorIR
places the call, but each 16x16x32 product (16 K flops) then moves the configuration and C's 1 KB through
memory twice, and TensorIR has no way to say that a value lives in a tile register between two calls. So,
on the lowered kernel:

- the configuration, of all 8 tiles (their rows those of the intrinsic's tiles: :data:`TILE_REGISTERS`), is
  loaded once before the outermost run of statements holding tile instructions (in a parallel loop,
  inside its body: a tile configuration belongs to a thread), and every copy the calls made is dropped;
- a loop whose body loads its accumulator tiles first and stores them last, at addresses the loop does not
  move (a reduction loop directly around the call), loads them before the loop and stores them after;
- in unrolled calls, a store of the accumulator followed by a load of it from the same address is dropped;
- consecutive output tiles (the AMX sketch unrolls them: ``tensor_rules.AMX_STRUCTURE``), each its load,
  a reduction loop of products (or one product) and its store, become one loop updating up to
  :data:`MAX_ACCUMULATORS` tiles, where an A or B tile two products read is loaded once.

A kernel whose tile instructions come in any other shape is left as it is (each call is correct alone).
"""

from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass, field, replace
from typing import Optional

import tvm
from tvm import sym

from .tile_ir import (
    TileCall, TileOp, Unexpected, calls_in, children_of, const_int, evaluate, free_vars, is_op, items_of, memo,
    memoizing, pure, rebuild, seq, statements, tile_call, with_body,
)

logger = logging.getLogger("ansor")

#: The tile the intrinsic accumulates in (A and B: tiles 1 and 2, or 4 and 6 for fewer than 16 rows).
ACCUMULATOR = 0
#: AMX's tile registers, each configured here as rows of 64 bytes: 16 rows, or for a tile product of M
#: rows, M rows but for the last two (B's 16 k pairs).
TILE_REGISTERS = 8
#: The tile registers (C, A, B) of the 16-row tile product, and of one of fewer rows, where each register
#: keeps one shape: tiles 0-5 of M rows (accumulators 0-3, A 4-5), 6 and 7 of B's 16 k pairs.
TILES, SHAPED_TILES = (0, 1, 2), (0, 4, 6)
#: Merged products of fewer rows take their A and B tiles from these registers.
_SHAPED_POOLS = {SHAPED_TILES[1]: (4, 5), SHAPED_TILES[2]: (6, 7)}
#: Accumulators updated side by side in one reduction loop: oneDNN's AMX kernel keeps 4 (2 x 2 output
#: tiles), so that each A and B tile loaded serves two products; the other 4 registers hold them.
MAX_ACCUMULATORS = 4


# ------------------------------------------------------------------------------------------ configuration
def _config_buffer(stmt: tvm.tirx.Stmt) -> Optional[str]:
    """The name of the buffer variable an ``ldtilecfg`` statement reads its configuration from."""
    call = tile_call(stmt)
    return None if call is None or call.op is not TileOp.CONFIG else _config_name(call)


def _config_name(call: TileCall) -> str:
    address = call.args[0]
    if not (isinstance(address, tvm.ir.Call) and address.op.name == "tirx.address_of"
            and isinstance(address.args[0], tvm.ir.TensorLoad)):
        raise Unexpected("ldtilecfg of a computed address")
    return address.args[0].source.name


def _fills(stmt: tvm.tirx.Stmt, buffers: set[str]) -> bool:
    """Whether ``stmt`` only writes into configuration buffers (only the intrinsic does, with constants)."""
    if isinstance(stmt, tvm.tirx.BufferStore):
        return stmt.buffer.name in buffers
    if isinstance(stmt, tvm.tirx.For) and stmt.kind != tvm.tirx.ForKind.PARALLEL:
        return _fills(stmt.body, buffers)
    if isinstance(stmt, tvm.tirx.SeqStmt):
        return all(_fills(c, buffers) for c in stmt.seq)
    return False


def _config_buffers(stmt: tvm.tirx.Stmt) -> set[str]:
    return {_config_name(c) for c in calls_in(stmt) if c.op is TileOp.CONFIG}


def _strip_config(stmt: tvm.tirx.Stmt, buffers: set[str], found: list[tvm.tirx.Stmt]) -> tvm.tirx.Stmt:
    """``stmt`` without the configuration's fills and loads; each ``ldtilecfg`` goes to ``found``."""
    if isinstance(stmt, tvm.tirx.SeqStmt):
        items = []
        for item in stmt.seq:
            if _config_buffer(item) is not None:
                found.append(item)
            elif not _fills(item, buffers):
                items.append(_strip_config(item, buffers, found))
        return seq(items) if items else tvm.tirx.Evaluate(0)
    if _config_buffer(stmt) is not None:
        raise Unexpected("an ldtilecfg alone in a loop")
    children = children_of(stmt)
    if not children or not calls_in(stmt):
        return stmt
    return rebuild(stmt, [_strip_config(c, buffers, found) for c in children])


# ------------------------------------------------------------------------------------------ accumulators
@dataclass
class _Block:
    """One output tile of the single-tile intrinsic: its accumulator's load, then a loop of A and B loads
    and products (kept across it) or one load of each and their product, then its store."""

    binds: list  # the Binds before the load (its address's terms)
    load: TileCall
    body: list  # [the loop] or the statements between the load and the store
    store: TileCall

    @property
    def loop(self) -> Optional[tvm.tirx.For]:
        return self.body[0] if len(self.body) == 1 and isinstance(self.body[0], tvm.tirx.For) else None


@dataclass
class _Residency:
    """Moves accumulator loads and stores out of the loops and unrolled runs that do not need them, and
    runs up to :data:`MAX_ACCUMULATORS` accumulators side by side in one loop."""

    rows: int = 16  # of the accumulator tiles
    binds: list = field(default_factory=list)  # every (var, value) bound so far, for fresh analyzers
    analyzer: sym.Analyzer = field(default_factory=sym.Analyzer)

    def stmt(self, stmt: tvm.tirx.Stmt) -> tvm.tirx.Stmt:
        if isinstance(stmt, tvm.tirx.Bind):
            self.binds.append((stmt.var, stmt.value))
            self.analyzer.bind(stmt.var, stmt.value)
            return stmt
        children = children_of(stmt)
        if not children or not calls_in(stmt):
            return stmt
        rebuilt = rebuild(stmt, [self.stmt(c) for c in children])
        if isinstance(rebuilt, tvm.tirx.SeqStmt):
            return self._side_by_side(items_of(self._drop_round_trips(list(rebuilt.seq))))
        if isinstance(rebuilt, tvm.tirx.For) and rebuilt.kind in (tvm.tirx.ForKind.SERIAL,
                                                                   tvm.tirx.ForKind.UNROLLED):
            return self._hoist(rebuilt)
        return rebuilt

    def _same_address(self, a: TileCall, b: TileCall, analyzer: Optional[sym.Analyzer] = None) -> bool:
        """Two loads or stores at the same address and row stride (whatever their tiles)."""
        analyzer = analyzer or self.analyzer
        (pa, sa), (pb, sb) = a.args[1:], b.args[1:]
        if not all(isinstance(p, tvm.ir.Call) and p.op.name == "tirx.address_of" for p in (pa, pb)):
            return False
        la, lb = pa.args[0], pb.args[0]
        return (la.source.same_as(lb.source) and len(la.indices) == len(lb.indices)
                and all(analyzer.can_prove_equal(x, y) for x, y in zip(la.indices, lb.indices))
                and analyzer.can_prove_equal(sa, sb))

    def _same_place(self, a: TileCall, b: TileCall) -> bool:
        """Two loads or stores of one tile at the same address and row stride."""
        return a.tile == b.tile and self._same_address(a, b)

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
            elif pending is not None and not (isinstance(item, tvm.tirx.Bind) and pure(item.value)):
                pending = None
            out.append(item)
            if call is not None and call.op is TileOp.STORE and call.tile == ACCUMULATOR:
                pending = len(out) - 1
        return seq(out)

    def _hoist(self, loop: tvm.tirx.For) -> tvm.tirx.Stmt:
        """``loop`` with its accumulators loaded before it and stored after it, where its body loads them
        first and stores them last at places the loop does not move; else ``loop`` unchanged."""
        items = items_of(loop.body)
        first = next((k for k, item in enumerate(items) if not isinstance(item, tvm.tirx.Bind)), len(items))
        end = first
        while end < len(items) and is_op(items[end], TileOp.LOAD):
            end += 1
        last = len(items)
        while last > end and is_op(items[last - 1], TileOp.STORE):
            last -= 1
        middle, stores = items[end:last], [tile_call(x) for x in items[last:]]
        accumulators = {int(c.args[0]) for item in middle for c in calls_in(item) if c.op is TileOp.DOT}
        loads = [tile_call(x) for x in items[first:end]]
        kept = [x for x, c in zip(items[first:end], loads) if c.tile in accumulators]
        others = [x for x, c in zip(items[first:end], loads) if c.tile not in accumulators]
        by_tile = {c.tile: c for c in loads if c.tile in accumulators}
        if (not accumulators or len(kept) != len(accumulators) or set(by_tile) != accumulators
                or sorted(c.tile for c in stores) != sorted(accumulators)
                or not all(self._same_place(by_tile[c.tile], c) for c in stores)):
            return loop
        if any(c.op is TileOp.CONFIG or c.op in (TileOp.LOAD, TileOp.STORE) and c.tile in accumulators
               for item in middle for c in calls_in(item)):
            return loop
        buffers = {c.args[1].args[0].source.name for c in stores}
        moving, outside, inside = {loop.loop_var.name}, [], []
        for bind in items[:first]:
            if free_vars(bind.value) & moving or not pure(bind.value):
                moving.add(bind.var.name)
                inside.append(bind)
            else:
                outside.append(bind)
        if any(buffers & free_vars(item) for item in [*inside, *others, *middle]):
            return loop  # the loop reads or writes the accumulators' memory: it must stay up to date
        # Both ends move out of the loop: their addresses may use neither its variable nor what it binds.
        moving |= {x.var.name for x in middle if isinstance(x, tvm.tirx.Bind)}
        places = [x for c in [*by_tile.values(), *stores] for x in (*c.args[1].args[0].indices, c.args[2])]
        if any(free_vars(x) & moving for x in places):
            return loop
        return seq([*outside, *kept, with_body(loop, seq([*inside, *others, *middle])), *items[last:]])

    # ---------------------------------------------------------------------- accumulators side by side
    def _block_at(self, items: list[tvm.tirx.Stmt], start: int) -> Optional[tuple[_Block, int]]:
        """The block (:class:`_Block`) starting at ``items[start]``, and the index after it."""
        k = start
        while k < len(items) and isinstance(items[k], tvm.tirx.Bind):
            k += 1
        load = tile_call(items[k]) if k < len(items) else None
        if not (load and load.op is TileOp.LOAD and load.tile == ACCUMULATOR):
            return None
        end = next((e for e in range(k + 1, len(items)) if is_op(items[e], TileOp.STORE)), None)
        if end is None:
            return None
        store, body = tile_call(items[end]), items[k + 1:end]
        if store.tile != ACCUMULATOR or not self._same_place(load, store):
            return None
        calls = [c for item in body for c in calls_in(item)]
        looped = len(body) == 1 and isinstance(body[0], tvm.tirx.For)
        if not calls or not (looped or all(isinstance(x, tvm.tirx.Bind) or tile_call(x) for x in body)):
            return None
        if any(c.op in (TileOp.CONFIG, TileOp.STORE) or c.tile == ACCUMULATOR
               or c.op is TileOp.DOT and tuple(int(x) for x in c.args) not in (TILES, SHAPED_TILES) for c in calls):
            return None
        return _Block(items[start:k], load, body, store), end + 1

    def _side_by_side(self, items: list[tvm.tirx.Stmt]) -> tvm.tirx.Stmt:
        """Consecutive blocks of the single-tile intrinsic (an unrolled loop of output tiles around a
        reduction loop) merged into one reduction loop updating up to :data:`MAX_ACCUMULATORS` tiles: the A
        and B tiles two products share are loaded once."""
        out: list[tvm.tirx.Stmt] = []
        k = 0
        while k < len(items):
            run, end = [], k
            while (found := self._block_at(items, end)) is not None:
                run.append(found[0])
                end = found[1]
            if len(run) < 2:
                out.append(items[k])
                k += 1
                continue
            done = 0
            while done < len(run):
                for size in range(min(MAX_ACCUMULATORS, len(run) - done), 0, -1):
                    merged = self._merge_blocks(run[done:done + size]) if size > 1 else None
                    if merged is not None or size == 1:
                        block = run[done]
                        out += merged or [*block.binds, evaluate(block.load), *block.body, evaluate(block.store)]
                        done += size
                        break
            k = end
        return seq(out)

    def _fresh_analyzer(self) -> sym.Analyzer:
        analyzer = sym.Analyzer()
        for var, value in self.binds:
            analyzer.bind(var, value)
        return analyzer

    def _merge_blocks(self, blocks: list[_Block]) -> Optional[list[tvm.tirx.Stmt]]:
        """``blocks`` as one loop over their accumulators 0..n-1, or None where their loops differ, their
        outputs may overlap or their tiles would not fit the 8 tile registers."""
        if not all(_disjoint(a.load, b.load, self.analyzer, self.rows) for a, b in itertools.combinations(blocks, 2)):
            return None
        # The loads and every block's leading Binds move before every body, the stores after: none may use
        # what a body binds. The bodies run before earlier blocks' stores: they may not read the outputs.
        inner = [x for b in blocks for item in b.body for x in statements(item) if isinstance(x, tvm.tirx.Bind)]
        bound = {x.var.name for x in inner}
        if any(free_vars(x) & bound for b in blocks for c in (b.load, b.store)
               for x in (*c.args[1].args[0].indices, c.args[2])):
            return None
        leading = [x for b in blocks for x in b.binds]
        if any(free_vars(x.value) & bound for x in leading) or not all(pure(x.value) for x in leading + inner):
            return None
        outputs = [b.load.args[1].args[0].source for b in blocks]
        operands = [c.args[1].args[0].source for b in blocks for item in b.body for c in calls_in(item)
                    if c.op is TileOp.LOAD]
        if any(o.same_as(out) or o.name == out.name for o in operands for out in outputs):
            return None
        analyzer = self._fresh_analyzer()
        tiles = _Tiles(len(blocks), analyzer, self)
        loops = [b.loop for b in blocks]
        if all(loop is not None for loop in loops):
            merged = self._merge_loops(loops, tiles)
            body = None if merged is None else [merged]
        elif not any(loops):
            body = _merge_statements([b.body for b in blocks], tiles)
        else:
            return None
        if body is None:
            return None
        for var, value in tiles.bound:
            self.binds.append((var, value))
            self.analyzer.bind(var, value)
        loads = [evaluate(replace(b.load, args=(tvm.tirx.const(j, "int8"), *b.load.args[1:])))
                 for j, b in enumerate(blocks)]
        stores = [evaluate(replace(b.store, args=(tvm.tirx.const(j, "int8"), *b.store.args[1:])))
                  for j, b in enumerate(blocks)]
        return [*(bind for b in blocks for bind in b.binds), *loads, *body, *stores]

    def _merge_loops(self, loops: list[tvm.tirx.For], tiles: "_Tiles") -> Optional[tvm.tirx.For]:
        """One loop nest running each of ``loops``' bodies in turn (block j's products into tile j)."""
        head = loops[0]
        if not all(isinstance(x, tvm.tirx.For) and x.kind == head.kind and x.step is None
                   and const_int(x.min) == const_int(head.min) is not None
                   and const_int(x.extent) == const_int(head.extent) is not None for x in loops):
            return None
        bodies = [items_of(x.body) for x in loops]
        nested = [isinstance(items[-1], tvm.tirx.For) for items in bodies]
        if any(nested) and not all(nested):
            return None
        bound = [[tiles.bind(x.loop_var, head.loop_var)] if j and not x.loop_var.same_as(head.loop_var) else []
                 for j, x in enumerate(loops)]
        if not any(nested):
            body = _merge_statements([b + items for b, items in zip(bound, bodies)], tiles)
            return None if body is None else with_body(head, seq(body))
        outer = [items[:-1] for items in bodies]
        if not all(isinstance(x, tvm.tirx.Bind) for items in outer for x in items):
            return None
        inner = self._merge_loops([items[-1] for items in bodies], tiles)
        if inner is None:
            return None
        return with_body(head, seq([x for b, items in zip(bound, outer) for x in (*b, *items)] + [inner]))


@dataclass
class _Tiles:
    """Tile registers of merged blocks: block j accumulates in tile j; each distinct A or B address of one
    iteration gets the next free tile, loaded once."""

    accumulators: int
    analyzer: sym.Analyzer
    residency: _Residency
    loaded: list = field(default_factory=list)  # (tile, load call) of this iteration's operands
    renames: dict = field(default_factory=dict)  # (block, its tile) -> tile
    bound: list = field(default_factory=list)

    def bind(self, var: tvm.tirx.Var, value: tvm.tirx.PrimExpr) -> tvm.tirx.Stmt:
        self.analyzer.bind(var, value)
        self.bound.append((var, value))
        return tvm.tirx.Bind(var, value)

    def rename(self, block: int, item: tvm.tirx.Stmt):
        """``item`` with block ``block``'s tiles renamed; None: a load of an operand already loaded; False:
        not a tile instruction of the single-tile intrinsic, or out of tiles."""
        call = tile_call(item)
        if call is None:
            return False
        if call.op is TileOp.DOT:
            a, b = (self.renames.get((block, int(t))) for t in call.args[1:])
            if a is None or b is None or a == b:  # tdpbf16ps faults on a tile named twice
                return False
            return evaluate(replace(call, args=tuple(tvm.tirx.const(t, "int8") for t in (block, a, b))))
        for tile, earlier in self.loaded:
            if self.residency._same_address(earlier, call, self.analyzer):
                self.renames[block, call.tile] = tile
                return None
        pool = _SHAPED_POOLS.get(call.tile)
        if pool is None:
            tile = self.accumulators + len(self.loaded)
        else:
            used = {t for t, _ in self.loaded}
            tile = next((t for t in pool if t not in used), TILE_REGISTERS)
        if tile >= TILE_REGISTERS:
            return False
        self.loaded.append((tile, call))
        self.renames[block, call.tile] = tile
        return evaluate(replace(call, args=(tvm.tirx.const(tile, "int8"), *call.args[1:])))


def _merge_statements(bodies: list[list[tvm.tirx.Stmt]], tiles: _Tiles) -> Optional[list[tvm.tirx.Stmt]]:
    """Blocks' statements (Binds and tile instructions) one after the other, their tiles renamed."""
    out: list[tvm.tirx.Stmt] = []
    for j, items in enumerate(bodies):
        for item in items:
            if isinstance(item, tvm.tirx.Bind):  # bound already: the fresh analyzer has every Bind seen
                out.append(item)
            elif (renamed := tiles.rename(j, item)) is not False:
                out += [renamed] if renamed is not None else []
            else:
                return None
    return out


def _disjoint(a: TileCall, b: TileCall, analyzer: sym.Analyzer, rows: int = 16) -> bool:
    """Whether the tiles (``rows`` rows of 64 bytes) that loads ``a`` and ``b`` read provably do not overlap: the same
    buffer (two buffers may view one memory), the same constant row stride, offsets a constant apart."""
    la, lb = a.args[1].args[0], b.args[1].args[0]
    if not la.source.same_as(lb.source) or len(la.indices) != 1 or len(lb.indices) != 1:
        return False
    stride = const_int(analyzer.simplify(a.args[2]))  # bytes
    if stride is None or stride != const_int(analyzer.simplify(b.args[2])):
        return False
    gap = const_int(analyzer.simplify(lb.indices[0] - la.indices[0]))
    if gap is None:
        return False
    gap *= tvm.runtime.DataType(str(la.source.dtype)).bits // 8  # bytes
    return all(abs(gap - r * stride) >= 64 for r in range(1 - rows, rows))


# ------------------------------------------------------------------------------------------ the rewrite
def _keep(stmt: tvm.tirx.Stmt) -> tvm.tirx.Stmt:
    """Rewrite each outermost run of statements holding tile instructions and no parallel loop (module
    docstring): its configuration first, then its tiles kept."""
    children = children_of(stmt)
    if not children or not calls_in(stmt):
        return stmt
    serial = isinstance(stmt, tvm.tirx.For) and stmt.kind != tvm.tirx.ForKind.PARALLEL
    items = items_of(stmt) if serial or isinstance(stmt, tvm.tirx.SeqStmt) else []
    tiled = [k for k, item in enumerate(items) if calls_in(item)]
    if not tiled or any(_parallel(item) for item in items[tiled[0]:tiled[-1] + 1]):
        return rebuild(stmt, [_keep(c) for c in children])
    region = seq(items[tiled[0]:tiled[-1] + 1])
    buffers, found = _config_buffers(region), []
    if not buffers <= free_vars(region):
        raise Unexpected("a tile configuration allocated inside its loops")
    rows = _configured_rows(region, buffers)
    stripped = _strip_config(region, buffers, found)
    if not found:
        raise Unexpected("tile instructions without a configuration")
    return seq([*items[:tiled[0]], *_every_tile(found[0], rows), _Residency(rows).stmt(stripped),
                 *items[tiled[-1] + 1:]])


def _parallel(stmt: tvm.tirx.Stmt) -> bool:
    """Whether ``stmt`` holds a parallel loop (memoized for the kernel being rewritten)."""
    found = memo("parallel")
    if found is not None and stmt in found:
        return found[stmt]
    parallel = (isinstance(stmt, tvm.tirx.For) and stmt.kind == tvm.tirx.ForKind.PARALLEL
                or any(_parallel(c) for c in children_of(stmt)))
    if found is not None:
        found[stmt] = parallel
    return parallel


def _configured_rows(region: tvm.tirx.Stmt, buffers: set[str]) -> int:
    """The rows the intrinsic's calls in ``region`` configure their accumulator tile with (one number; the
    zeros are the configuration's clearing, which lowering may unroll)."""
    rows = {int(x.value.value) for x in statements(region)
            if isinstance(x, tvm.tirx.BufferStore) and x.buffer.name in buffers and len(x.indices) == 1
            and const_int(x.indices[0]) == 48 + ACCUMULATOR and isinstance(x.value, tvm.tirx.IntImm)} - {0}
    if len(rows) != 1 or max(rows) > 16:
        raise Unexpected(f"tile products configured with rows {sorted(rows)}")
    return rows.pop()


def _every_tile(load: tvm.tirx.Stmt, rows: int) -> list[tvm.tirx.Stmt]:
    """A configuration of all 64 bytes, then the intrinsic's ``ldtilecfg`` ``load``: palette 1, every tile
    register ``rows`` rows of 64 bytes but the last two, 16 rows (the intrinsic configures its 3; merged
    blocks use up to 8; for 16 rows, all 16), the rest zero."""
    buffer = tile_call(load).args[0].args[0].source
    heights = [rows] * (TILE_REGISTERS - 2) + [16, 16]
    shape = {0: 1, **{16 + 2 * t: 64 for t in range(TILE_REGISTERS)},
             **{48 + t: heights[t] for t in range(TILE_REGISTERS)}}
    return [*(tvm.tirx.BufferStore(buffer, tvm.tirx.const(shape.get(i, 0), "uint8"), [tvm.tirx.const(i, "int32")])
              for i in range(64)), load]


def keep_tiles(func: tvm.tirx.PrimFunc) -> tvm.tirx.PrimFunc:
    """``func`` with its AMX tile configuration loaded once per thread and its accumulator tiles kept across
    reductions (the module docstring); unchanged if it has no tile instructions or they are in another shape."""
    try:
        with memoizing():
            if any(c.op is TileOp.CONFIG for c in calls_in(func.body)):
                return func.with_body(_keep(func.body))
    except Unexpected as why:
        logger.debug("AMX kernel compiled as TensorIR placed its calls: %s", why)
    except Exception as err:  # a bug here must not fail the build: the calls are correct as placed
        logger.warning("AMX tile rewrite failed (%s: %s); the kernel keeps its self-contained tile calls",
                       type(err).__name__, err)
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
