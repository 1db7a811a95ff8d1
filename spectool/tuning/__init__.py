"""``spectool tune``: measure baseline and speculation per concurrency, decide, write outputs.

Modules, one concept each: :mod:`~spectool.tuning.request` (the options, checked and
resolved), :mod:`~spectool.tuning.setup` (what a run measures; the output folder's rules),
:mod:`~spectool.tuning.plan` (prompts, setup, trial plan and driver of a run),
:mod:`~spectool.tuning.trials` (the trials of one cell, pooled), :mod:`~spectool.tuning.driver`
(the server protocol) with :mod:`~spectool.tuning.torch_driver` /
:mod:`~spectool.tuning.torch_worker` (embedded engine) and :mod:`~spectool.tuning.trtllm_driver`
(``trtllm-serve``; their children run through :mod:`spectool.deploy.supervise`),
:mod:`~spectool.tuning.pairing` (paired blocks), :mod:`~spectool.tuning.resume` (what a resumed
run reuses), :mod:`~spectool.tuning.session` (the run: measure, decide, write),
:mod:`~spectool.tuning.outcome` (what a finished run holds), :mod:`~spectool.tuning.outputs`
(every output of a run) written by :mod:`~spectool.tuning.record` (``tune.json``),
:mod:`~spectool.tuning.report` (``report.md``), :mod:`~spectool.tuning.plots` (PNG figures) and
:mod:`~spectool.tuning.deploy` (``decision.json`` and the build files). Per-cell statistics are
decide's (:mod:`spectool.decide.stats`).
"""
