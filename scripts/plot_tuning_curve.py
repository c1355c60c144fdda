"""``ansor plot``, under the name Ansor users know: ``python scripts/plot_tuning_curve.py --help`` lists the flags."""

import sys

from ansor.cli.main import run_script


def main(argv: list[str] | None = None) -> int:
    return run_script("plot", "plot_tuning_curve.py", argv)


if __name__ == "__main__":
    sys.exit(main())
