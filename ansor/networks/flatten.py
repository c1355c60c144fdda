"""Row-wise PrimFuncs of any rank become one shape: their leading dimensions collapse into one.

PyTorch exports a transformer's linear layers as matmuls of ``[1, 197, 768]`` activations and a ConvNeXt's
as matmuls of ``[1, 56, 56, 384]`` ones; BERT's exporter flattens them to ``[128, 768]``. The computation is
the same, but the loop nests differ in rank, so a schedule, a database record or a cost-model sample of
one never applies to the other. After fusion, each PrimFunc whose every block iterates the same leading
dimensions, and whose every buffer is indexed by exactly them or not at all, is rewritten with those
dimensions merged (TVM's ``transform_layout`` and ``transform_block_layout``), and its Relax call sites
reshape the arguments and result, which the VM does as free views. Blocks with more than one reduction
axis (convolutions, pooling windows: a 1x1 convolution would qualify) keep their loop nests, and with them
the schedules tuned for them.

On the zoo's held-out models the largest tasks then share their workload shape with BERT's: ViT-B/16's
four matmuls and ConvNeXt-T's MLP matmuls found no schedule of the same operator in the shipped database
before, as 3-D and 4-D loop nests.
"""

from __future__ import annotations

import functools
import logging
from typing import Optional, Sequence

import tvm
from tvm import relax, s_tir, tirx
from tvm.s_tir.meta_schedule.arg_info import ArgInfo

from .calls import replace_prim_funcs

logger = logging.getLogger("ansor")


def flatten_rows(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` (fused) with each row-wise PrimFunc of rank > 2 rewritten over one merged leading
    dimension and its calls reshaped around it; every other function unchanged."""
    flat: dict[str, tirx.PrimFunc] = {}
    shapes: dict[str, tuple[list, list]] = {}
    for gv, func in list(mod.functions_items()):
        if isinstance(func, tirx.PrimFunc):
            merged = flatten_func(func)
            if merged is not None:
                flat[gv.name_hint] = merged
                shapes[gv.name_hint] = ([[int(d) for d in a.shape] for a in ArgInfo.from_prim_func(func)],
                                        [[int(d) for d in a.shape] for a in ArgInfo.from_prim_func(merged)])
    if flat:
        logger.info("flattened the leading dimensions of %d PrimFuncs", len(flat))
    return replace_prim_funcs(mod, flat, lambda name: functools.partial(_reshaped_call, *shapes[name]))


def flatten_func(func: tirx.PrimFunc) -> Optional[tirx.PrimFunc]:
    """``func`` over one merged leading dimension (the most leading dimensions that merge cleanly, at
    least two), or ``None`` when no rewrite leaves every index free of division and modulo."""
    try:
        if is_reshape(func) or len(_outputs(func)) != 1:
            return None
    except Exception:  # TVM's checks raise several error types (no root block: hand-written TIR)
        return None
    layout_free = [int(i) for i in func.attrs["layout_free_buffers"]] \
        if func.attrs is not None and "layout_free_buffers" in func.attrs else []
    args = ArgInfo.from_prim_func(func)
    out_shape = [int(d) for d in args[-1].shape]
    before = None  # printing the function is the costly part: only once a merge applies
    for lead in range(len(out_shape) - 1, 1, -1):
        merged = _merge(func, out_shape[:lead])
        if merged is None:
            continue
        before = _div_mod_count(func) if before is None else before
        if _div_mod_count(merged) > before:
            continue
        new_args = ArgInfo.from_prim_func(merged)
        if all(list(args[i].shape) == list(new_args[i].shape) for i in layout_free):
            return merged
    return None


def _merge(func: tirx.PrimFunc, dims: Sequence[int]) -> Optional[tirx.PrimFunc]:
    """``func`` with the buffers shaped ``dims + ...`` and the blocks iterating ``dims`` first merged."""
    lead = len(dims)

    def collapse(*idx):
        merged = idx[0]
        for i, d in zip(idx[1:lead], dims[1:]):
            merged = merged * d + i
        return (merged, *idx[lead:])

    try:
        sch = s_tir.Schedule(func)
        blocks = sch.get_child_blocks(sch.get_sblock("root"))
        for block in blocks:
            ivs = sch.get(block).iter_vars
            extents = [int(iv.dom.extent) if isinstance(iv.dom.extent, tirx.IntImm) else None for iv in ivs]
            if extents[:lead] != list(dims) or any(iv.iter_type != tirx.IterVar.DataPar for iv in ivs[:lead]) \
                    or sum(iv.iter_type == tirx.IterVar.CommReduce for iv in ivs) > 1:
                return None
        done: set = set()
        for block in blocks:
            node = sch.get(block)
            for kind, regions in (("read", node.reads), ("write", node.writes)):
                for pos, region in enumerate(regions):
                    buf = region.source
                    shape = [int(d) if isinstance(d, tirx.IntImm) else None for d in buf.shape]
                    if buf not in done and shape[:lead] == list(dims):
                        done.add(buf)
                        sch.transform_layout(block, (kind, pos), collapse)
        for block in blocks:
            ndim = len(sch.get(block).iter_vars)
            sch.transform_block_layout(block, tirx.IndexMap.from_func(collapse, ndim=ndim))
        return sch.mod["main"]
    except Exception:  # a primitive's check failed (TVM raises several types): the function stays as it is
        return None


def _div_mod_count(func: tirx.PrimFunc) -> int:
    """Floor divisions and remainders in ``func``: merging dimensions that an index or a condition uses
    other than as the leading indices leaves some behind. (TVM 0.27's Python has no TIR visitor; the
    printed function shows them all.)"""
    text = func.script()
    return text.count("//") + text.count("%")


def _blocks(func: tirx.PrimFunc) -> tuple:
    """``func``'s root block and the blocks under it."""
    sch = s_tir.Schedule(func)
    root = sch.get_sblock("root")
    return sch.get(root), [sch.get(b) for b in sch.get_child_blocks(root)]


def is_reshape(func: tirx.PrimFunc) -> bool:
    """True for a pure reshape: left unscheduled, the Relax VM turns its call into a free view."""
    try:
        return bool(relax.analysis.has_reshape_pattern(func))
    except Exception:  # the analysis gives up on unusual bodies; then it is not a reshape we can prove
        return False


def _outputs(func: tirx.PrimFunc) -> set:
    """The buffers ``func``'s blocks write that its root block does not allocate: its outputs."""
    root, blocks = _blocks(func)
    return {region.source for block in blocks for region in block.writes} - set(root.alloc_buffers)


def _reshaped_call(old: list, new: list, builder: relax.BlockBuilder, call: relax.Call,
                   gv: tvm.ir.GlobalVar) -> relax.Expr:
    """The flattened function called on views of the arguments in its shapes ``new``, its result given
    back as a view in the original shape (``old``)."""
    args = [x if o == n else builder.emit(relax.op.reshape(x, n)) for x, o, n in zip(call.args[1].fields, old, new)]
    flat = builder.emit(relax.op.call_tir(gv, relax.Tuple(args), relax.TensorType(new[-1], call.ty.dtype)))
    return relax.op.reshape(flat, old[-1])
