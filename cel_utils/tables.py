"""Tables for people: one helper that formats every table a chapter shows.

:func:`table` turns a tidy DataFrame into HTML with readable headers, a fixed number of digits, confidence
intervals as ``[low, high]``, no index, and a wrapper that scrolls sideways inside the text column instead of
being cut off.

Example:
    >>> import pandas as pd
    >>> from cel_utils.tables import table
    >>> df = pd.DataFrame({"head": ["L13H0"], "delta_accuracy": [0.19], "ci_low": [0.13], "ci_high": [0.25]})
    >>> "[+0.130, +0.250]" in table(df, ci={"ci_low": "ci_high"}).data
    True
"""

from __future__ import annotations

import numbers

import numpy as np
import pandas as pd

# words in column names that read better spelled out; everything else: underscores become spaces
WORDS = {"delta": "change in", "acc": "accuracy", "dloss": "change in loss", "ci": "95% CI"}
SIGNED = ("delta", "change", "gain", "cost", "dloss", "dacc", "interaction")


def header(name: str) -> str:
    """A readable column header: ``delta_accuracy`` -> ``change in accuracy``, ``p_holm`` -> ``p (Holm)``."""
    special = {"p_holm": "p (Holm)", "q_value": "q (BH)", "p_value": "p", "mde": "min. detectable gain"}
    if name in special:
        return special[name]
    words = str(name).replace("heldout", "held-out").split("_")
    if len(words) > 1 and words[-1] == "delta":  # heldout_delta -> held-out change
        return " ".join(words[:-1]) + " change"
    return " ".join(WORDS.get(w, w) for w in words)


def cell(value, column: str = "", digits: int = 3) -> str:
    """One formatted value: booleans as yes/no, small p-values in scientific notation, signed changes."""
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return ""
    if isinstance(value, (bool, np.bool_)):
        return "yes" if value else "no"
    if isinstance(value, numbers.Integral):
        return f"{int(value):,}"
    if isinstance(value, numbers.Real):
        v = float(value)
        if column.startswith(("p_", "q_", "p ", "q ")) or column in ("p", "q"):
            return f"{v:.1e}" if 0 < v < 10 ** -digits else f"{v:.{digits}f}"
        if v != 0 and abs(v) < 10 ** -digits:
            return f"{v:+.1e}" if any(s in column for s in SIGNED) else f"{v:.1e}"
        return f"{v:+.{digits}f}" if any(s in column for s in SIGNED) else f"{v:.{digits}f}"
    return str(value)


def table(df: pd.DataFrame, columns: list[str] | None = None, ci: dict[str, str] | None = None,
          digits: int = 3, rename: dict[str, str] | None = None, caption: str | None = None):
    """``df`` as an HTML table for the book (an ``IPython.display.HTML``).

    ``columns`` picks and orders columns; ``ci`` maps a low column to its high column, shown together as
    ``[low, high]`` in the low column's place; ``rename`` overrides headers.
    """
    from html import escape

    from IPython.display import HTML

    ci = ci or {}
    cols = [c for c in (columns or list(df.columns)) if c not in ci.values()]
    rename = rename or {}
    heads = [rename.get(c, "95% CI" if c in ci else header(c)) for c in cols]
    rows = []
    for _, r in df.iterrows():
        cells = []
        for c in cols:
            if c in ci:
                lo, hi = r[c], r[ci[c]]
                ref = next((x for x in cols if x not in ci and x.startswith(("delta", "heldout_delta", "cost"))), c)
                txt = "" if pd.isna(lo) else f"[{cell(lo, ref, digits)}, {cell(hi, ref, digits)}]"
            else:
                txt = cell(r[c], c, digits)
            cells.append(f"<td>{escape(txt)}</td>")
        rows.append("<tr>" + "".join(cells) + "</tr>")
    cap = f"<caption>{escape(caption)}</caption>" if caption else ""
    html = ('<div class="cel-table" style="overflow-x:auto; max-width:100%;"><table class="dataframe">' + cap +
            "<thead><tr>" + "".join(f"<th>{escape(h)}</th>" for h in heads) + "</tr></thead><tbody>" +
            "".join(rows) + "</tbody></table></div>")
    return HTML(html)
