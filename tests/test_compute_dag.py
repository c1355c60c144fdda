"""ComputeDAG: stages, FLOP counts and the predicates the sketch rules rely on."""

import random

import pytest
from tvm import te

from ansor import AnsorError, ComputeDAG
from ansor.state.access import IterKind
from ansor.task.search_task import SearchTask
from ansor.sketch.annotation import annotate_vectorize
from ansor.sketch.rules import single_elementwise_consumer


def dag(name: str) -> ComputeDAG:
    return SearchTask.from_workload(name).compute_dag


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
    state = d.init_state()
    assert state.producers(1) == [0] and state.consumers(0) == [1]


def test_conv_bias_relu_predicates():
    d = dag("conv2d-bias-relu")
    names = [s.name for s in d.stages]
    assert names == ["pad", "conv", "bias_add", "relu"]
    pad, conv, bias, relu = d.stages
    assert bias.strictly_inlineable and not bias.needs_multi_level_tiling  # broadcast bias is no data reuse
    assert not relu.strictly_inlineable and relu.is_output
    state = d.init_state()
    # conv -> bias -> relu, element-wise all the way (Ansor's fusion test, as the sketch rules ask it)
    assert single_elementwise_consumer(state, 1) == 2 and single_elementwise_consumer(state, 2) == 3
    assert single_elementwise_consumer(state, 0) is None  # pad feeds a conv window, not an element
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
    assert single_elementwise_consumer(d.init_state(), 0) == 1
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


def _product_silu(bits_out: bool, second_reader: bool = False) -> ComputeDAG:
    """A matmul with a fast-math SiLU epilogue (selects, no padding), rounded to bf16 bits or kept fp32."""
    from ansor.networks.fast_math import elementwise
    from ansor.task.te_ops import bf16_matmul, matmul_stage, to_bf16_bits
    a, b = te.placeholder((32, 64), name="A"), te.placeholder((64, 32), name="B")
    act = elementwise((bf16_matmul if bits_out else matmul_stage)(a, b), "silu")
    out = [to_bf16_bits(act)] if bits_out else [te.compute(act.shape, lambda i, j: act[i, j] * 2.0, name="D")]
    if second_reader:
        out.append(te.compute((32,), lambda i: act[i, 0] + act[i, 1], name="E"))
    return ComputeDAG([a, b, *out])


def test_a_bf16_epilogues_selects_inline_into_its_rounding():
    silu = next(s for s in _product_silu(bits_out=True).stages if s.name == "T_fast_silu")
    assert silu.has_branch and silu.selects_only and silu.strictly_inlineable
    # fp32 keeps Ansor's rule; a second reader would recompute it; padding's if_then_else is never such a branch
    assert not next(s for s in _product_silu(bits_out=False).stages if s.name == "T_fast_silu").strictly_inlineable
    two = _product_silu(bits_out=True, second_reader=True)
    assert not next(s for s in two.stages if s.name == "T_fast_silu").strictly_inlineable
    assert not dag("conv2d-nhwc-small").stages[0].selects_only


def test_an_index_affine_only_in_runs_is_vectorized_in_those_runs():
    """A tap pair's ``A16`` (networks/bf16.py) reads pixel ``x + j % 32 // 16``, channel ``j // 32 * 16 + j % 16``:
    not affine in ``j`` but contiguous in aligned runs of 16, which random annotation vectorizes; a channel
    shuffle's ``j % 2 * 20 + j // 2`` has no such run and stays scalar."""
    data = te.placeholder((9, 40), name="data")
    pairs = te.compute((8, 80), lambda x, j: data[x + j % 32 // 16, j // 32 * 16 + j % 16], name="pairs")
    shuffle = te.compute((8, 40), lambda x, j: data[x, j % 2 * 20 + j // 2], name="shuffle")
    d = ComputeDAG([data, pairs, shuffle])
    by_name = {s.name: s for s in d.stages}
    assert by_name["pairs"].block.reads[0].runs == (("v_j", 16),)
    assert by_name["shuffle"].block.reads[0].runs == ()
    state = d.init_state()
    annotate_vectorize(state, random.Random(0))
    vectorized = {s.name: [(it.extent, it.annotation) for it in s.iters if it.annotation == "vectorize"]
                  for s in state.stages}
    assert vectorized == {"pairs": [(16, "vectorize")], "shuffle": []}
