"""``ansor tune``, under the name Ansor users know: ``python scripts/tune_network.py --help`` lists the flags."""

import sys

from ansor.cli.main import run_script


def main(argv: list[str] | None = None) -> int:
    return run_script("tune", "tune_network.py", argv)


if __name__ == "__main__":
    sys.exit(main())
