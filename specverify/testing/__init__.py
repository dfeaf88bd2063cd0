"""specverify.testing: prove a verifier lossless (exact mode), test one with its own randomness
(sampled mode, with its power computed), check a greedy one for equality with plain greedy
decoding (greedy mode), and the catalogue of known-broken rules (``broken``).

Command line: ``python -m specverify.testing --help``."""
from .exact import LIMITS, bisect_cuts, check_exact
from .greedy import check_greedy
from .report import Report
from .sampled import check_sampled, detectable_tv


def assert_lossless(report):
    """Raise ``AssertionError`` with the report unless its verdict is "lossless"."""
    if not report.passed:
        raise AssertionError(str(report))
    return report


__all__ = ["check_exact", "check_sampled", "check_greedy", "assert_lossless", "bisect_cuts", "detectable_tv", "Report", "LIMITS"]
