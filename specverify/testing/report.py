"""The result of a check: verdict, numbers, where a violation was found; a figure."""

import json
import math
from dataclasses import dataclass, field
from typing import Any, Optional

__all__ = ["Report", "json_safe"]

VERDICTS = ("lossless", "violation", "error")


def json_safe(value):
    """``value`` with NumPy scalars and arrays as Python ones, non-finite floats as strings and
    anything else unknown as its ``str`` (``json.dumps(..., allow_nan=False)`` accepts the result)."""
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if hasattr(value, "tolist"):  # NumPy scalars and arrays
        return json_safe(value.tolist())
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


@dataclass
class Report:
    """What a check found.

    Attributes:
        mode: ``"exact"``, ``"sampled"`` or ``"greedy"``.
        verdict: ``"lossless"`` (no violation found: exact mode proves it on the enumerated
            models; sampled mode fails to reject at ``alpha`` with the stated power),
            ``"violation"`` (the output law is not the target's) or ``"error"`` (the verifier
            raised, hung, returned a wrong type/shape/out-of-range token, wrote into its inputs, or
            is not piecewise constant in its uniforms; ``error`` names the case).
        settings: the check's arguments.
        summary: one line.
        worst_tv: exact mode, per output length ``[{length, tv, model, draft, context}]``.
        reproducer: for a violation: the context, the inputs and uniforms of a round where it shows.
        positions: sampled mode, per output position ``[{position, rounds, statistic, dof, pvalue,
            bins, detectable_tv}]``.
        length_test: sampled mode: the accepted-length histogram against ``specverify.law``.
        alpha, power: the significance level of the whole sampled check (Bonferroni over its
            sub-tests) and the power at which ``detectable_tv`` is stated.
        detectable_tv: sampled mode: the smallest total variation between the binned laws at
            position 0 that the check detects with probability ``power`` (computed from the
            noncentral chi-square; see :func:`specverify.testing.sampled.detectable_tv`).
        laws: data for :meth:`plot`.
        error: ``{what, message, case, hint}`` for verdict "error" (``hint``: the option the caller
            may have meant, or None).
        seconds, calls: cost of the check.
    """

    mode: str
    verdict: str
    settings: dict = field(default_factory=dict)
    summary: str = ""
    worst_tv: Optional[list] = None
    reproducer: Optional[dict] = None
    positions: Optional[list] = None
    length_test: Optional[dict] = None
    alpha: Optional[float] = None
    power: Optional[float] = None
    detectable_tv: Optional[float] = None
    laws: Any = None
    error: Optional[dict] = None
    seconds: float = 0.0
    calls: int = 0

    def __post_init__(self):
        if self.verdict not in VERDICTS:
            raise ValueError(f"verdict must be one of {VERDICTS}, got {self.verdict!r}")

    @classmethod
    def from_fault(cls, mode, settings, fault, seconds, calls, hint=None):
        """The "error" report of a ``VerifierFault`` (the verifier misbehaved); ``hint``: what
        the caller may have meant (an option of the check), appended to the summary."""
        # An exhausted time budget is the whole check's, not necessarily the verifier's.
        who = "the check ran out of its" if fault.what == "time budget" else "the verifier"
        summary = f"{who} {fault.what}: {fault.message}" + (f" — {hint}" if hint else "")
        return cls(mode=mode, verdict="error", settings=settings, seconds=seconds, calls=calls, summary=summary,
                   error={"what": fault.what, "message": fault.message, "case": fault.case, "hint": hint})

    @property
    def passed(self):
        """True iff the verdict is "lossless"."""
        return self.verdict == "lossless"

    def to_dict(self):
        return {k: v for k, v in self.__dict__.items() if k != "laws"}

    def to_json(self, **kwargs):
        """The report (without ``laws``) as strict JSON: non-finite numbers (an impossible token's
        chi-square, an unreachable position's detectable TV) become the strings "inf", "-inf",
        "nan", which ``float()`` reads back; ``kwargs`` go to ``json.dumps``."""
        return json.dumps(json_safe(self.to_dict()), allow_nan=False, **kwargs)

    def __str__(self):
        s = self.settings
        head = f"specverify.testing {self.mode} check of a {s.get('kind', '?')} verifier ({s.get('layout', 'specverify')} layout)"
        lines = [head, f"verdict: {self.verdict.upper()} — {self.summary}"]
        if self.worst_tv:
            lines.append("worst total variation per output length (max over models, drafts, start contexts):")
            for w in self.worst_tv:
                lines.append(f"  length {w['length']}: TV {w['tv']:.3g}" + (
                    f"  (model {w['model']}, draft {w['draft']}, context {w['context']})" if w["context"] is not None else ""))
        if self.positions is not None:
            lines.append(f"chi-square on counts per output position (alpha = {self.alpha:g} for the whole check, "
                         f"Bonferroni; power {self.power:g}):")
            for p in self.positions:
                lines.append(f"  position {p['position']}: {p['rounds']} rounds, {p['bins']} bins, chi2 = "
                             f"{p['statistic']:.1f} (dof {p['dof']}), p = {p['pvalue']:.3g}, detectable TV "
                             f"{p['detectable_tv']:.3g}")
        if self.length_test:
            t = self.length_test
            lines.append(f"  accepted length vs specverify.law: chi2 = {t['statistic']:.1f} (dof {t['dof']}), "
                         f"p = {t['pvalue']:.3g}; mean {t['mean']:.4f} vs law {t['law_mean']:.4f}")
        if self.detectable_tv is not None:
            lines.append(f"power: at this sample size a bias of TV >= {self.detectable_tv:.3g} at position 0 "
                         f"(between the binned laws) is detected with probability >= {self.power:g}")
        if self.reproducer:
            lines.append("reproducer: " + json.dumps(self.reproducer, default=str)[:3000])
        if self.error:
            lines.append("case: " + json.dumps(self.error.get("case"), default=str)[:3000])
        lines.append(f"({self.calls} verifier calls, {self.seconds:.2f} s)")
        return "\n".join(lines)

    def plot(self, ax=None, max_outcomes=40):
        """The verifier's law against the target's: exact mode, the joint law of the compared
        tokens at the first violating (else the first) context; sampled mode, per position, the
        observed frequencies against the target row (computed before: this only draws).

        Returns the matplotlib figure.
        """
        import matplotlib

        if ax is None:
            matplotlib.use(matplotlib.get_backend())
        import matplotlib.pyplot as plt

        if self.mode == "exact" and self.laws and "law" in self.laws:
            law = self.laws["law"]
            keys = sorted(set(law["verifier"]) | set(law["target"]), key=lambda k: -law["target"].get(k, 0.0))[:max_outcomes]
            fig, ax = (ax.figure, ax) if ax is not None else plt.subplots(figsize=(max(6, 0.25 * len(keys)), 3.2))
            x = range(len(keys))
            ax.bar([i - 0.2 for i in x], [law["target"].get(k, 0.0) for k in keys], 0.4, label="target")
            ax.bar([i + 0.2 for i in x], [law["verifier"].get(k, 0.0) for k in keys], 0.4, label="verifier")
            ax.set_xticks(list(x), keys, rotation=90, fontsize=7)
            ax.set_ylabel("probability")
            ax.set_title(f"first {law['length']} tokens after context {law['context']} ({self.verdict})")
            ax.legend()
            fig.tight_layout()
            return fig
        if self.mode == "sampled" and self.laws:
            n = len(self.laws)
            if ax is None:
                fig, axes = plt.subplots(1, n, figsize=(3.2 * n, 3), squeeze=False)
                axes = axes[0]
            else:
                fig, axes = ax.figure, [ax] * n
            for a, entry in zip(axes, self.laws):
                obs, exp = entry["observed"], entry["expected"]
                total = max(sum(obs), 1)
                idx = range(len(exp))
                a.bar([i - 0.2 for i in idx], exp, 0.4, label="target")
                a.bar([i + 0.2 for i in idx], [o / total for o in obs], 0.4, label="verifier")
                a.set_title(f"position {entry['position']} ({entry['rounds']} rounds)", fontsize=9)
                a.set_xlabel("bin (tokens by target probability)" if entry.get("binned") else "token")
            axes[0].legend(fontsize=8)
            fig.suptitle(f"sampled check: {self.verdict}")
            fig.tight_layout()
            return fig
        raise ValueError(f"nothing to plot for a {self.mode} report with verdict {self.verdict}")
