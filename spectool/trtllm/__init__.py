"""The only code that knows TensorRT-LLM.

* :mod:`~spectool.trtllm.releases` - per-release option tables and policy, version mapping;
* :mod:`~spectool.trtllm.support` - ``support_findings`` for ``spectool check``;
* :mod:`~spectool.trtllm.validate` - ``validate_options`` for ``--config`` YAML;
* :mod:`~spectool.trtllm.spec_yaml` - ``render_speculative_yaml`` / ``render_baseline_yaml``;
* :mod:`~spectool.trtllm.launch` - ``trtllm-serve`` / ``trtllm-build`` argv, readiness wait;
* :mod:`~spectool.trtllm.iter_stats` - ``/metrics`` iteration stats records.
"""
