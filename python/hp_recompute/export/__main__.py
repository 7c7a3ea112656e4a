"""``python3 -m hp_recompute.export``."""

import sys

from .cli import main

sys.exit(main())
