"""The ceiling of a tuned network's gain over its default build (:mod:`ansor.bench.headroom`)."""

import sys

from ansor.bench.headroom import main

if __name__ == "__main__":
    sys.exit(main())
