"""``ansor export-kernels``, under the name Ansor users know: ``python scripts/export_kernels.py --help`` lists the flags."""

import sys

from ansor.cli.main import run_script


def main(argv: list[str] | None = None) -> int:
    return run_script("export-kernels", "export_kernels.py", argv)


if __name__ == "__main__":
    sys.exit(main())
