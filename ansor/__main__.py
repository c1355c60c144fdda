"""``python -m ansor``: the ``ansor`` command."""

import sys

from ansor.cli.main import main

sys.exit(main())
