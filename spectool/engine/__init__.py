"""Self-contained PyTorch inference engine with speculative decoding (CPU, or CUDA if present).

Modules, bottom up: ``model`` (Llama / Qwen2 / Qwen3 ``Transformer``), ``kv_cache`` (slots,
per-slot lengths, rollback), ``load`` (Hugging Face folder -> model), ``tokenizer`` (text, chat
template, streaming decode), ``sampling`` (``SamplingParams``, logits -> probabilities),
``proposers`` (the registry of drafting methods behind one ``Proposer`` protocol: draft model,
n-gram, EAGLE-3 with its head in ``eagle3_head``),
``speculative`` (verification, shared by every method), ``engine`` (continuous batching: the
``Engine`` the server drives; ``config`` and ``records`` hold its configuration and records).
Nothing is imported here, so ``import spectool.engine`` does not load torch.
"""
