"""What the three book test files (test_book_records, test_book_pages, test_book_browser) share: the small
parameters every chapter runs at in the tests, and reading a chapter's record. The chapters are executed once
per session by the ``staged`` fixture of conftest.py."""

import json

CI_PARAMETERS = {
    "01_screening": {"n_search": 8, "n_confirm": 10, "n_heldout": 8, "top_k": 3, "heads": "all"},
    # fdr above 1 confirms every re-tested head that gains, so that the held-out, cost and mean-ablation paths run
    "01a_landscape": {"candidates": {"smollm2-135m": ["addition", "sentiment"], "gemma3-270m": ["agreement_rc"]},
                      "pairs_per_model": 2, "band": [0.0, 1.0], "n_calibrate": 6,
                      "n_search": 6, "n_confirm": 10, "n_heldout": 8, "n_cost": 6, "screen_heads": "L13,L14",
                      "top_k": 2, "fdr": 1.01, "power_sims": 200, "design_sims": 100},
    "01b_screening_at_scale": {"models": ["smollm2-135m"], "n_items": 6, "n_plain_heads": 3,
                               "compressed_evals": 20, "dtype_heads": 12},
    "01c_capability": {"n_items": 6, "text_tokens": 300, "text_max_tokens": 600, "constant_steps": 1, "n_other": 6, "n_search": 6,
                       "random_heads": 1, "label_boot": 20, "oc_sims": 20},
    "02_joint_search": {"models": ["smollm2-135m"], "tasks": {"smollm2-135m": ["addition", "agreement_rc"]},
                        "cost_tasks": {"smollm2-135m": ["addition", "agreement_rc", "sentiment"]}, "n_search": 6,
                        "n_screen": 6, "n_confirm": 10, "n_heldout": 8, "n_explore": 6, "n_cost": 6,
                        "screen_heads": "L13,L14",
                        "pool_size": 3, "max_size": 2, "random_sets": 4, "random_pools": 2, "fdr": 1.01,
                        "gate_steps": 2, "selector_max_k": 2, "selector_random_sets": 2,
                        "selector_compressed_evals": 8},
    "02a_mechanism": {"heads_per_model": 1, "n_items": 8, "n_tokens": 5, "n_positions": 6, "n_flipped_rows": 2},
    "02b_remove_scale_boost": {"alphas": [0.0, 0.5, 1.0, 1.5], "n_choose": 12, "n_grade": 12, "n_search": 6,
                               "boost_max_k": 2, "recall_k": 3, "recall_budgets": [6.0], "ceiling_wrong": 4, "n_perm": 200, "text_tokens": 200, "n_cost": 6},
    "03a_conflict_or_noise": {"sigmas": [1e-4, 1.0], "n_seeds": 4, "steps": 1500, "n_perm": 200, "proxy_items": 4,
                              "net_seeds": 3, "net_steps": 100, "net_every": 50},
    "04_findings": {},
    "05_closing": {},
    "03_theory": {"steps": 3000, "sweep_sigmas": [1e-4, 1.0], "sweep_heads": [2, 4], "sweep_seeds": 3,
                  "sweep_steps": 1500, "control_seeds": 3, "early_sigmas": [1e-4, 1e-2], "early_seeds": 8,
                  "early_steps": 2500},
}


def record(staged, name):
    """The record (``<chapter>.record.json``) chapter ``name`` wrote when ``staged`` executed it."""
    root, _ = staged
    return json.loads((root / "book" / "chapters" / f"{name}.record.json").read_text())

