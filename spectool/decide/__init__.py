"""Pure decision math: measured numbers in, frozen dataclasses out; no I/O, no torch.

``latency`` (per-request metrics and summaries), ``acceptance`` (per-position acceptance,
E[tokens | k]), ``cell`` (what one measured cell holds), ``cost`` (the cost inequality with a
bootstrap verdict), ``model`` (step-cost model, k choice, TensorRT-LLM schedule), ``tune`` (which
cells to measure, and the decision).
"""
