"""Prepare a network for a CPU: weights as constants, convolutions in NHWC, fast transcendental math.

What a user brings (an ONNX export of a PyTorch model) is NCHW with OIHW weights passed as arguments; our
CPU search does best on NHWC convolutions, and the schedule may choose each constant weight's layout
(:mod:`ansor.state.layout_rewrite`). So before task extraction:

1. **Weights become constants** (``BindParams``), when their values are known: a weight that is an
   argument cannot be packed at compile time, and a weight transpose would run at every inference.
2. **NCHW convolutions become NHWC** (NCDHW ones NDHWC; ``ConvertLayout``); transposes are inserted where layouts meet, at
   the model's edges, and the weight transposes are folded into the constants here (numpy, not TVM's
   ``FoldConstant``, which compiles a kernel per weight: 18 s for ResNet-50, against 0.6 s). TVM's ONNX
   ``Clip`` is turned back into Relax operators first, or layout conversion stops at every ReLU6.
3. **Transposes move below element-wise operators** (:mod:`.transpose_sinking`) and cancel where they meet
   their inverse: ConvNeXt permutes its activations to NCHW for its layer scale and residual add, and its
   next convolution, now NHWC, permuted them back (63 of ConvNeXt-T's 68 transposes go, and 8 of its 33
   tasks: the layer scale and residual add become the linear layer's epilogue). A ``take`` of one constant
   index through reshapes and transposes becomes a slice of their source (:mod:`.slice_takes`): attention's
   split of a fused QKV projection, which was a transposed copy and three copies out of it.
4. **Bilinear resizes written NCHW run in two passes** (:mod:`.separable_resize`), along the rows, then down
   the columns reading whole rows, not four gathers an output; an NHWC one whose only reader permutes it to
   NCHW writes NCHW (other NHWC ones stay: their loads run along the channels).
5. **Convolutions that mostly read padding are cut into regions** (:mod:`.padding_taps`) that compute only
   the kernel taps in bounds: DeepLabV3's dilation-36 ASPP convolution on a 33x33 map becomes a 1x1 one.
6. **Output channels fill whole vectors** (:mod:`.channel_padding`, given the target's vector width): a
   convolution with a long reduction whose output channels are not a multiple of the vector length (a
   classifier's 1000 on AVX-512) computes zero channels up to one, and a slice drops them (in bf16 the
   products pad their channels themselves, to whole dot products: :func:`.bf16.whole_lanes`).
7. **3x3 stride-1 convolutions use Winograd F(2x2, 3x3)** (:mod:`.winograd`, ``winograd=False`` keeps
   them direct): 16 multiply-adds per output tile and channel pair instead of 36. In bf16
   (``precision``), the convolutions and dense layers take bf16 inputs instead (:mod:`.bf16`), all direct:
   the Winograd transforms would round their inputs' sums and differences to bf16's 8 bits.
8. **Fast math** (:mod:`.fast_math`, ``fast_math=False`` keeps the exact operators): float32 ``exp``,
   ``sigmoid``, SiLU, ``tanh``, ``erf``, GELU and softmax become vectorizable versions (a few ulps; NaN and
   ±inf as the exact functions). LLVM calls libm's scalar ``expf``/``erff`` per element otherwise: one
   BERT GELU over 128 x 3072 elements took 3.6 ms, a sigmoid epilogue ~3 ns an element.

The prepared network computes the same outputs; it takes only the data inputs.
"""

from __future__ import annotations

import dataclasses
import logging

import numpy as np
import tvm
import tvm_ffi
from tvm import relax, te, topi

from ..errors import short_message
from ..task.precision import Precision
from .bf16 import use_bf16
from .calls import called_prim_func
from .channel_padding import pad_output_channels
from .fast_math import use_fast_math
from .network import Network, NetworkError
from .conv_rewrite import bound_constant
from .padding_taps import MAX_USEFUL_SHARE, MAX_USEFUL_SHARE_BF16, skip_padding_taps
from .separable_resize import separable_resizes
from .slice_takes import slice_takes
from .transpose_sinking import sink_transposes
from .winograd import winograd_convs

logger = logging.getLogger("ansor")

#: Data layouts :func:`prepare` can give the convolutions ("keep": leave them as the model has them).
LAYOUTS = ("NHWC", "keep")
#: "NHWC": the channels-last layout of each convolution, and of its weights. 3D ones too: R3D-18's NCDHW
#: convolutions, tuned for 10 minutes, ran 4.3 times slower than OpenVINO (its default build 4.2 s).
CHANNELS_LAST = {"relax.nn.conv2d": ["NHWC", "HWIO"], "relax.nn.conv3d": ["NDHWC", "DHWIO"]}


def prepare(network: Network, layout: str = "NHWC", bind_weights: bool = True, fast_math: bool = True,
            winograd: bool = True, vector_bytes: int = 0, precision: Precision = Precision.FP32,
            amx: bool = False) -> Network:
    """The network ready for extraction on a CPU (see the module notes); ``network`` is left unchanged.
    ``vector_bytes`` is the width of the CPU's vector registers (0: output channels are never padded);
    ``precision`` bf16 computes the convolutions and dense layers in bf16 (:mod:`.bf16`), none by Winograd;
    ``amx``: the target has AMX tiles (bf16 pads dense layers' rows for them)."""
    if layout not in LAYOUTS:
        raise NetworkError(f"unknown layout {layout!r}; choose one of {', '.join(LAYOUTS)}")
    mod = network.mod
    weights, params = network.weights, network.param_factory
    try:
        if bind_weights and network.weights:
            values = network.params
            mod = relax.transform.BindParams(network.entry, {w.name: values[w.name] for w in network.weights})(mod)
            weights, params = (), dict
        mod = fold_constants(mod)
        mod = _rewrite_functions(mod, _ClampsAsOperators, mod)
        converted = layout == "NHWC" and _has_nchw_conv(mod)
        if converted:
            mod = relax.transform.ConvertLayout(CHANNELS_LAST)(mod)
            mod = fold_constants(mod)
        mod = sink_transposes(mod)
        mod = slice_takes(mod)
        mod = separable_resizes(mod)
        mod = skip_padding_taps(mod, MAX_USEFUL_SHARE_BF16 if precision.bf16 else MAX_USEFUL_SHARE)
        if vector_bytes and not precision.bf16:  # bf16 pads its products' channels itself
            mod = pad_output_channels(mod, vector_bytes)
        if precision.bf16:
            mod = use_bf16(mod, amx, shared=precision is Precision.BF16_STORED)
        elif winograd:
            mod = winograd_convs(mod)
        if fast_math:
            mod = use_fast_math(mod)
    except NetworkError:
        raise
    except Exception as err:  # TVM reports unsupported operators with a long trace
        raise NetworkError(f"cannot prepare network {network.name}: {short_message(err, None, pick='last')}") from None
    logger.info("network %s prepared: weights %s, convolutions %s, fast math %s", network.name,
                "bound as constants" if not weights else "left as arguments",
                "converted to NHWC" if converted else "in their own layout", "on" if fast_math else "off")
    return dataclasses.replace(network, mod=mod, weights=weights, param_factory=params,
                               layout="NHWC" if converted else network.layout)


def _has_nchw_conv(mod: tvm.IRModule) -> bool:
    found = []

    def visit(expr) -> None:
        if isinstance(expr, relax.Call) and getattr(expr.op, "name", "") in CHANNELS_LAST:
            found.append(str(expr.attrs.data_layout) in ("NCHW", "NCDHW"))

    for _, func in mod.functions_items():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, visit)
    return any(found)


@relax.expr_functor.mutator
class _ConstantFolder(relax.PyExprMutator):
    """``permute_dims``, ``reshape``, ``isnan`` and ``where`` of constants become constants (numpy), and so do
    the index arithmetic TVM's ONNX importer wraps around a ``Gather`` (``take`` of a static shape, ``add``,
    ``less``), so that the gathered index is a constant (:mod:`.slice_takes`)."""

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        name = getattr(call.op, "name", "")
        if name == "relax.shape_to_tensor":
            dims = getattr(call.args[0].ty, "values", None)
            if dims is None or not all(isinstance(d, tvm.tirx.IntImm) for d in dims):
                return call
            return relax.const(np.array([int(d) for d in dims], dtype="int64"), "int64")
        if name not in ("relax.permute_dims", "relax.reshape", "relax.isnan", "relax.where", "relax.take",
                        "relax.add", "relax.less"):
            return call
        tensors = call.args[:1] if name == "relax.reshape" else call.args
        values = [bound_constant(self, arg) for arg in tensors]
        if any(v is None for v in values):
            return call
        if name == "relax.permute_dims":
            axes = call.attrs.axes
            value = np.transpose(values[0], None if axes is None else [int(a) for a in axes])
        elif name == "relax.reshape":
            shape = call.args[1]
            if not isinstance(shape, relax.ShapeExpr) or not all(isinstance(d, tvm.tirx.IntImm) for d in shape.values):
                return call
            value = values[0].reshape([int(d) for d in shape.values])
        elif name == "relax.take":
            axis = call.attrs.axis
            value = np.take(values[0], values[1], axis=None if axis is None else int(axis),
                            mode="wrap" if str(call.attrs.mode) == "wrap" else "clip")
        elif name in ("relax.add", "relax.less"):
            if values[0].size > 1 or values[1].size > 1:  # index arithmetic only: weights keep their kernels
                return call
            value = (np.add if name == "relax.add" else np.less)(*values)
        else:
            value = np.isnan(values[0]) if name == "relax.isnan" else np.where(*values)
        value = np.array(value, order="C")  # np.ascontiguousarray would make a 0-d array 1-d
        return relax.const(value, str(value.dtype))


_CLAMPS = {"maximum": (topi.maximum, relax.op.maximum), "minimum": (topi.minimum, relax.op.minimum)}


@relax.expr_functor.mutator
class _ClampsAsOperators(relax.PyExprMutator):
    """A TIR call of TOPI's ``maximum``/``minimum`` with a constant bound -> the Relax operator.

    TVM's ONNX importer makes ``Clip`` (ReLU6 in every PyTorch export) two such opaque calls, which layout
    conversion cannot see through: an NHWC MobileNet-V2 then transposed its activations to NCHW and back
    around each of its 35 ReLU6s. The Relax operators convert, and fuse into the convolution before them.
    A call is replaced only if its PrimFunc is exactly TOPI's for those shapes.
    """

    def __init__(self, mod: tvm.IRModule):
        super().__init__(mod)
        self._module = mod

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        name = called_prim_func(call)
        if name is None:
            return call
        gv, args = call.args[0], list(call.args[1].fields)
        clamp = _CLAMPS.get(name.rstrip("0123456789"))
        if clamp is None or len(args) != 2:
            return call
        bound = self.lookup_binding(args[1]) if isinstance(args[1], relax.Var) else args[1]
        if not isinstance(bound, tvm.ir.expr.Constant) or not _is_topi(self._module[gv], clamp[0], args):
            return call
        return clamp[1](args[0], bound)


def _is_topi(func, compute, args) -> bool:
    """True if ``func`` is what ``compute`` (a TOPI elementwise op) makes for arguments of these types."""
    try:
        holders = [te.placeholder([tvm.tirx.IntImm("int64", int(d)) for d in a.ty.shape], str(a.ty.dtype))
                   for a in args]
        ref = te.create_prim_func([*holders, compute(*holders)])
    except Exception:  # an argument without a static shape
        return False
    return len(func.params) == len(ref.params) and tvm_ffi.structural_equal(func.body, ref.body, map_free_vars=True)


def _rewrite_functions(mod: tvm.IRModule, mutator: type, *args) -> tvm.IRModule:
    for gv, func in list(mod.functions_items()):
        if isinstance(func, relax.Function):
            mod[gv] = mutator(*args).visit_expr(func)
    return mod


def fold_constants(mod: tvm.IRModule) -> tvm.IRModule:
    """Fold the transposes and reshapes around the weights (``ConvertLayout`` adds them) and the other cheap
    operations on constants with numpy; dead code is removed."""
    return relax.transform.DeadCodeElimination()(_rewrite_functions(mod, _ConstantFolder))
