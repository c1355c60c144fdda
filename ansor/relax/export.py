"""Deployable output: a compiled model as a directory that ``tvm.runtime`` alone can load and run.

``export(executable, DIR)`` writes

* ``model.so`` — the Relax VM executable (``executable.export_library``), weights bound at compile time
  included as constants;
* ``params.bin`` — weights the entry function takes at run time (after the inputs), in TVM's own tensor
  format (``tvm.runtime.save_param_dict``: data only, nothing executable), when there are any;
* ``model.json`` — entry function, target, device, and the name, shape and dtype of every input and
  run-time weight, in call order;
* ``README.md`` — how to call it from a fresh process with ``tvm`` and ``numpy`` only (the snippet in it
  is what ``tests/test_relax_api.py`` runs).
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Mapping, Optional, Union

import numpy as np
import tvm

from ..host_cpu import ARCH_REQ_XCOMP_PERM, SYS_ARCH_PRCTL, XFEATURE_XTILEDATA
from ..networks.network import Network, NetworkError, TensorSpec
from ..sketch.tensor_rules import has_amx
from ..task.search_task import TargetLike
from ..target import device_kind, parse_target, target_to_str
from ..version import __version__

logger = logging.getLogger("ansor")

#: ``format`` field of model.json; bump when its fields change meaning.
EXPORT_FORMAT = "ansor-export-1"
_SIGNATURE_ATTR = "ansor_signature"


@dataclass(frozen=True)
class Signature:
    """How to call a compiled model: entry function, inputs, then run-time weights; and its target."""

    entry: str
    inputs: tuple[TensorSpec, ...]
    weights: tuple[TensorSpec, ...]
    target: str

    @staticmethod
    def of(network: Network, target: TargetLike = None) -> "Signature":
        return Signature(network.entry, tuple(network.inputs), tuple(network.weights),
                         target_to_str(parse_target(target)))


def attach_signature(executable: tvm.runtime.Executable, signature: Signature) -> None:
    """Remember on the executable how to call it (read by :func:`export`)."""
    setattr(executable, _SIGNATURE_ATTR, signature)


def export(executable: tvm.runtime.Executable, directory: Union[str, os.PathLike], mod: Optional[tvm.IRModule] = None,
           params: Optional[Mapping] = None, *, target: TargetLike = None) -> Path:
    """Write ``executable`` and what is needed to call it to ``directory`` (see the module docstring).

    An executable from :func:`~ansor.relax.compile_relax` knows its signature; for one built otherwise
    give the Relax ``mod`` it was compiled from, the ``params`` bound into it, and its ``target``.
    Returns the path of ``model.so``.
    """
    signature = getattr(executable, _SIGNATURE_ATTR, None)
    if mod is not None:
        from .model import as_network
        signature = Signature.of(as_network(mod, params), target)
    if signature is None:
        raise NetworkError("this executable does not say how to call it (it was not made by "
                           "ansor.relax.compile_relax): pass mod= (the Relax module it was compiled from)")
    if signature.weights:
        raise NetworkError("the model takes weights at run time: export it with export_network(executable, "
                           "network, directory), which saves their values")
    return write(executable, directory, signature, {})


def export_network(executable: tvm.runtime.Executable, network: Network, directory: Union[str, os.PathLike],
                   target: TargetLike = None, env: Optional[Mapping[str, str]] = None) -> Path:
    """:func:`export` for a :class:`~ansor.networks.Network`: its run-time weights go to ``params.bin``.

    ``network`` is what the executable was built from: for a build of an extraction's module, that is
    ``Extraction.network`` (prepared: weights bound as constants), not the network given to ``extract``.
    """
    return write(executable, directory, Signature.of(network, target),
                 {w.name: network.params[w.name] for w in network.weights}, env)


def check_export_dir(directory: Union[str, os.PathLike]) -> Path:
    """``directory`` as a path, if it can be an export directory (checked before a long tuning run)."""
    out = Path(directory)
    if out.exists() and not out.is_dir():
        raise NetworkError(f"export directory {out} is a file; give a directory (example: --export deploy/)")
    return out


def write(executable: tvm.runtime.Executable, directory: Union[str, os.PathLike], signature: Signature,
          weights: Mapping[str, np.ndarray], env: Optional[Mapping[str, str]] = None) -> Path:
    """Write the library, the weights, model.json and README.md; returns the library's path.

    ``env``: TVM runtime settings to run it with (``model.json``'s ``env``; see
    :mod:`ansor.relax.thread_pool`)."""
    out = check_export_dir(directory)
    try:
        out.mkdir(parents=True, exist_ok=True)
        library = out / "model.so"
        executable.export_library(str(library))
        params_file = None
        if weights:
            params_file = "params.bin"
            tvm.runtime.save_param_dict_to_file({k: tvm.runtime.tensor(v) for k, v in weights.items()},
                                                str(out / params_file))
        target = parse_target(signature.target)
        meta = {
            "format": EXPORT_FORMAT,
            "library": library.name,
            "entry": signature.entry,
            "target": signature.target,
            "device": device_kind(target).device_type(target),
            "num_threads": int(target.attrs["num-cores"]) if "num-cores" in target.attrs else None,
            "inputs": [_spec_json(s) for s in signature.inputs],
            "weights": [_spec_json(s) for s in signature.weights],
            "params_file": params_file,
            "amx": has_amx(target),
            "env": dict(env or {}),
            "tvm_version": tvm.__version__,
            "ansor_version": __version__,
        }
        (out / "model.json").write_text(json.dumps(meta, indent=1) + "\n")
        (out / "README.md").write_text(readme(meta))
    except OSError as err:
        raise NetworkError(f"cannot write the exported model to {out} ({err.strerror or err})") from None
    logger.info("exported %s (%d inputs, %d run-time weights) to %s", signature.entry, len(signature.inputs),
                len(signature.weights), out)
    return library


def _spec_json(spec: TensorSpec) -> dict:
    d = asdict(spec)
    d["shape"] = list(spec.shape)
    return d


#: The loader every export's README shows; plain tvm + numpy, no ansor.
LOADER = f'''import json, os
import numpy as np
import tvm
from tvm import relax

here = os.environ.get("MODEL_DIR", ".")               # the export directory
meta = json.load(open(os.path.join(here, "model.json")))
if meta.get("amx"):  # AMX tiles may be used: Linux must grant the tile state first (arch_prctl), else SIGILL
    import ctypes
    if ctypes.CDLL(None).syscall({SYS_ARCH_PRCTL}, {ARCH_REQ_XCOMP_PERM:#x}, {XFEATURE_XTILEDATA}) != 0:
        print("warning: Linux refused the AMX tile state; a kernel that uses AMX tiles will die of SIGILL")
device = tvm.device(meta["device"], 0)
vm = relax.VirtualMachine(tvm.runtime.load_module(os.path.join(here, meta["library"])), device)
weights = []
if meta["params_file"]:
    params = tvm.runtime.load_param_dict_from_file(os.path.join(here, meta["params_file"]))
    weights = [tvm.runtime.tensor(params[w["name"]].numpy(), device) for w in meta["weights"]]


def to_numpy(value):
    """The outputs as a list of numpy arrays (a tuple output is flattened)."""
    if hasattr(value, "numpy"):
        return [value.numpy()]
    return [a for v in value for a in to_numpy(v)]


def run(*inputs):
    """Call the model on numpy arrays (one per entry of meta["inputs"], in order)."""
    args = [tvm.runtime.tensor(np.asarray(x, dtype=s["dtype"]), device) for x, s in zip(inputs, meta["inputs"])]
    return to_numpy(vm[meta["entry"]](*args, *weights))
'''


def readme(meta: dict) -> str:
    """The README of an export directory."""
    inputs = "\n".join(f"| `{s['name']}` | {tuple(s['shape'])} | {s['dtype']} |" for s in meta["inputs"])
    example = ", ".join(f"np.zeros({tuple(s['shape'])}, \"{s['dtype']}\")" for s in meta["inputs"])
    if meta["params_file"]:
        params_row = (f"| `{meta['params_file']}` | the {len(meta['weights'])} run-time weights "
                      "(`tvm.runtime.load_param_dict_from_file`) |")
    else:
        params_row = "| (no params file) | every weight is inside the library |"
    threads = ""
    if meta["num_threads"]:
        threads = (f"Set `TVM_NUM_THREADS={meta['num_threads']}` (the target's cores) before the first TVM call: "
                   "TVM's default is half the logical CPUs.")
    if meta.get("env"):
        threads += (" Also set " + ", ".join(f"`{k}={v}`" for k, v in meta["env"].items()) + ": chosen by timing "
                    "this model on the machine that tuned it (unbound threads unless another setting was faster by "
                    "more than 2 %: bound threads slow down many times when another process keeps a core busy); "
                    "TVM reads it when its thread pool starts.")
    return f"""# Compiled model

Made by ansor (tuned schedules, Apache TVM {meta['tvm_version']}). Running it needs only `tvm` and `numpy`.

| file | content |
| --- | --- |
| `{meta['library']}` | the Relax VM executable (weights bound at compile time are inside) |
| `model.json` | entry function `{meta['entry']}`, target, inputs and run-time weights in call order |
{params_row}

Inputs, in call order:

| name | shape | dtype |
| --- | --- | --- |
{inputs}

Target: `{meta['target']}`. The library runs on machines this target describes (same CPU features).
{threads}

```python
{LOADER}
outputs = run({example})
print([o.shape for o in outputs])
```
"""
