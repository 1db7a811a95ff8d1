"""Pure decision math: measured numbers in, frozen dataclasses out; no I/O, no torch.

``latency`` (per-request metrics and summaries), ``acceptance`` (per-position acceptance,
E[tokens | k]), ``cell`` (what one measured cell holds), ``verdict`` (what the cost inequality
says about a cell), ``cost`` (the cost inequality with a bootstrap verdict), ``paired`` (the same
from interleaved or bracketed blocks), ``stats`` (per-cell latency and throughput with
intervals), ``model`` (step-cost model, k choice, TensorRT-LLM schedule), ``search`` (which cells
to measure), ``choose`` (the choice from measured cells), ``result`` and ``tune`` (the search
run, and the decision), ``replay`` (tune's search on recorded grids, judged against brute force).
"""
