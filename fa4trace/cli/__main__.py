"""``python -m fa4trace.cli``: the `fa4trace` command (as ``python -m fa4trace``)."""

import sys

from . import main

sys.exit(main())
