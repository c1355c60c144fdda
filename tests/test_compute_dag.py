"""ComputeDAG: stages, FLOP counts and the predicates the sketch rules rely on."""

import pytest
from tvm import te

from ansor import AnsorError, ComputeDAG
from ansor.access import IterKind
from ansor.search_task import SearchTask


def dag(name: str) -> ComputeDAG:
    return SearchTask.from_workload(name).compute_dag


# What the DAG's stages say about data flow, asked the way Ansor's fusion rule asks it.
def producers(d: ComputeDAG, stage_id: int) -> list[int]:
    """Stages whose output stage ``stage_id`` reads."""
    reads = set(d.stages[stage_id].block.read_buffers())
    return [i for i, s in enumerate(d.stages) if reads & set(s.block.write_buffers())]


def consumers(d: ComputeDAG, stage_id: int) -> list[int]:
    """Stages that read the output of stage ``stage_id``."""
    writes = set(d.stages[stage_id].block.write_buffers())
    return [i for i, s in enumerate(d.stages) if writes & set(s.block.read_buffers())]


def elementwise_match(d: ComputeDAG, stage_id: int, target_id: int) -> bool:
    """Data flows from ``stage_id`` to ``target_id`` through single-consumer stages, each reading its
    producer's output at exactly its own spatial indices (so a tile maps onto the same tile)."""
    cur = stage_id
    while cur != target_id:
        after = consumers(d, cur)
        if len(after) != 1 or d.stages[after[0]].is_reduction:
            return False
        out, nstage = d.stages[cur].block.writes[0], d.stages[after[0]]
        spatial = [v for v in nstage.block.vars if v.kind == IterKind.SPATIAL]
        if d.buffer_shapes[out.buffer] != tuple(v.extent for v in spatial):
            return False
        for acc in nstage.block.reads_of(out.buffer):
            if [None if i is None or i.const else i.single_var() for i in acc.indices] != [v.name for v in spatial]:
                return False
        cur = after[0]
    return True


def single_elementwise_consumer(d: ComputeDAG, stage_id: int):
    """The id of the only consumer of the stage if it is element-wise matched, else None."""
    after = consumers(d, stage_id)
    return after[0] if len(after) == 1 and elementwise_match(d, stage_id, after[0]) else None


def test_matmul_512_flops_and_stages():
    d = dag("matmul-512")
    assert d.flop_ct == 2 * 512 ** 3
    assert [s.name for s in d.stages] == ["C"]
    c = d.stages[0]
    spatial, reduce = IterKind.SPATIAL, IterKind.REDUCE
    assert [(v.kind, v.extent) for v in c.block.vars] == [(spatial, 512), (spatial, 512), (reduce, 512)]
    assert c.is_output and c.is_reduction and c.needs_multi_level_tiling and not c.strictly_inlineable


def test_conv2d_nhwc_flops_and_padding():
    d = dag("conv2d-nhwc-small")  # 1x14x14x16 -> 32, k3 s1 p1
    assert d.flop_ct == 2 * 14 * 14 * 32 * 3 * 3 * 16
    pad, conv = d.stages
    assert pad.has_branch and not pad.strictly_inlineable  # if_then_else: Ansor never force-inlines it
    assert conv.needs_multi_level_tiling and conv.is_output
    assert producers(d, 1) == [0] and consumers(d, 0) == [1]


def test_conv_bias_relu_predicates():
    d = dag("conv2d-bias-relu")
    names = [s.name for s in d.stages]
    assert names == ["pad", "conv", "bias_add", "relu"]
    pad, conv, bias, relu = d.stages
    assert bias.strictly_inlineable and not bias.needs_multi_level_tiling  # broadcast bias is no data reuse
    assert not relu.strictly_inlineable and relu.is_output
    assert single_elementwise_consumer(d, 1) == 2
    assert elementwise_match(d, 1, 3)  # conv -> bias -> relu, element-wise all the way
    assert not elementwise_match(d, 0, 1)  # pad feeds a conv window, not an element
    n_out = 14 * 14 * 32
    assert d.flop_ct == 2 * n_out * 3 * 3 * 32 + n_out + n_out


def test_softmax_predicates_and_flops():
    d = dag("softmax-4x1024")
    maxelem, exp, expsum, norm = d.stages
    assert maxelem.is_reduction and not maxelem.needs_multi_level_tiling
    assert exp.has_expensive_op and not exp.strictly_inlineable
    assert norm.is_output
    n = 4 * 1024
    assert d.flop_ct == n + 2 * n + n + n  # max; sub + exp; add; div


def test_matmul_relu_elementwise_match():
    d = dag("matmul-relu-64")
    assert single_elementwise_consumer(d, 0) == 1
    assert not d.stages[0].is_output and d.stages[1].is_output


def test_dag_from_te_tensors_and_print():
    a = te.placeholder((8, 8), name="A")
    b = te.compute((8, 8), lambda i, j: a[i, j] * 2.0, name="B")
    d = ComputeDAG([a, b])
    assert d.flop_ct == 64
    assert "B[v_i, v_j]" in str(d) and "FLOPs: 64" in str(d)


def test_bad_source_is_an_ansor_error():
    with pytest.raises(AnsorError, match="PrimFunc or a list of te.Tensor"):
        ComputeDAG("matmul")
