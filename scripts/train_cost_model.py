"""``ansor train-model``, under the name Ansor users know: ``python scripts/train_cost_model.py --help`` lists the flags."""

import sys

from ansor.cli.main import run_script


def main(argv: list[str] | None = None) -> int:
    return run_script("train-model", "train_cost_model.py", argv)


if __name__ == "__main__":
    sys.exit(main())
