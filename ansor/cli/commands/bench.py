"""``ansor bench``: the network benchmark (:mod:`ansor.bench.network`) and, with ``--zoo``, the model zoo
(:mod:`ansor.bench.zoo_bench`) as a command."""

from __future__ import annotations

import argparse

NAME = "bench"
SUMMARY = ("tune networks and time them against ONNX Runtime and OpenVINO (needs the bench extra), or with --target "
           "cuda against PyTorch on the GPU")


def description() -> str:
    from ...bench import network
    return network.__doc__ or SUMMARY


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from ...bench.network import add_arguments as add
    add(parser)


def execute(args: argparse.Namespace) -> int:
    from ...bench.gpu import run_gpu
    from ...bench.network import run
    from ...bench.zoo_bench import run_zoo
    from ..running import run_main
    return run_main(run_gpu if args.target == "cuda" else run_zoo if args.zoo else run, args)
