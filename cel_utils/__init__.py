"""cel_utils: the library behind the CEL book (capability enhancement localization).

Modules: ``models`` (loading), ``ablation`` (head ablation), ``tasks`` (built-in and JSONL tasks),
``scoring`` (lm-eval-style scoring), ``screening`` (exact single-head screens), ``theory``
(the toy model of chapter 3), ``plots``, ``cli``.
"""

__version__ = "0.1.0"
