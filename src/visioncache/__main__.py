"""``python -m visioncache`` is the ``visioncache`` command."""

import sys

from visioncache.cli import main

sys.exit(main())
