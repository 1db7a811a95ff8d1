"""``spectool tune``: measure baseline and speculation per concurrency, decide, write outputs.

Modules, one concept each: :mod:`~spectool.tuning.request` (the options, checked and
resolved), :mod:`~spectool.tuning.setup` (what a run measures; the output folder's rules),
:mod:`~spectool.tuning.trials` (the trials of one cell, pooled), :mod:`~spectool.tuning.driver`
(the server protocol) with :mod:`~spectool.tuning.torch_driver` /
:mod:`~spectool.tuning.torch_worker` (embedded engine) and :mod:`~spectool.tuning.trtllm_driver`
(``trtllm-serve``; their children run through :mod:`spectool.deploy.supervise`),
:mod:`~spectool.tuning.session` (the run: measure, decide, write), :mod:`~spectool.tuning.stats`
(per-cell latency and throughput with intervals), :mod:`~spectool.tuning.record` (``tune.json``),
:mod:`~spectool.tuning.report` (``report.md``), :mod:`~spectool.tuning.plots` (PNG figures) and
:mod:`~spectool.tuning.deploy` (``decision.json`` and the build files).
"""
