"""``ansor bench``: the network benchmark (``python scripts/bench/bench_network.py --help`` lists the flags)."""

import sys

from ansor.cli.main import run_script


def main(argv: list[str] | None = None) -> int:
    return run_script("bench", "bench_network.py", argv)


if __name__ == "__main__":
    sys.exit(main())
