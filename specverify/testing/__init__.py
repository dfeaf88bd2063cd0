"""specverify.testing: prove a verifier lossless, or find a counterexample."""
from .exact import check_exact, bisect_cuts
from .report import Report
from .sampled import check_sampled, detectable_tv
