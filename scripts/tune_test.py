"""``ansor tune-op``, under the name Ansor users know: ``python scripts/tune_test.py --help`` lists the flags."""

import sys

from ansor.cli.main import run_script


def main(argv: list[str] | None = None) -> int:
    return run_script("tune-op", "tune_test.py", argv)


if __name__ == "__main__":
    sys.exit(main())
