"""cel_utils: the library behind the CEL book (capability enhancement localization).

Modules, in the order imports flow (each imports only from modules before it):

* ``errors``, ``defaults``, ``design``, ``io`` -- the one error type, every default, the shared ``Design`` of a
  run (split sizes, error rates, ablation, bootstrap, seed), atomic JSON output
* ``threads`` (torch's threads chosen by measurement: the cores other processes leave free; one for the toy)
* ``profiling`` (where a chapter's time goes: each model-running call logged when ``CEL_PROFILE`` names a file)
* ``lockfile`` (the lock every install reads: its pins, its digest, the environment.yml written from it)
* ``records`` (the one reader of the chapters' records: a pair's verdict, chosen sets, labels, selectors)
* ``findings`` (the book's answer to its own question, written from the records)
* ``hooks`` (model internals: per-family layout, named points, hooks always removed), ``cache`` (on-disk results)
* ``models`` (loading), ``tiny`` (tiny random models for tests and exercise checks)
* ``generators`` (the built-in tasks' items), ``variants`` (each family's difficulty knob), ``tasks`` (splits)
* ``formats`` (each task's items asked in eight meaning-preserving prompt formats)
* ``ablation`` (the kinds of head ablation in one place: zero, mean, resample, constant, scale), ``scoring``
  (items, reads, the plain-loop reference ``plain_evaluate``)
* ``export`` (a head set's removal written into the weights: a standard model folder, ``cel export``)
* ``engine`` (the exact batched evaluator of head sets), ``calibration`` (which tasks leave room: search split)
* ``stats`` (paired statistics, exact tests, the rules)
* ``labels`` (the battery's checks and label read from per-item outcomes: a test behind every word)
* ``operating`` (how often each label is right: the label rule on planted truths)
* ``search`` (model-free search strategies: exhaustive, greedy, beam)
* ``power`` (the power of the whole pipeline: a head planted in the real screen, simulated through every stage)
* ``compare`` (head sets against the unablated model: ``compare_sets``)
* ``pipeline`` (the book's method written once: confirm, choose, held-out, the control; the ``Run`` result)
* ``screening`` (single-head screens), ``approximate`` (gradient and compressed-sensing screens, benchmark)
* ``joint`` (model-backed pool search, chapter 2's joint search, controls, cross-task cost)
* ``gates`` (learned head gates over all heads)
* ``direct`` (direct logit attribution: reads, the clean trace at them, each head's direct effect and ranking)
* ``selectors`` (every way of choosing heads: the ``Selector`` protocol and its registry), ``comparison``
  (every selector side by side on held-out items)
* ``effects`` (per-class effects, flips), ``robust`` (is it a capability? formats, generation, ablation types)
* ``battery`` (the checks run together on head sets, and the label rules)
* ``verdict`` (choose, confirm, report on three splits)
* ``outcomes`` (the same confirm -> held-out verdict on anyone's per-item outcomes table: ``cel stats``)
* ``landscape`` (chapter 1a's tables over many verdicts: costs, designs, equals, rank stability, the bridge)
* ``mechanism`` (inside a head: its direct and total effects, the path split), ``attention`` (where it attends, by role)
* ``sinks`` (the noise account's proxy in real models: sink mass and output norm per head against removal gain)
* ``explanation`` (a head's profile, its sentence and record: chapter 2a and ``cel explain``)
* ``dose`` (remove, scale or boost: dose curves, boost against removal, the per-item ceiling; chapter 2b)
* ``theory`` (the toy model of chapter 3), ``dynamics`` (its early phase, derived and checked)
* ``rival`` (conflict or noise: the toy with heads that can abstain, the signature in real models; chapter 3a)
* ``toynet`` (the toy's data as tokens, learned by a one-layer attention-only Llama trained on CPU; chapter 3a)
* ``checks`` (checks for the exercises), ``checks_numeric`` (the exercises' checks that need no model)
* ``heldback`` (the checks on inputs the chapters do not show), ``exercises`` (the offline autograder: registry, held-back checks)
* ``gradebook`` (a folder of submissions graded: one row per student and exercise, CSV or JSON)
* ``tables`` (tables for people), ``figcheck`` (what every figure must satisfy), ``plots`` (offline plotly figures)
* ``joint_plots`` (chapter 2's figures), ``explanation_plots`` (chapter 2a's view of a head), ``theory_plots``
  (chapter 3's figures)
* ``widgets`` (live explorers, the kernel-free subset explorer)
* ``shards`` (screens in shards, ``cel merge``), ``cluster`` (a screen's chunks on a pool of Ray workers, ``--ray``)
* ``book`` (execute the chapters, build the HTML)
* ``lm_eval_model`` (lm-evaluation-harness's model type ``cel``: its HF model with heads removed; ``cel lm-eval``)
* ``cli_common`` (the ``cel`` command's arguments and shared helpers)
* ``cli_screen`` (``cel screen``, ``cel search``, ``cel merge``)
* ``cli`` (the ``cel`` command line: the other commands and ``main``)
"""

__version__ = "0.1.0"
