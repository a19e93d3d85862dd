"""Probe (kept at the commit that still had both mechanisms): the tree update of a stored run's first GRPO step under
each tree-attention mechanism (TREE_MECH = mask | seg), every row back-propagated and rows with advantage 0 skipped.

    .venv/bin/python experiments/tree_attention_probe.py RUN MODEL [mask seg]
"""
import os
import sys

import torch

from envace.bench.train import _update, stored_step_rows
from envace.policy.models import load_policy

torch.set_num_threads(2)
run, model = sys.argv[1], sys.argv[2]
(rows, adv), = stored_step_rows("runs", run, 1)
base, tok = load_policy(model)
for mech in sys.argv[3:] or ["mask", "seg"]:
    os.environ["TREE_MECH"] = mech
    for skip in (False, True):
        stats, _ = _update(base, rows, adv, tok.pad_token_id, "tree", 2e-4, None, skip)
        print(mech, "A = 0 skipped" if skip else "every row", f"{stats['wall_s']:.1f} s",
              f"peak +{stats['peak_mib']:.0f} MiB", stats["packs"], "passes", stats["forward_tokens"], "tokens",
              flush=True)
