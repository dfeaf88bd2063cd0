"""The analytic law of speculative (rejection) sampling.

Assumptions: within a round, position ``i`` has a fixed normalized target distribution ``p_i`` and
draft distribution ``q_i`` (they do not depend on which tokens were drawn — true for the
synthetic experiments, an approximation for real models), and the draft tokens are drawn from
``q_i``.  Then position ``i`` accepts independently with probability

    a_i = sum_v min(p_i(v), q_i(v)) = 1 - TV(p_i, q_i),

and the number N of accepted drafts in a round of K has the truncated-geometric law

    P(N = n) = (prod_{j<n} a_j) (1 - a_n)    for 0 <= n < K,
    P(N = K) =  prod_{j<K} a_j,

with mean  E[N] = sum_{i=1..K} prod_{j<i} a_j  (homogeneous: sum_{i=1..K} a^i) and
tokens per round  E[N] + 1  (each round also emits a recovered or bonus token).

Block verification (Sun et al. 2024, ``specverify.accept_block``) has, with
``p_i = min(1, p_{i-1} p_{i-1}(X_{i-1}) / q_{i-1}(X_{i-1}))`` (``p_0 = 1``, X drawn from the draft),

    P(N >= i) = E[p_i]    (the capped cumulative ratio, averaged over the draft's paths),

so E[N] = sum_{i=1..K} E[p_i] and P(N = n) = E[p_n] - E[p_{n+1}] (``p_{K+1} = 0``).  Since
``p_i >= p_{i-1} min(1, r_i)``, pointwise ``p_i >= prod_{j<=i} min(1, r_j)``: block verification
never accepts less than token-wise in expectation (equal for K = 1 and for one-hot drafts, where
``p_i = prod_j p_j(t_j)``).  Functions: :func:`block_survival` (per-position rows: exact on the
finite support of ``p_i`` when it is small, else on a log grid with a proven error bound),
:func:`block_survival_markov` / :func:`token_survival_markov` (any draft path dependence, by
enumeration), :func:`survival_pmf`, :func:`block_gain`.

Wall-clock (:func:`speedup`, :func:`optimal_k`): a round drafts up to K tokens and runs one
target pass scoring the drafts plus one; its speed-up over plain decoding (one target pass
scoring one token per emitted token) is

    f(K) = E[tokens per round] / E[time per round]
         = (1 + sum_{i=1..K} P(N >= i)) / (E[D(M)] + E[T(M + 1)]),

times in units of one single-token target pass (``T(1) = 1``), ``M <= K`` the tokens actually
proposed, ``D(m)`` the draft's cost for m tokens (``c m`` by default) and ``T(n)`` the target's
cost for a pass scoring n tokens (1 by default: free extra positions). Homogeneous rates, K
proposals every round, ``D(m) = c m`` and ``T = 1`` give Leviathan et al.'s Thm 3.8,
``f(K) = (1 - a^{K+1}) / ((1 - a)(K c + 1))``.

One module per law: :mod:`~specverify.law.chain`, :mod:`~specverify.law.block`,
:mod:`~specverify.law.tree`, ``speedup`` (whose name here is its function), and ``costs`` (the measured
``D`` and ``T`` the speed-up takes, cached per machine); every name is also here.
"""

from .block import BlockLaw, block_gain, block_survival, block_survival_markov, survival_pmf, token_survival, token_survival_markov
from .chain import (acceptance_rates, accepted_length_pmf, expected_tokens_per_round, mean_accepted,
                    mean_accepted_homogeneous, total_variation, var_accepted)
from .costs import MeasuredCosts, cost_cache_path, load_costs, machine_name, save_costs
from .speedup import Optimum, optimal_k, optimal_k_continuous, speedup, speedup_curve
from .tree import (TREE_RULES, child_acceptance, depth_pmf, node_rule, optimal_multidraft_acceptance, rrs_acceptance,
                   tree_children, tree_depths, tree_length_pmf, tree_node_probabilities)

__all__ = [
    "acceptance_rates",
    "total_variation",
    "accepted_length_pmf",
    "mean_accepted",
    "var_accepted",
    "expected_tokens_per_round",
    "mean_accepted_homogeneous",
    "BlockLaw",
    "block_survival",
    "block_survival_markov",
    "token_survival_markov",
    "token_survival",
    "survival_pmf",
    "block_gain",
    "TREE_RULES",
    "tree_children",
    "tree_depths",
    "node_rule",
    "tree_node_probabilities",
    "depth_pmf",
    "child_acceptance",
    "rrs_acceptance",
    "optimal_multidraft_acceptance",
    "tree_length_pmf",
    "speedup",
    "speedup_curve",
    "optimal_k",
    "optimal_k_continuous",
    "Optimum",
    "MeasuredCosts",
    "load_costs",
    "save_costs",
    "cost_cache_path",
    "machine_name",
]

