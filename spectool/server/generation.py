"""An OpenAI request mapped onto the engine: the context check and the sampling settings."""

from __future__ import annotations

from spectool.engine.engine import SamplingParams
from spectool.server.driver import GenerationRequest
from spectool.server.errors import APIError
from spectool.server.schemas import ChatCompletionRequest, CompletionRequest

DEFAULT_TEMPERATURE = 1.0  # OpenAI's (and trtllm-serve's) default
# Smaller positive temperatures are raised to this (as vLLM does): logits / 1e-40 overflow.
MIN_POSITIVE_TEMPERATURE = 1e-2


def check_context(max_seq_len: int, prompt_len: int, max_tokens: int | None) -> None:
    """A requested output that cannot fit the context is refused (400, as vLLM does), not cut."""
    if max_tokens is not None and prompt_len + max_tokens > max_seq_len:
        raise APIError(
            400,
            f"This model's maximum context length is {max_seq_len} tokens. However, you "
            f"requested {prompt_len + max_tokens} tokens ({prompt_len} in the prompt, "
            f"{max_tokens} in the completion). Please reduce the length of the prompt or "
            "completion.",
            param="max_tokens",
        )


def generation_request(
    body: CompletionRequest | ChatCompletionRequest,
    prompt_ids: list[int],
    max_tokens: int,
    vocab_size: int,
) -> GenerationRequest:
    """Map an OpenAI request onto engine sampling (raises BadInputError on bad combinations).

    ``top_k`` of -1, 0 or at least ``vocab_size`` keeps the whole vocabulary; a temperature
    in (0, ``MIN_POSITIVE_TEMPERATURE``) is raised to it.
    """
    temperature = DEFAULT_TEMPERATURE if body.temperature is None else body.temperature
    if 0.0 < temperature < MIN_POSITIVE_TEMPERATURE:
        temperature = MIN_POSITIVE_TEMPERATURE
    top_k = body.top_k or 0
    if top_k < 0 or top_k >= vocab_size:
        top_k = 0
    params = SamplingParams(
        temperature=temperature,
        top_p=1.0 if body.top_p is None else body.top_p,
        top_k=top_k,
        seed=body.seed,
        max_tokens=max_tokens,
        min_tokens=body.min_tokens,
        ignore_eos=body.ignore_eos,
        stop_token_ids=tuple(body.stop_token_ids or ()),
    )
    return GenerationRequest(
        prompt_ids=tuple(prompt_ids),
        params=params,
        stop=body.stop_strings,
        include_stop_str_in_output=body.include_stop_str_in_output,
        skip_special_tokens=body.skip_special_tokens,
    )
