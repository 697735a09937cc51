"""``python -m sim`` is ``clustersim``."""

import sys

from .cli import main

sys.exit(main())
