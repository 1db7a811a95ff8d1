"""The only code that knows TensorRT-LLM.

* :mod:`~spectool.trtllm.releases` - per-release policy (spellings, backends, serve flags, SMs);
* :mod:`~spectool.trtllm.method_specs` - how each method is written per release, and refusals;
* :mod:`~spectool.trtllm.options` - per-release option tables (config classes and fields);
* :mod:`~spectool.trtllm.versions` - installed version -> generation;
* :mod:`~spectool.trtllm.support` - ``support_findings`` for ``spectool check``;
* :mod:`~spectool.trtllm.validate` - ``validate_options`` for ``--config`` YAML
  (:mod:`~spectool.trtllm.validate_installed`: with an installed TensorRT-LLM);
* :mod:`~spectool.trtllm.spec_yaml` - ``render_speculative_yaml`` / ``render_baseline_yaml``;
* :mod:`~spectool.trtllm.gates` - which runtime gates each release honours;
* :mod:`~spectool.trtllm.engine_build` - legacy TensorRT engine build steps;
* :mod:`~spectool.trtllm.launch` - ``trtllm-serve`` / ``trtllm-build`` argv, finding them;
* :mod:`~spectool.trtllm.iter_stats` - ``/metrics`` iteration stats records.
"""
