"""The machine's fp32 ceiling, measured (:mod:`ansor.bench.peak`)."""

import sys

from ansor.bench.peak import main

if __name__ == "__main__":
    sys.exit(main())
