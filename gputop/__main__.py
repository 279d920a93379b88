"""``python -m gputop``: the same as the ``gputop`` command."""

import sys

from gputop.cli import main

sys.exit(main())
