"""``python -m specverify.testing``: see :mod:`specverify.testing.cli`."""
import sys

from .cli import main

status = main()
sys.stdout.flush()
# A verifier left running in its daemon thread (it hung) prints to stderr, never after the report.
sys.stdout = sys.stderr
sys.exit(status)
