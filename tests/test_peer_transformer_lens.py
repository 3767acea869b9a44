"""TransformerLens as a peer of the book's ablation, and the outcomes export on the book's page on other tools.

The page's code (book/other_tools.md) is executed as written on a tiny Llama saved as a local folder (grouped-query
attention: 4 query heads share 2 key/value heads, so a head is a *query* head). Every margin it writes is checked
against the book's own ablation of the same folder (``load_model``; ``ablate_heads`` at the output projection's
input, inside Hugging Face's forward): TransformerLens's bridge runs its own hooked attention, so the two are
separate implementations of "zero this query head before the output projection". `cel stats` then reads the table.
"""

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from cel_utils.ablation import ablate_heads
from cel_utils.cli import main
from cel_utils.models import load_model

PAGE = Path(__file__).resolve().parents[1] / "book" / "other_tools.md"
CONDITIONS = {"baseline": [], "L1H2": [(1, 2)], "L1H2+L2H0": [(1, 2), (2, 0)]}   # the page's


def page_code() -> str:
    """The page's export code: its first python block after the paragraph that introduces it."""
    text = PAGE.read_text()
    start = text.index("Exporting such a table from a TransformerLens run")
    block = text[text.index("```python\n", start) + len("```python\n"):]
    return block[:block.index("```")]


def _items(n: int = 60) -> list[dict]:
    rng = np.random.default_rng(0)
    out = []
    for k in range(n):
        a, b = rng.integers(10, 50, 2)
        right, wrong = str((a + b) % 10), str((a + b + 1 + rng.integers(0, 8)) % 10)
        out.append({"id": f"i{k}", "split": "confirm" if k < n // 2 else "heldout", "prompt": f"{a}+{b}=",
                    "answer": right, "distractor": wrong})
    return out


def _book_margin(lm, item) -> float:
    ids = lm.tokenizer(item["prompt"], add_special_tokens=False, return_tensors="pt")["input_ids"]
    (right,), (wrong,) = (lm.tokenizer(item[k], add_special_tokens=False)["input_ids"] for k in ("answer", "distractor"))
    logits = lm.model(input_ids=ids).logits[0, -1]
    return float(logits[right] - logits[wrong])


def test_the_pages_transformer_lens_export_is_the_books_ablation(tiny_folder, tmp_path, monkeypatch):
    folder = tiny_folder("llama")
    items = _items()
    monkeypatch.chdir(tmp_path)
    exec(compile(page_code(), str(PAGE), "exec"), {"MODEL": folder, "items": items})   # the page, as written
    table = pd.read_csv(tmp_path / "outcomes.csv")
    assert len(table) == len(items) * len(CONDITIONS) and set(table.condition) == set(CONDITIONS)
    got = table.set_index(["item", "condition"])

    lm = load_model(folder)
    want = {}
    with torch.no_grad():
        for name, heads in CONDITIONS.items():
            with ablate_heads(lm, heads):
                want.update({(it["id"], name): _book_margin(lm, it) for it in items})
    for (item, name), m in want.items():
        assert got.loc[(item, name), "margin"] == pytest.approx(m, abs=1e-4), (item, name)
        if abs(m) > 1e-4:
            assert got.loc[(item, name), "correct"] == int(m > 0), (item, name)
    # the removals move the margins here, so an export that ignored its hooks could not pass
    moved = [abs(want[(it["id"], "L1H2")] - want[(it["id"], "baseline")]) for it in items]
    assert max(moved) > 0.05

    # `cel stats` reads the export: both conditions offered, on the page's splits
    assert main(["stats", "outcomes.csv", "--out", "verdict.json"]) == 0
    rec = json.loads((tmp_path / "verdict.json").read_text())
    assert {s["heads"] for s in rec["sets"]} == {"L1H2", "L1H2+L2H0"}
    assert rec["n_confirm"] == rec["n_heldout"] == len(items) // 2
