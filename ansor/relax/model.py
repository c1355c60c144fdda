"""Any Relax IRModule as a :class:`~ansor.networks.Network`: the entry function, its inputs, bound weights.

A module from ``relax.frontend.nn`` (``export_tvm``), ``relax.frontend.onnx`` (``from_onnx``, with
``keep_params_in_input=True`` weights are parameters after the inputs), ``relax.frontend.torch`` or
TVMScript takes its weights either as constants or as function parameters. ``params`` given by name are
bound (``relax.transform.BindParams``) and become constants, so the compiled model carries them; the
remaining parameters are the model's inputs. With ``params=None`` every parameter stays a runtime input.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

import numpy as np
import tvm
from tvm import relax

from ..networks.network import Network, NetworkError, TensorSpec

#: A model's weights by parameter name (numpy arrays or TVM tensors), or ``None``.
Params = Optional[Mapping[str, Any]]


def entry_function(mod: tvm.IRModule, entry: Optional[str] = None) -> str:
    """The Relax function to tune and call: ``entry``, else ``main``, else the module's only one."""
    if not isinstance(mod, tvm.IRModule):
        raise NetworkError(f"expected a Relax IRModule, got a {type(mod).__name__}")
    names = [gv.name_hint for gv, f in mod.functions_items() if isinstance(f, relax.Function)]
    if entry is not None:
        if entry not in names:
            raise NetworkError(f"the module has no Relax function {entry!r}; "
                               f"its functions: {', '.join(names) or 'none'}")
        return entry
    if "main" in names:
        return "main"
    public = [n for n in names if not n.startswith("_")]
    if len(public) == 1:
        return public[0]
    raise NetworkError(f"cannot tell which Relax function is the model ({', '.join(names) or 'none'}); "
                       "name it with entry=")


def _as_array(name: str, value: Any) -> np.ndarray:
    if isinstance(value, tvm.runtime.Tensor):
        return value.numpy()
    try:
        return np.asarray(value)
    except Exception as err:  # an object numpy cannot take
        raise NetworkError(f"parameter {name!r}: not an array ({type(value).__name__}: {err})") from None


def _spec(var: relax.Var, entry: str) -> TensorSpec:
    sinfo = var.ty
    if not isinstance(sinfo, relax.TensorType) or sinfo.shape is None:
        raise NetworkError(f"parameter {var.name!r} of {entry} is not a tensor of known shape ({sinfo}); "
                           "bind it with params= or give the module static shapes")
    dims = []
    for d in sinfo.shape.values:
        if not isinstance(d, tvm.tirx.IntImm):
            raise NetworkError(f"parameter {var.name!r} of {entry} has a symbolic shape "
                               f"{tuple(str(x) for x in sinfo.shape.values)}; tuning needs static shapes")
        dims.append(int(d))
    return TensorSpec(var.name, tuple(dims), str(sinfo.dtype))


def bind_params(mod: tvm.IRModule, params: Params, entry: str) -> tvm.IRModule:
    """``mod`` with the entry function's parameters named in ``params`` replaced by those constants."""
    if not params:
        return mod
    func = mod[entry]
    by_name = {v.name: v for v in func.params}
    unknown = sorted(set(params) - set(by_name))
    if unknown:
        raise NetworkError(f"params names {', '.join(unknown[:5])} that {entry} does not take; its parameters: "
                           f"{', '.join(by_name)}")
    values = {}
    for name, value in params.items():
        array = _as_array(name, value)
        spec = _spec(by_name[name], entry)
        if tuple(array.shape) != spec.shape or str(array.dtype) != spec.dtype:
            raise NetworkError(f"parameter {name!r}: got {array.dtype}{list(array.shape)}, "
                               f"{entry} expects {spec.dtype}{list(spec.shape)}")
        values[name] = tvm.runtime.tensor(array)
    bound = relax.transform.BindParams(entry, values)(mod)
    new_func = bound[entry]
    if new_func.attrs is not None and "num_input" in new_func.attrs:
        # nn/ONNX modules say how many leading parameters are inputs; after binding, all remaining ones are.
        bound[entry] = new_func.with_attr("num_input", len(new_func.params))
    return bound


def as_network(mod: tvm.IRModule, params: Params = None, *, name: str = "relax-model",
               entry: Optional[str] = None) -> Network:
    """A :class:`Network` of a Relax module: ``params`` bound as constants, the other parameters inputs.

    Raises
    ------
    NetworkError
        If the module has no (unambiguous) entry function, ``params`` names a parameter the entry function
        lacks or has the wrong shape or dtype, or an input has a symbolic shape.
    """
    entry = entry_function(mod, entry)
    bound = bind_params(mod, params, entry)
    inputs = tuple(_spec(v, entry) for v in bound[entry].params)
    batch = inputs[0].shape[0] if inputs and inputs[0].shape else 1
    return Network(name=name, mod=bound, inputs=inputs, weights=(), batch_size=batch, layout="", entry=entry)
