"""``python -m specverify.testing``: see :mod:`specverify.testing.cli`."""
import sys

from .cli import main

sys.exit(main())
