"""``python -m gpucache`` is the ``gpucache`` command."""

import sys

from gpucache.cli import main

sys.exit(main())
