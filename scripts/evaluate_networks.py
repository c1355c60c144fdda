"""``ansor evaluate``, under the name Ansor users know: ``python scripts/evaluate_networks.py --help`` lists the flags."""

import sys

from ansor.cli.main import run_script


def main(argv: list[str] | None = None) -> int:
    return run_script("evaluate", "evaluate_networks.py", argv)


if __name__ == "__main__":
    sys.exit(main())
