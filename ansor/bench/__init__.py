"""Benchmarks a user runs as ``ansor bench``: ansor against the CPU runtimes, figures written as markdown.

* :mod:`.network`: a network tuned by ansor vs ONNX Runtime, OpenVINO and PyTorch, on one ONNX file;
* :mod:`.network_report`: what it measured, printed and written into docs/benchmarks.md;
* :mod:`.zoo`: the model zoo (real models of many families, exported from their libraries); :mod:`.zoo_bench`:
  running it through the network benchmark, resumably, into one table;
* :mod:`.peers`: the runtimes; :mod:`.peak`: the machine's measured fp32 ceiling; :mod:`.docs`: the
  generated markdown sections.

The micro-benchmarks of the library's parts stay under ``scripts/bench/``.
"""
