"""The subcommands of ``ansor``, one module each: ``NAME``, ``SUMMARY``, the module docstring as the
description, ``add_arguments(parser)`` and ``execute(args) -> exit status``.

Modules here import nothing heavy at import time, so ``ansor --help`` and a bad flag answer at once.
"""

from . import bench, evaluate, export, export_kernels, plot, pretrain, train_model, tune, tune_op

#: In the order ``ansor --help`` lists them.
COMMANDS = (tune_op, tune, evaluate, export, export_kernels, train_model, pretrain, plot, bench)
