"""The project's chat prompt sets: what every end-to-end experiment decodes, and the held-out evaluation.

- :data:`PROMPTS` (copy / edit prompts, where prompt lookup shines, and an open-ended one): the
  prompts :mod:`experiments.end_to_end.real_model`, ``choose_k``, ``k_replay`` and
  ``lookup_bound`` time.
- :data:`HELDOUT_PROMPTS`, :data:`HELDOUT_PROMPTS_2`: texts no draft-length policy was tuned on;
  the learned draft's held-out sets (:mod:`experiments.end_to_end.draft_eval`).
- :data:`LONG_PROMPTS`: a long context, selectable with ``real_model --prompts``.

The learned draft's training prompts (:mod:`experiments.end_to_end.draft_prompts`) copy none of
them (``tests/experiments/test_train_draft.py``). :func:`chat_ids` makes each prompt one user turn
of the chat template.
"""

from __future__ import annotations

COPY_TEXT = (
    "The committee met on Tuesday to review the budget. After a long discussion, the members agreed "
    "to fund the new library, repair the old bridge, and plant two hundred trees along the river."
)
PROMPTS = {
    "copy": "Repeat exactly: " + COPY_TEXT,
    "edit_code": (
        "Rename the variable `total` to `acc` in this Python function and show the whole function:\n"
        "```python\ndef sum_positive(values):\n    total = 0\n    for v in values:\n"
        "        if v > 0:\n            total += v\n    return total\n```"
    ),
    "fix_spelling": (
        "Correct the spelling mistakes in this text and return the corrected text: "
        "'Teh weather was beatiful yesterday, so we went too the park and had a picnik by the lake "
        "with our freinds and there dog.'"
    ),
    "open": "Write a short story about a robot who learns to paint.",
}
# Prompts no draft-length policy was tuned on: the held-out texts of ``experiments.end_to_end.k_replay
# --record-texts`` (summaries, formats, copies, open text), against which a policy change tuned on
# PROMPTS is checked.
HELDOUT_PROMPTS = {
    "summarize": "Summarize in two sentences: The city council met on Tuesday to discuss the new bike lanes. "
                 "Residents who spoke were split: shop owners feared losing parking, while parents said the lanes "
                 "would make the school run safer. The council voted to build a trial lane on Main Street for six months.",
    "json": "Convert to JSON with keys name, age and city: Alice is 31 and lives in Paris. Bob is 45 and lives in Rome. "
            "Carol is 27 and lives in Oslo.",
    "list_caps": "Rewrite this list with every item capitalized, one per line:\napples\nbananas\ncherries\ndates\n"
                 "elderberries\nfigs\ngrapes",
    "translate": "Translate to French: The cat sleeps on the warm windowsill every afternoon.",
    "qa": "What is the capital of Australia, and why was it chosen?",
    "code_doc": "Add a docstring to this function and show the whole function:\n```python\ndef clamp(x, lo, hi):\n"
                "    if x < lo:\n        return lo\n    if x > hi:\n        return hi\n    return x\n```",
    "email": "Write a short email to a colleague asking to move our meeting from Monday to Wednesday.",
    "quote": "Quote this sentence back and then explain it: 'The only way to do great work is to love what you do.'",
}
# A second held-out set, written after AdaptiveK's contradicted-match context (2026-12-02) was
# designed on the prompts above, to judge it on texts it was not chosen on (experiments.end_to_end.k_replay
# --record-texts FILE --prompt-set heldout2).
HELDOUT_PROMPTS_2 = {
    "grammar": "Fix the grammar in this paragraph and return it: 'Me and him goes to the market every days. "
               "We buys apples and the apples is always fresh. Yesterday we seen a dog who were very big.'",
    "csv_md": "Turn this CSV into a Markdown table:\nname,price,stock\npen,1.20,340\nnotebook,3.50,120\n"
              "stapler,7.99,45\nruler,0.99,500",
    "formal": "Rewrite this message in a formal tone: 'hey, can't make it tomorrow, something came up, "
              "let's do next week, sorry!'",
    "explain_code": "Explain what this code does, line by line:\n```python\nwords = text.split()\n"
                    "counts = {}\nfor w in words:\n    counts[w] = counts.get(w, 0) + 1\n"
                    "print(sorted(counts.items(), key=lambda kv: -kv[1])[:3])\n```",
    "recipe": "Give a recipe for pancakes with a list of ingredients and numbered steps.",
    "rename": "In this code, rename the function `f` to `area` and return the whole code:\n```python\n"
              "def f(w, h):\n    return w * h\n\nprint(f(3, 4))\nprint(f(5, 6))\n```",
    "poem": "Write a four-line poem about the sea.",
    "dialogue": "Continue this dialogue for four more lines:\nA: Did you finish the report?\nB: Almost, I need one more chart.\n"
                "A: Which chart?\nB: The one with the monthly sales.",
}
LONG_CODE = '''import csv
from collections import defaultdict
from pathlib import Path


def load_orders(path):
    """Read the orders file: one row per order, with customer, region, amount and status."""
    orders = []
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            if row["status"] == "cancelled":
                continue
            orders.append({"customer": row["customer"], "region": row["region"],
                           "amount": float(row["amount"]), "status": row["status"]})
    return orders


def totals_by_region(orders):
    """Sum the amounts of the orders of each region."""
    totals = defaultdict(float)
    for order in orders:
        totals[order["region"]] += order["amount"]
    return dict(totals)


def top_customers(orders, n=5):
    """The n customers with the largest total amount, largest first."""
    spent = defaultdict(float)
    for order in orders:
        spent[order["customer"]] += order["amount"]
    ranked = sorted(spent.items(), key=lambda item: item[1], reverse=True)
    return ranked[:n]


def write_report(orders, out_path):
    """Write the totals by region and the top customers to a text report."""
    out_path = Path(out_path)
    lines = ["Totals by region:"]
    for region, total in sorted(totals_by_region(orders).items()):
        lines.append(f"  {region}: {total:.2f}")
    lines.append("Top customers:")
    for customer, total in top_customers(orders):
        lines.append(f"  {customer}: {total:.2f}")
    out_path.write_text("\\n".join(lines) + "\\n")
    return out_path
'''
# Selectable with --prompts, not part of the default set: a long context (~450 tokens of prompt), where
# multi-token passes pay for sdpa's repeat_kv copy (see --attention) and prompt lookup has much to copy.
LONG_PROMPTS = {
    "long_code": "Add a docstring line saying 'Amounts are in euros.' to load_orders and show the whole "
                 "module, unchanged otherwise:\n```python\n" + LONG_CODE + "```",
}


def chat_ids(tokenizer, prompts):
    """name -> int64 token ids ``[L]`` of each prompt as one user turn of the chat template, with
    the assistant's turn opened (what ``generate`` and the decoders continue)."""
    return {name: tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                                return_tensors="pt", return_dict=True)["input_ids"][0]
            for name, text in prompts.items()}
