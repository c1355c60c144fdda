"""What the command-line scripts share, one concept per module.

* :mod:`.running`: logging, exit statuses, one ``error:`` line for bad input, Ctrl-C, flag checks;
* :mod:`.targets`: ``--target`` and ``TVM_NUM_THREADS`` (set before the first kernel runs in the process);
* :mod:`.logs`: ``--log-file`` checks and the ``<network>-b<batch>.json`` naming of network logs;
* :mod:`.options`: the tuning scripts' shared flags, their checks and their main; tuning options and the
  database from the flags (timing: the library's defaults);
* :mod:`.networks`: the network of ``--network`` / ``--onnx`` or of a log's name;
* :mod:`.evaluation`: a network's default and tuned builds, compared and timed.

Importing this package loads nothing heavy: TVM, Ray, XGBoost and the networks are imported inside the
functions that need them, so a script handles a bad flag or Ctrl-C during start-up like any other.
"""
