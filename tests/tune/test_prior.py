"""The roofline prior of a TensorRT-LLM tune, from the checked pair and the GPU."""

from __future__ import annotations

from spectool.tuning.prior import roofline_prior
from spectool.tuning.request import TuneRequest, resolve

LLAMA = "meta-llama/Llama-3.1-8B-Instruct"
DRAFT = "meta-llama/Llama-3.2-1B-Instruct"


def _resolved(make_ckpt, tmp_path, gpu):  # noqa: ANN001, ANN202
    return resolve(
        TuneRequest(
            target=str(make_ckpt(LLAMA)),
            drafter=str(make_ckpt(DRAFT)),
            method="draft_model",
            max_draft_len=4,
            engine="trtllm",
            trtllm_version="1.2.1",
            gpu=gpu,
            concurrencies=(1, 8),
            out=tmp_path / "tune",
        )
    )


def test_prior_step_grows_with_k_and_batch(make_ckpt, tmp_path) -> None:
    prior, why = roofline_prior(_resolved(make_ckpt, tmp_path, "h100-sxm"), context=1024)
    assert prior is not None and "trtllm" in why
    # a 1B drafter's k sequential steps: each draft token costs a real share of a target step
    assert prior(1, 0) < prior(1, 1) < prior(1, 4)
    assert 1.1 < prior(1, 4) / prior(1, 1) < 4.0
    assert prior(64, 4) > prior(1, 4)


def test_no_gpu_no_prior(make_ckpt, tmp_path) -> None:
    prior, why = roofline_prior(_resolved(make_ckpt, tmp_path, None), context=1024)
    assert prior is None and "--gpu" in why
