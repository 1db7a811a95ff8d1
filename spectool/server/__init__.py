"""spectool's OpenAI-compatible HTTP server over the embedded engine (FastAPI + uvicorn).

Modules: ``schemas`` (request/response bodies), ``driver`` (the engine on its own thread, one
asyncio stream per request, stop strings), ``metrics`` (iteration stats as TensorRT-LLM's
``/metrics`` JSON), ``errors`` (OpenAI-shaped errors and their handlers), ``generation`` (a
request's sampling settings), ``responses`` (whole and streamed responses), ``app``
(``create_app``: routes), ``run`` (uvicorn, binding, shutdown). Nothing is imported here, so
``import spectool.server`` loads neither torch nor FastAPI.
"""
