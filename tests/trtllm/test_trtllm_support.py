"""support_findings: what TensorRT-LLM can run, per method, backend, release, architecture and SM."""

from __future__ import annotations

import pytest

from spectool.errors import ConfigError
from spectool.findings import Severity
from spectool.trtllm.support import GATE_INERT, RESUME_BUG, support_findings

GATE_CODES = {GATE_INERT, RESUME_BUG}


def _codes(findings):
    """Codes of the support rules; the runtime-gate findings have tests of their own below."""
    return [(f.code, f.severity) for f in findings if f.code not in GATE_CODES]


def _run(method, backend="pytorch", release="1.2", arch=None, drafter=None, sm=None):
    return support_findings(
        method,
        target_architecture=arch,
        drafter_kind=drafter,
        backend=backend,
        release=release,
        sm=sm,
    )


ERR = ("UNSUPPORTED_BY_TRTLLM", Severity.ERROR)


@pytest.mark.parametrize("release", ["0.21", "1.0", "1.1", "1.2", "main"])
def test_medusa_on_pytorch_is_an_error(release):
    findings = _run("medusa", "pytorch", release)
    assert _codes(findings) == [ERR]
    assert "Medusa" in findings[0].message
    if release != "main":
        assert findings[0].hint == "use --trtllm-backend tensorrt"


def test_eagle_on_pytorch_1_2_warns_alias():
    findings = _run("eagle", "pytorch", "1.2", arch="LlamaForCausalLM", drafter="eagle3", sm=90)
    assert _codes(findings) == [("EAGLE_ALIAS", Severity.WARNING)]
    assert "Eagle3" in findings[0].message


def test_eagle_on_pytorch_with_eagle1_weights_is_an_error():
    findings = _run("eagle", "pytorch", "1.2", drafter="eagle1")
    assert _codes(findings) == [ERR, ("EAGLE_ALIAS", Severity.WARNING)]


def test_eagle_on_tensorrt_1_2_is_ok():
    assert (
        _codes(_run("eagle", "tensorrt", "1.2", arch="LlamaForCausalLM", drafter="eagle1", sm=90))
        == []
    )


def test_eagle_on_tensorrt_needs_a_llama_target():
    findings = _run("eagle", "tensorrt", "1.2", arch="Qwen2ForCausalLM", drafter="eagle1")
    assert _codes(findings) == [ERR]
    assert "Qwen2ForCausalLM" in findings[0].message


def test_eagle_on_main_tensorrt_reports_backend_removed():
    findings = _run("eagle", "tensorrt", "main", arch="LlamaForCausalLM")
    assert _codes(findings) == [ERR]
    assert "removed" in findings[0].message


def test_mtp_on_llama_is_an_error():
    findings = _run("mtp", "pytorch", "1.2", arch="LlamaForCausalLM", drafter="mtp", sm=90)
    assert _codes(findings) == [ERR]
    assert "LlamaForCausalLM" in findings[0].message


def test_mtp_on_deepseek_v3_needs_hopper():
    low = _run("mtp", "pytorch", "1.2", arch="DeepseekV3ForCausalLM", drafter="mtp", sm=80)
    assert _codes(low) == [ERR]
    assert "SM 9.0" in low[0].message and "SM 8.0" in low[0].message
    assert (
        _codes(_run("mtp", "pytorch", "1.2", arch="DeepseekV3ForCausalLM", drafter="mtp", sm=90))
        == []
    )


def test_mtp_architectures_grow_with_releases():
    glm = "Glm4MoeForCausalLM"
    assert _codes(_run("mtp", "pytorch", "1.2", arch=glm)) == [ERR]
    assert _codes(_run("mtp", "pytorch", "main", arch=glm)) == []
    v32 = "DeepseekV32ForCausalLM"
    assert _codes(_run("mtp", "pytorch", "1.1", arch=v32)) == [ERR]
    assert _codes(_run("mtp", "pytorch", "1.2", arch=v32)) == []


def test_deepseek_v4_mtp_needs_blackwell():
    arch = "DeepseekV4ForCausalLM"
    assert _codes(_run("mtp", "pytorch", "main", arch=arch, sm=90)) == [ERR]
    assert _codes(_run("mtp", "pytorch", "main", arch=arch, sm=100)) == []


@pytest.mark.parametrize("method", ["ngram", "mtp", "draft_model", "eagle3"])
def test_pytorch_only_methods_refuse_tensorrt(method):
    findings = _run(method, "tensorrt", "1.2")
    assert _codes(findings) == [ERR]
    assert findings[0].hint == "use --trtllm-backend pytorch"


def test_eagle3_drafter_kind_mismatches():
    assert _codes(_run("eagle3", drafter="eagle1")) == [ERR]
    assert _codes(_run("eagle", "tensorrt", "1.1", drafter="eagle3")) == [ERR]


def test_mtp_with_a_separate_drafter_only_on_main():
    assert _codes(_run("mtp", "pytorch", "1.2", drafter="causal_lm")) == [ERR]
    assert _codes(_run("mtp", "pytorch", "main", drafter="causal_lm")) == []


def test_eagle3_unlisted_architecture_is_a_warning_only():
    findings = _run("eagle3", arch="Gemma3ForCausalLM", drafter="eagle3", sm=90)
    assert _codes(findings) == [("TRTLLM_ARCH_UNLISTED", Severity.WARNING)]
    assert _codes(_run("eagle3", arch="LlamaForCausalLM", drafter="eagle3", sm=90)) == []


def test_sm_checks():
    assert _codes(_run("ngram", sm=75)) == [ERR]
    assert _codes(_run("ngram", sm=87)) == [("TRTLLM_SM_UNLISTED", Severity.WARNING)]
    assert _codes(_run("ngram", sm=89)) == []
    # SM 12.1 (DGX Spark) arrived in 1.0, SM 10.3 (B300) in 1.1.
    assert _codes(_run("ngram", release="0.21", sm=121)) == [
        ("TRTLLM_SM_UNLISTED", Severity.WARNING)
    ]
    assert _codes(_run("ngram", release="1.0", sm=121)) == []
    assert _codes(_run("ngram", release="1.0", sm=103)) == [
        ("TRTLLM_SM_UNLISTED", Severity.WARNING)
    ]
    assert _codes(_run("ngram", release="1.1", sm=103)) == []


def test_bad_arguments_raise():
    with pytest.raises(ConfigError, match="method"):
        _run("lookahead")
    with pytest.raises(ConfigError, match="backend"):
        _run("ngram", backend="vllm")
    with pytest.raises(ConfigError, match="release"):
        _run("ngram", release="0.19")
    with pytest.raises(ConfigError, match="drafter kind"):
        _run("ngram", drafter="medusa2")


@pytest.mark.parametrize(
    ("method", "release", "codes"),
    [
        ("eagle3", "1.1", [GATE_INERT]),
        ("eagle3", "1.2", [GATE_INERT]),
        ("mtp", "1.2", [GATE_INERT]),
        ("draft_model", "1.2", []),
        ("ngram", "1.1", []),
        ("eagle3", "1.0", []),  # no gate keys at all: nothing to be inert
        ("eagle3", "main", [RESUME_BUG]),
        ("mtp", "main", [RESUME_BUG]),
        ("ngram", "main", []),
    ],
)
def test_runtime_gate_findings_follow_the_gate_table(method, release, codes):
    findings = [f for f in _run(method, "pytorch", release) if f.code in GATE_CODES]
    assert [f.code for f in findings] == codes
    assert all(f.severity is Severity.WARNING for f in findings)
    if codes == [GATE_INERT] and method == "eagle3":
        assert "--inert-gate two-model" in findings[0].hint
        assert "self.drafter is not None" in findings[0].message
    if codes == [RESUME_BUG]:
        assert "#16888" in findings[0].message
