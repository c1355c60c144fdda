"""A tuned network against OpenVINO, one class of layer at a time (:mod:`ansor.bench.layers`)."""

import sys

from ansor.bench.layers import main

if __name__ == "__main__":
    sys.exit(main())
