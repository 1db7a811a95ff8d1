"""Issue 25 (part 1): parallel layouts through `check --json` and `build`, end to end.

Two deployments: DeepSeek-V3 MTP at TP 8 / EP 8 / attention DP on one 8-GPU node (the fixture
checkpoint), and a Llama-3.1-405B-shaped target at TP 8 x PP 2 on two 8-GPU nodes (written here
from its published config: 126 layers, hidden 16384, 128 heads, 8 KV heads, head_dim 128,
intermediate 53248, vocab 128256) with an EAGLE-3 head of its width (a draft model there is
refused: TensorRT-LLM's pipeline-parallel executor loop runs no separate drafter).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml
from ckpt_factory import fixture_dir, write_safetensors, write_tokenizer

from spectool.cli.app import main
from spectool.trtllm.releases import RELEASES
from spectool.trtllm.validate import validate_options

DSV3 = "deepseek-ai/DeepSeek-V3"
LLAMA8B = "meta-llama/Llama-3.1-8B-Instruct"
EAGLE3_8B = "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"
DSV3_LAYOUT = ["--tp", "8", "--ep", "8", "--attention-dp"]
L405_LAYOUT = ["--tp", "8", "--pp", "2", "--nodes", "2", "--gpus-per-node", "8"]
# one --trtllm-version per generation spectool knows
VERSIONS = {"0.21": "0.21.0", "1.0": "1.0.0", "1.1": "1.1.0", "1.2": "1.2.1", "main": "main"}
L405_SIZES = {
    "hidden": 16384,
    "inter": 53248,
    "layers": 126,
    "heads": 128,
    "kv": 8,
    "vocab": 128256,
}


def _write_405b_config(folder: Path, fixture: str, **extra: int) -> dict:
    """``folder`` made, with ``fixture``'s config.json at Llama-3.1-405B's widths (and
    ``extra``); the config written."""
    folder.mkdir()
    s = L405_SIZES
    config = json.loads((fixture_dir(fixture) / "config.json").read_text())
    config.update(
        hidden_size=s["hidden"],
        intermediate_size=s["inter"],
        num_attention_heads=s["heads"],
        num_key_value_heads=s["kv"],
        **extra,
    )
    (folder / "config.json").write_text(json.dumps(config))
    return config


def _llama_405b(root: Path) -> Path:
    """A sparse bf16 checkpoint with Llama-3.1-405B's config and tensor shapes."""
    folder = root / "Llama-3.1-405B-Instruct"
    if folder.exists():
        return folder
    s = L405_SIZES
    _write_405b_config(folder, LLAMA8B, num_hidden_layers=s["layers"])
    h, kv = s["hidden"], s["kv"] * 128
    layer = {
        "input_layernorm.weight": [h],
        "post_attention_layernorm.weight": [h],
        "self_attn.q_proj.weight": [h, h],
        "self_attn.k_proj.weight": [kv, h],
        "self_attn.v_proj.weight": [kv, h],
        "self_attn.o_proj.weight": [h, h],
        "mlp.gate_proj.weight": [s["inter"], h],
        "mlp.up_proj.weight": [s["inter"], h],
        "mlp.down_proj.weight": [h, s["inter"]],
    }
    tensors = {"model.embed_tokens.weight": ("BF16", [s["vocab"], h])}
    for i in range(s["layers"]):
        tensors |= {f"model.layers.{i}.{k}": ("BF16", shape) for k, shape in layer.items()}
    tensors |= {"model.norm.weight": ("BF16", [h]), "lm_head.weight": ("BF16", [s["vocab"], h])}
    names = list(tensors)
    per = math.ceil(len(names) / 8)
    for j in range(8):
        chunk = names[j * per : (j + 1) * per]
        write_safetensors(folder / f"model-{j:05d}.safetensors", {n: tensors[n] for n in chunk})
    write_tokenizer(folder, "llama3", 128256)
    return folder


def _eagle3_405b(root: Path) -> Path:
    """A sparse EAGLE-3 head for the 405B target (the EAGLE3-LLaMA3.1-Instruct-8B layout at
    hidden 16384): TensorRT-LLM runs EAGLE-3 as one model under PP, a draft model it refuses."""
    folder = root / "EAGLE3-Llama-3.1-405B"
    if folder.exists():
        return folder
    s = L405_SIZES
    config = _write_405b_config(folder, EAGLE3_8B)
    h, kv, inter = s["hidden"], s["kv"] * 128, s["inter"]
    tensors = {
        "midlayer.self_attn.q_proj.weight": ("BF16", [h, 2 * h]),
        "midlayer.self_attn.k_proj.weight": ("BF16", [kv, 2 * h]),
        "midlayer.self_attn.v_proj.weight": ("BF16", [kv, 2 * h]),
        "midlayer.self_attn.o_proj.weight": ("BF16", [h, h]),
        "midlayer.mlp.gate_proj.weight": ("BF16", [inter, h]),
        "midlayer.mlp.up_proj.weight": ("BF16", [inter, h]),
        "midlayer.mlp.down_proj.weight": ("BF16", [h, inter]),
        "midlayer.hidden_norm.weight": ("BF16", [h]),
        "midlayer.input_layernorm.weight": ("BF16", [h]),
        "midlayer.post_attention_layernorm.weight": ("BF16", [h]),
        "fc.weight": ("BF16", [h, 3 * h]),
        "norm.weight": ("BF16", [h]),
        "lm_head.weight": ("BF16", [config["draft_vocab_size"], h]),
        "d2t": ("I64", [config["draft_vocab_size"]]),
        "t2d": ("BOOL", [s["vocab"]]),
    }
    write_safetensors(folder / "model.safetensors", tensors)
    return folder


def _run(capsys, *argv: str) -> tuple[int, dict]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert not err or code != 0, err
    return code, json.loads(out) if out.strip().startswith("{") else {}


def test_deepseek_mtp_tp8_ep8_attention_dp_per_rank_memory(make_ckpt, capsys) -> None:
    ds = str(make_ckpt(DSV3))
    code, report = _run(
        capsys, "check", ds, "self", "--method", "mtp", "--gpu", "h200", *DSV3_LAYOUT, "--json"
    )
    assert code == 0, report["findings"]
    memory = report["memory"]
    assert memory["layout"]["world_size"] == 8 and memory["layout"]["attention_dp"] is True
    (row,) = memory["per_rank"]  # PP 1: one stage, ranks 0-7 on node 0
    assert (row["ranks"], row["nodes"], row["layers"]) == ("0-7", "0", "0-60")
    assert row["experts_per_rank"] == 256 // 8
    # experts: each rank holds 1/8 of the routed experts' bytes (EP 8 x MoE-TP 1)
    from spectool.ckpt.inspect import inspect_folder
    from spectool.memory_ranks import split_weights

    split = split_weights(inspect_folder(Path(ds)))
    assert row["expert_bytes"] == sum(split.layer_experts) // 8
    # attention DP: the non-expert weights are replicated, not divided by 8
    assert row["attention_dense_bytes"] == sum(split.layer_dense)
    # the MTP module lives on every rank, replicated except its experts (EP-split)
    assert row["drafter_bytes"] == split.mtp_dense + split.mtp_experts // 8
    assert "every rank" in row["drafter_placement"]
    # MLA latent KV: 61 layers x (512 + 64) x 2 bytes, not split by TP
    assert row["kv_bytes_per_token"] == 61 * 576 * 2
    assert memory["target_weight_bytes"] == row["weight_bytes"] - row["drafter_bytes"]
    assert 0 < row["sequences_with_drafter"] <= row["sequences_without_drafter"]


@pytest.mark.parametrize("release", RELEASES)
def test_deepseek_layout_build_for_every_release(make_ckpt, tmp_path, capsys, release) -> None:
    out = tmp_path / release
    argv = ["build", str(make_ckpt(DSV3)), "self", "--method", "mtp", "--gpu", "h200"]
    argv += [*DSV3_LAYOUT, "--trtllm-version", VERSIONS[release], "--out", str(out), "--json"]
    code, result = _run(capsys, *argv)
    assert code == 0, result
    assert {"launch.slurm", "launch-mpirun.sh"} <= set(result["files"])
    for name in ("speculative.yaml", "baseline.yaml"):
        options = yaml.safe_load((out / name).read_text())
        assert options["tensor_parallel_size"] == 8
        assert options["pipeline_parallel_size"] == 1
        assert options["moe_expert_parallel_size"] == 8
        assert options["enable_attention_dp"] is True
        validate_options(options, release, "pytorch", use_installed=False)
    manifest = json.loads((out / "manifest.json").read_text())
    serve = manifest["commands"]["serve"]
    for flag, value in (("--tp_size", "8"), ("--ep_size", "8"), ("--gpus_per_node", "8")):
        assert serve[serve.index(flag) + 1] == value
    parallel = manifest["parallel"]
    assert parallel["per_rank"][0]["experts_per_rank"] == 32
    assert parallel["launch_files"] == ["launch.slurm", "launch-mpirun.sh"]


def test_llama_405b_tp8_pp2_two_nodes(make_ckpt, tmp_path, capsys) -> None:
    target = str(_llama_405b(tmp_path))
    drafter = str(_eagle3_405b(tmp_path))
    pair = [target, drafter, "--method", "eagle3", "--gpu", "h200", *L405_LAYOUT]
    code, report = _run(capsys, "check", *pair, "--json")
    assert code == 0, report["findings"]
    # a draft model on the same layout: TensorRT-LLM's PP executor loop refuses to draft
    as_draft = [target, str(make_ckpt(LLAMA8B)), "--method", "draft_model", "--gpu", "h200"]
    code, refused = _run(capsys, "check", *as_draft, *L405_LAYOUT, "--json")
    assert code == 1
    assert "DRAFTER_WITH_PIPELINE_PARALLEL" in {f["code"] for f in refused["findings"]}
    rows = report["memory"]["per_rank"]
    assert [(r["ranks"], r["nodes"], r["layers"]) for r in rows] == [
        ("0-7", "0", "0-62"),
        ("8-15", "1", "63-125"),
    ]
    from spectool.ckpt.inspect import inspect_folder

    total = inspect_folder(Path(target)).weight_bytes
    s = L405_SIZES
    embedding = s["vocab"] * s["hidden"] * 2
    for row in rows:
        # dense: one stage's weights ~ total / (TP x PP), give or take the embedding / LM head
        target_bytes = row["weight_bytes"] - row["drafter_bytes"]
        assert abs(target_bytes - total / 16) <= embedding / 8
        assert row["expert_bytes"] == 0 and row["experts_per_rank"] is None
        # the EAGLE-3 head on every stage (one-model drafting, no stage condition), TP 8
        assert row["drafter_bytes"] == inspect_folder(Path(drafter)).weight_bytes // 8
        # 63 layers x 2 (K, V) x 1 KV head per rank (8 / TP 8) x 128 x 2 bytes
        assert row["kv_bytes_per_token"] == 63 * 2 * 1 * 128 * 2
    out = tmp_path / "build"
    code, result = _run(capsys, "build", *pair, "--trtllm-version", "1.2.1", "--out", str(out))
    assert code == 0, result
    options = yaml.safe_load((out / "speculative.yaml").read_text())
    assert (options["tensor_parallel_size"], options["pipeline_parallel_size"]) == (8, 2)
    slurm = (out / "launch.slurm").read_text()
    assert "#SBATCH --nodes=2\n" in slurm and "#SBATCH --ntasks-per-node=8\n" in slurm
    assert "srun --mpi=pmix" in slurm and "trtllm-llmapi-launch" in slurm
    assert "--pp_size 2" in slurm and "--gpus_per_node 8" in slurm and target in slurm
    mpirun = (out / "launch-mpirun.sh").read_text()
    assert "mpirun -np 16 " in mpirun and "trtllm-llmapi-launch" in mpirun
    # never replaced without --force
    again = [
        "build",
        *pair,
        "--trtllm-version",
        "1.2.1",
        "--out",
        str(out),
        "--max-seq-len",
        "4096",
    ]
    assert main(again) == 2 and "--force" in capsys.readouterr().err
    assert (out / "launch.slurm").read_text() == slurm
    assert main([*again, "--force"]) == 0
    capsys.readouterr()
    assert (out / "launch.slurm").read_text() == slurm  # same layout, same command
    # a layout whose ranks do not match the GPUs: one line, exit 2
    assert main(["check", *pair, "--pp", "1"]) == 2
    assert "--tp/--pp/--ep" in capsys.readouterr().err  # 8 ranks on 16 GPUs


@pytest.mark.parametrize(
    ("extra", "flag"),
    [
        (["--tp", "8", "--ep", "3"], "--ep"),
        (["--tp", "8", "--pp", "2", "--nodes", "1", "--gpus-per-node", "8"], "--tp/--pp/--ep"),
        (["--tp", "3"], "--tp"),
        (["--tp", "8", "--pp", "0"], "--pp"),
        (["--tp", "8", "--nodes", "3"], "--nodes"),
        (["--tp", "8", "--gpus-per-node", "0"], "--gpus-per-node"),
    ],
)
def test_bad_layout_is_one_line_exit_2_naming_the_flag(make_ckpt, capsys, extra, flag) -> None:
    code = main(["check", str(make_ckpt(DSV3)), "self", "--method", "mtp", *extra])
    out, err = capsys.readouterr()
    assert code == 2 and not out
    assert len(err.strip().splitlines()) == 1 and flag in err and "Traceback" not in err


def test_dense_model_refuses_expert_parallelism_and_attention_dp(make_ckpt, capsys) -> None:
    for extra, flag in ((["--ep", "8"], "--ep"), (["--attention-dp"], "--attention-dp")):
        code = main(["check", str(make_ckpt(LLAMA8B)), "--method", "ngram", "--tp", "8", *extra])
        err = capsys.readouterr().err
        assert code == 2 and flag in err and "dense" in err


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))


def test_deepseek_profile_layout_checked_offline_against_its_geometry(offline, capsys) -> None:
    argv = ["check", "deepseek-v3-mtp", "--gpu", "h200", *DSV3_LAYOUT, "--json"]
    assert main(argv) == 3  # unverified (no headers offline); the layout itself is fine
    assert json.loads(capsys.readouterr().out)["verdict"] == "unverified"
    assert main(["check", "deepseek-v3-mtp", "--gpu", "h200", "--tp", "8", "--ep", "16"]) == 2
    assert "--ep: EP 16 must divide TP 8" in capsys.readouterr().err


def test_serve_refuses_a_multi_node_build_and_names_the_launch_files(
    make_ckpt, tmp_path, capsys
) -> None:
    target = str(_llama_405b(tmp_path))
    out = tmp_path / "build"
    argv = ["build", target, str(_eagle3_405b(tmp_path)), "--method", "eagle3", "--gpu", "h200"]
    assert main([*argv, *L405_LAYOUT, "--trtllm-version", "1.2.1", "--out", str(out)]) == 0
    capsys.readouterr()
    from spectool.deploy.launch import prepare_serve
    from spectool.errors import BuildMismatchError

    with pytest.raises(BuildMismatchError, match="launch.slurm"):
        prepare_serve(out, trtllm_serve="/bin/true")


def test_a_release_without_a_layout_field_is_refused(make_ckpt, tmp_path, capsys, monkeypatch):
    import spectool.parallel as parallel

    real = parallel.release_layout_problem

    def lacking(layout, release, backend):  # noqa: ANN001, ANN202 - a release without the field
        if layout.attention_dp:
            return f"TensorRT-LLM {release} ({backend}) has no enable_attention_dp option"
        return real(layout, release, backend)

    monkeypatch.setattr(parallel, "release_layout_problem", lacking)
    ds = str(make_ckpt(DSV3))
    pair = [ds, "self", "--method", "mtp", "--gpu", "h200", *DSV3_LAYOUT]
    code, report = _run(capsys, "check", *pair, "--json")
    assert code == 1
    codes = {f["code"]: f["message"] for f in report["findings"]}
    assert "enable_attention_dp" in codes["LAYOUT_UNSUPPORTED_BY_RELEASE"]
    out = tmp_path / "refused"
    assert main(["build", *pair, "--out", str(out)]) == 1 and not out.exists()
    capsys.readouterr()
    # without attention DP the same release takes the layout
    assert (
        main(["check", ds, "self", "--method", "mtp", "--gpu", "h200", "--tp", "8", "--ep", "8"])
        == 0
    )


def test_release_layout_problem_reads_the_option_table() -> None:
    from spectool.parallel import ParallelLayout, release_layout_problem

    layout = ParallelLayout(tp=8, pp=2, ep=8, attention_dp=True, nodes=2, gpus_per_node=8)
    for release in RELEASES:
        assert release_layout_problem(layout, release, "pytorch") is None


@pytest.mark.parametrize(
    "engine", [["--engine", "torch"], ["--trtllm-backend", "tensorrt", "--trtllm-version", "1.2.1"]]
)
def test_layouts_are_built_for_the_pytorch_backend_only(make_ckpt, tmp_path, capsys, engine):
    argv = ["build", str(make_ckpt(DSV3)), "self", "--method", "mtp", "--gpu", "h200"]
    assert main([*argv, *DSV3_LAYOUT, *engine, "--out", str(tmp_path / "b")]) == 2
    assert "PyTorch backend" in capsys.readouterr().err and not (tmp_path / "b").exists()


def test_tune_predicts_a_layout_and_measures_none(make_ckpt, tmp_path, capsys) -> None:
    pair = [str(make_ckpt(LLAMA8B)), str(make_ckpt("yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"))]
    argv = ["tune", *pair, "--method", "eagle3", "--max-draft-len", "3", "--engine", "trtllm"]
    argv += ["--gpu", "h100-sxm", "--out", str(tmp_path / "t")]
    layout = ["--tp", "4", "--pp", "2", "--nodes", "2"]
    predicted = ["--predict-only", "--acceptance-length", "2.5", "--json"]
    assert main([*argv, *layout, *predicted]) == 0
    decision = json.loads(capsys.readouterr().out)
    assert decision["prediction"]["layout"]["pp_link"] == ["inter-node"]
    steps = [line for line in decision["prediction"]["lines"] if "step (predicted)" in line]
    assert len(steps) == len(decision["schedule"]) and decision["files"]
    assert main([*argv, *layout]) == 2  # a measured tune: --tp GPUs of one node
    assert "--pp/--ep/--attention-dp/--nodes" in capsys.readouterr().err
