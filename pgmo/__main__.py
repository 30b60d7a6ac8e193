"""``python -m pgmo``: the same as the ``pgmo`` command."""

import sys

from .cli import main

sys.exit(main())
