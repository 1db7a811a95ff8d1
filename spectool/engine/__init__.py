"""Self-contained PyTorch inference engine with speculative decoding (CPU, or CUDA if present).

Modules, bottom up: ``model`` (Llama / Qwen2 / Qwen3 ``Transformer``), ``kv_cache`` (slots,
per-slot lengths, rollback), ``load`` (Hugging Face folder -> model), ``tokenizer`` (text, chat
template, streaming decode), ``sampling`` (``SamplingParams``, logits -> probabilities),
``speculative`` (proposers and verification), ``engine`` (continuous batching: the ``Engine`` the
server drives). Nothing is imported here, so ``import spectool.engine`` does not load torch.
"""
