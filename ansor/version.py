"""The package's version, in one place: setup.cfg, ``ansor --version``, logs and exported models read it."""

__version__ = "0.2.0"


def writer() -> str:
    """What wrote a log or an exported model: this ansor and this TVM (``ansor 0.2.0, tvm 0.27.0``)."""
    import tvm
    return f"ansor {__version__}, tvm {tvm.__version__}"
