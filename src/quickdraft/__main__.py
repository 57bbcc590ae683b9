"""``python -m quickdraft`` is the ``quickdraft`` command."""

import sys

from quickdraft.cli import main

sys.exit(main())
