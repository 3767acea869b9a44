"""cel_utils: the library behind the CEL book (capability enhancement localization).

Modules, in the order imports flow (each imports only from modules before it):

* ``errors``, ``defaults``, ``io`` -- the one error type, every default, atomic JSON output
* ``models`` (loading), ``tasks`` (built-in and JSONL tasks), ``ablation`` (head ablation, ``Ablation``)
* ``scoring`` (encoding items, reads, aggregation, the plain-loop reference ``plain_evaluate``)
* ``cache`` (on-disk results), ``engine`` (the exact batched evaluator of head sets)
* ``stats`` (paired statistics), ``compare`` (head sets against the unablated model: ``compare_sets``)
* ``screening`` (single-head screens), ``approximate`` (gradient and compressed-sensing screens, benchmark)
* ``search`` (model-free strategies), ``joint`` (model-backed joint search, controls, cross-task cost)
* ``effects`` (per-class effects, flips), ``theory`` (the toy model of chapter 3)
* ``plots``, ``widgets``, ``book``, ``cli``
"""

__version__ = "0.1.0"
