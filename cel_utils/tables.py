"""Tables for people: one helper that formats every table a chapter shows.

:func:`table` turns a tidy DataFrame into HTML with readable headers, a fixed number of digits, confidence
intervals as ``[low, high]`` (a ``*ci_low`` column next to its ``*ci_high`` is found by itself), no 0..n index
(a named index becomes a column), empty cells instead of NaN, text that wraps at spaces and head-set names
that wrap after each ``+``, and a wrapper that
scrolls sideways inside the text column instead of being cut off.

Example:
    >>> import pandas as pd
    >>> from cel_utils.tables import table
    >>> df = pd.DataFrame({"head": ["L13H0"], "delta_accuracy": [0.19], "ci_low": [0.13], "ci_high": [0.25],
    ...                    "sigma": [1e-6]})
    >>> html = table(df, formats={"sigma": "{:g}"}).data
    >>> "[+0.130, +0.250]" in html, "<th>change in accuracy</th>" in html, "<td>1e-06</td>" in html
    (True, True, True)
"""

from __future__ import annotations

import numbers
import re

import numpy as np
import pandas as pd

# words in column names that read better spelled out; everything else: underscores become spaces
WORDS = {"delta": "change in", "acc": "accuracy", "dloss": "change in loss", "dacc": "change in accuracy",
         "ci": "95% CI", "n": "number of", "mde": "min. detectable gain", "pct": "%", "kv": "key/value"}
SPLITS = {"search": "search split", "confirm": "confirm split", "held-out": "held-out", "explore": "explore split"}
SET_BREAK = re.compile(r"\+(?=L\d+H\d)")   # a head-set name (L0H7+L11H6) may break after each "+"
SIGNED = ("delta", "change", "gain", "cost", "dloss", "dacc", "interaction", "area")
# columns that count things: shown as whole numbers even when a missing value made them floats ("4", not "4.000")
COUNTS = re.compile(r"^(n|k|size|runs|heads|items|fixes|breaks|tokens|seeds|confirmed_heads|wrong_items)$|^n_|"
                    r"_(items|fixes|breaks|runs|count|tokens|seeds)$")


def header(name: str) -> str:
    """A readable column header: ``delta_accuracy`` -> ``change in accuracy``, ``p_holm`` -> ``p (Holm)``,
    ``search_delta_margin`` -> ``change in mean margin, search split``."""
    special = {"p_holm": "p (Holm)", "q_value": "q (BH)", "p_value": "p", "ci_low": "95% CI",
               "delta_margin": "change in mean margin"}
    if name in special:
        return special[name]
    words = str(name).replace("heldout", "held-out").split("_")
    if words[1:] == ["delta", "margin"] and words[0] in SPLITS:   # search_delta_margin: a figure's ranking axis
        return f"change in mean margin, {SPLITS[words[0]]}"
    if len(words) > 1 and words[-1] == "delta":  # heldout_delta -> held-out change
        return " ".join(words[:-1]) + " change"
    if words[-2:] == ["ci", "low"]:                # together_ci_low -> together 95% CI
        return " ".join(words[:-2] + ["95% CI"])
    if words[-2:] == ["q", "value"] or words[-2:] == ["p", "value"]:   # confirm_q_value -> confirm q
        return " ".join(words[:-2] + [words[-2]])
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
          digits: int = 3, rename: dict[str, str] | None = None, caption: str | None = None,
          formats: dict | None = None):
    """``df`` as an HTML table for the book (an ``IPython.display.HTML``).

    ``columns`` picks and orders columns; ``ci`` maps a low column to its high column, shown together as
    ``[low, high]`` in the low column's place (default: every ``*ci_low`` column whose ``*ci_high`` exists);
    ``rename`` overrides headers; ``formats`` maps a column to a format string (``"{:g}"``) or a function.
    """
    from html import escape

    from IPython.display import HTML

    if any(n is not None for n in df.index.names):
        df = df.reset_index()   # a named index (a groupby's keys) is a column like the others; others are dropped
    if ci is None:
        ci = {c: c[:-3] + "high" for c in df.columns if str(c).endswith("ci_low") and c[:-3] + "high" in df.columns}
    cols = [c for c in (columns or list(df.columns)) if c not in ci.values()]
    rename, formats = rename or {}, formats or {}
    heads = [rename.get(c, header(c)) for c in cols]
    rows = []
    for r in df.to_dict("records"):   # not iterrows: it would turn the integers of a numeric row into floats
        cells = []
        for i, c in enumerate(cols):
            if c in ci:
                lo, hi = r[c], r[ci[c]]
                ref = cols[i - 1] if i and cols[i - 1] not in ci else "delta"   # signed like the estimate before it
                txt = "" if pd.isna(lo) else f"[{cell(lo, ref, digits)}, {cell(hi, ref, digits)}]"
            elif c in formats and not (isinstance(r[c], float) and np.isnan(r[c])):
                f = formats[c]
                txt = f(r[c]) if callable(f) else f.format(r[c])
            elif COUNTS.search(str(c)) and isinstance(r[c], float) and r[c].is_integer():
                txt = cell(int(r[c]), c, digits)
            else:
                txt = cell(r[c], c, digits)
            cells.append(f"<td>{SET_BREAK.sub('+<wbr>', escape(txt))}</td>")
        rows.append("<tr>" + "".join(cells) + "</tr>")
    if not rows:   # an empty table says so instead of showing bare headers
        rows.append(f'<tr><td colspan="{len(cols)}"><em>none</em></td></tr>')
    cap = f"<caption>{escape(caption)}</caption>" if caption else ""
    html = ('<div class="cel-table" style="overflow-x:auto; max-width:100%;">'
            '<table class="dataframe" style="white-space:normal; word-break:normal; overflow-wrap:normal;">' + cap +
            "<thead><tr>" + "".join(f"<th>{escape(h)}</th>" for h in heads) + "</tr></thead><tbody>" +
            "".join(rows) + "</tbody></table></div>")
    return HTML(html)
