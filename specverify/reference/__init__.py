"""Slow, readable NumPy references for the ops.

They take the same uniforms as the kernels and return the same ``(n_accepted, next_token)`` bit
for bit: every sum follows the documented order (``specverify/kernels/_primitives.pxd``, numeric contract
v2: float32 lanes inside a block, float64 across blocks), every weight is computed with the same
IEEE operations.  NumPy's float32 element-wise operations round like C's ``float`` ones; its
``cumsum`` (an accumulate) is sequential, unlike ``np.sum``, whose pairwise order the kernels do
not follow.  No validation beyond what the math needs: pass valid inputs (the ops validate theirs).

One module per op family: :mod:`~specverify.reference.primitives` (the numeric contract's
primitives), :mod:`~specverify.reference.chain`, :mod:`~specverify.reference.block`,
:mod:`~specverify.reference.tree`, :mod:`~specverify.reference.warp`,
:mod:`~specverify.reference.linear`, :mod:`~specverify.reference.batch`.  The names of the primitives, chain, block and linear
modules are also available here (``specverify.reference.accept``), as before the split.
"""

from .block import *  # noqa: F401,F403
from .chain import *  # noqa: F401,F403
from .linear import *  # noqa: F401,F403
from .primitives import *  # noqa: F401,F403
