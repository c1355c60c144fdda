"""``ansor pretrain``: ``python scripts/train_pretrained.py --help`` lists the flags."""

import sys

from ansor.cli.main import run_script


def main(argv: list[str] | None = None) -> int:
    return run_script("pretrain", "train_pretrained.py", argv)


if __name__ == "__main__":
    sys.exit(main())
