"""Old path of :mod:`specverify.integrations.hub`: ``python -m specverify.hub`` still runs it."""
import sys

from .integrations import hub

if __name__ == "__main__":
    sys.exit(hub.main())
sys.modules[__name__] = hub
