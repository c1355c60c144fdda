"""The network of a script's ``--network`` / ``--onnx`` / ``--batch-size`` flags (or of a log's name)."""

from __future__ import annotations

import argparse
import os
from typing import Optional

from .logs import network_from_log_name


def add_network_args(parser: argparse.ArgumentParser, *, for_logs: bool = False) -> None:
    """``--network``, ``--onnx`` and ``--batch-size``."""
    infer = " (default: read from the log's file name <network>-b<batch>.json)" if for_logs else ""
    from ..arguments import BATCH, ExistingFile, Text
    parser.add_argument("--network", default=None, metavar="NAME", type=Text("a network name", "resnet-50"),
                        help="built-in network: resnet-50, mobilenet-v2, resnet3d-18, bert, dcgan, tiny-cnn "
                             f"(an unknown name lists them){infer}")
    parser.add_argument("--onnx", default=None, metavar="FILE", type=ExistingFile("an ONNX file", "model.onnx"),
                        help="an ONNX model file instead of a built-in network (needs the onnx package)")
    parser.add_argument("--batch-size", type=BATCH, default=None, metavar="B",
                        help="batch size (default 1; for --onnx: the model's own, symbolic dimensions "
                             f"taken as 1){infer}")


def load_network(name: Optional[str], onnx_path: Optional[str], batch_size: Optional[int]):
    """A :class:`~ansor.networks.Network` from ``--network`` or ``--onnx`` (exactly one of them)."""
    from ..networks import NetworkError, get_network, load_onnx, network_names
    if name and onnx_path:
        raise NetworkError("give either --network or --onnx, not both")
    if onnx_path:
        net = load_onnx(onnx_path)
        if batch_size is not None and net.inputs and net.inputs[0].shape and net.batch_size != batch_size:
            shapes = {s.name: (batch_size, *s.shape[1:]) for s in net.inputs if s.shape}
            net = load_onnx(onnx_path, shapes=shapes)
        return net
    if not name:
        raise NetworkError(f"give --network NAME (one of {', '.join(network_names())}) or --onnx FILE")
    return get_network(name, batch_size if batch_size is not None else 1)


def network_for_log(args: argparse.Namespace, log: os.PathLike):
    """The network a log was tuned for: from ``--network``/``--onnx``/``--batch-size``, else its file name."""
    from ..networks import NetworkError
    inferred = network_from_log_name(log)
    if args.network or args.onnx:
        batch = args.batch_size
        if batch is None and inferred is not None and (args.onnx or inferred[0] == args.network):
            batch = inferred[1]
        return load_network(args.network, args.onnx, batch)
    if inferred is None:
        raise NetworkError(f"cannot tell the network of {log} from its name (expected <network>-b<batch>.json); "
                           "give --network NAME --batch-size B, or --onnx FILE")
    name, batch = inferred
    if args.batch_size is not None:
        batch = args.batch_size
    from ..networks import network_names
    if name not in network_names():
        raise NetworkError(f"{log}: {name!r} (from the file name) is not a built-in network "
                           f"({', '.join(network_names())}); give --network NAME, or --onnx FILE")
    return load_network(name, None, batch)
