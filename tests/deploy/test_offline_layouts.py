"""Issue 25: the two parallel deployments built offline from profiles with geometry.

``deepseek-v3-mtp`` (TP 8, EP 8, attention DP on one 8-GPU node) and ``llama-3.1-405b-eagle3``
(TP 8 x PP 2 on two 8-GPU nodes, the user's own EAGLE-3 head) with no checkpoint headers: check
gives the per-rank memory table from the profile's ``geometry`` (:mod:`spectool.memory_geometry`),
build writes both YAMLs (valid for each release's option table) and the Slurm script. The
geometry's table is held against the one the headers give for the same models.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml
from test_parallel_build import DSV3, DSV3_LAYOUT, L405_LAYOUT, VERSIONS, _llama_405b

from spectool.cli.app import main
from spectool.trtllm.releases import LOCAL_DRAFTER_RELEASES, RELEASES
from spectool.trtllm.validate import validate_options

DSV3_PROFILE = ["deepseek-v3-mtp", "--gpu", "h200", *DSV3_LAYOUT]
L405_PROFILE = ["llama-3.1-405b-eagle3", "--gpu", "h100-sxm", *L405_LAYOUT]


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))


def _check(capsys, *argv: str) -> dict:
    main(["check", *argv, "--json"])
    return json.loads(capsys.readouterr().out)


def test_offline_check_gives_the_per_rank_table_from_geometry(offline, capsys) -> None:
    ds = _check(capsys, *DSV3_PROFILE)
    assert ds["verdict"] == "unverified" and ds["target"] is None
    (row,) = ds["memory"]["per_rank"]
    assert row["ranks"] == "0-7" and row["experts_per_rank"] == 32
    assert row["drafter_placement"] == "every rank, replicated (attention DP)"
    assert row["kv_bytes_per_token"] == 61 * 576  # the FP8 latent, whole on every rank
    assert row["drafter_kv_bytes_per_token"] == 576  # the MTP layer's
    assert row["sequences_with_drafter"] > 0
    big = _check(capsys, *L405_PROFILE)
    assert big["verdict"] == "unverified"
    rows = big["memory"]["per_rank"]
    assert [(r["ranks"], r["nodes"], r["layers"]) for r in rows] == [
        ("0-7", "0", "0-62"),
        ("8-15", "1", "63-125"),
    ]
    # 63 layers of 126 at 8 KV heads x 128 x 2 (K, V) x 2 bytes, one KV head per rank
    assert rows[0]["kv_bytes_per_token"] == 63 * 2 * 128 * 2
    assert rows[0]["drafter_kv_bytes_per_token"] == 2 * 128 * 2  # the head's one layer
    assert all(r["drafter_placement"] == "every rank, TP-split" for r in rows)
    assert ds["trtllm"]["release"] == big["trtllm"]["release"] == "1.2"


def test_geometry_table_agrees_with_the_headers(offline, make_ckpt, tmp_path, capsys) -> None:
    """The same layouts from checkpoint headers (the DeepSeek-V3 fixture's tensor table; the
    405B-shaped checkpoint) and from the profiles' geometry."""
    target = str(_llama_405b(tmp_path))
    headers = _check(capsys, target, "--method", "ngram", "--gpu", "h100-sxm", *L405_LAYOUT)
    geometry = _check(capsys, *L405_PROFILE)
    for read, derived in zip(
        headers["memory"]["per_rank"], geometry["memory"]["per_rank"], strict=True
    ):
        target_bytes = derived["weight_bytes"] - derived["drafter_bytes"]
        assert target_bytes == pytest.approx(read["weight_bytes"], rel=1e-4)  # norms only
        assert derived["kv_bytes_per_token"] == read["kv_bytes_per_token"]
    ds_headers = _check(capsys, str(make_ckpt(DSV3)), "self", "--gpu", "h200", *DSV3_LAYOUT)
    ds_geometry = _check(capsys, *DSV3_PROFILE)
    (read,) = ds_headers["memory"]["per_rank"]
    (derived,) = ds_geometry["memory"]["per_rank"]
    # FP8 geometry against the FP8 checkpoint, whose BF16 embedding / LM head and block scales
    # the geometry leaves out (2.6 % of a rank's bytes)
    assert derived["weight_bytes"] == pytest.approx(read["weight_bytes"], rel=0.03)
    assert derived["expert_bytes"] == pytest.approx(read["expert_bytes"], rel=0.01)


@pytest.mark.parametrize("release", RELEASES)
def test_offline_builds_for_every_release(offline, tmp_path, capsys, release) -> None:
    version = ["--trtllm-version", VERSIONS[release]]
    for argv, layout in ((DSV3_PROFILE, (8, 1, 8, True)), (L405_PROFILE, (8, 2, 1, False))):
        out = tmp_path / argv[0]
        code = main(["build", *argv, *version, "--out", str(out)])
        if argv is L405_PROFILE and release in LOCAL_DRAFTER_RELEASES:
            assert code == 2  # these releases read the drafter from a local folder only
            assert "needs a local draft model folder" in capsys.readouterr().err
            continue
        assert code == 0, capsys.readouterr()
        capsys.readouterr()
        for name in ("speculative.yaml", "baseline.yaml"):
            options = yaml.safe_load((out / name).read_text())
            keys = ("tensor_parallel_size", "pipeline_parallel_size", "moe_expert_parallel_size")
            assert (*(options[k] for k in keys), options["enable_attention_dp"]) == layout
            validate_options(options, release, "pytorch", use_installed=False)
        manifest = json.loads((out / "manifest.json").read_text())
        assert manifest["target"]["kind"] == "unread" and manifest["target"]["path"] is None
        assert any("built offline from profile" in n for n in manifest["notes"])
        assert manifest["parallel"]["per_rank"][0]["sequences_with_drafter"] > 0
        rebuild = manifest["commands"]["build"]
        assert rebuild[rebuild.index("--profile") + 1] == argv[0]
        script = (out / "launch.slurm").read_text()
        nodes = manifest["parallel"]["nodes"]
        assert f"#SBATCH --nodes={nodes}" in script and "srun --mpi=pmix" in script
        assert "trtllm-llmapi-launch trtllm-serve" in " ".join(script.replace("\\\n", " ").split())


def test_a_multi_node_build_writes_a_leader_worker_set(offline, tmp_path, capsys) -> None:
    """``lws.yaml`` beside the YAML for --nodes 2; its leader command, run by sh with the LWS
    variables of a 2-pod group and an ``mpirun`` stand-in, starts 16 ranks over both pods."""
    out = tmp_path / "b"
    assert main(["build", *L405_PROFILE, "--out", str(out)]) == 0
    assert "kubectl apply -f" in " ".join(capsys.readouterr().out.split())
    text = (out / "lws.yaml").read_text()
    lws = yaml.safe_load(text)
    assert (lws["apiVersion"], lws["kind"]) == ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet")
    group = lws["spec"]["leaderWorkerTemplate"]
    assert group["size"] == 2 and group["restartPolicy"] == "RecreateGroupOnPodRestart"
    (leader,) = group["leaderTemplate"]["spec"]["containers"]
    (worker,) = group["workerTemplate"]["spec"]["containers"]
    for pod in (leader, worker):
        assert pod["resources"]["limits"]["nvidia.com/gpu"] == "8"
    assert leader["readinessProbe"]["httpGet"] == {"path": "/health", "port": 8000}
    assert "&id" not in text  # plain YAML, no anchors
    manifest = json.loads((out / "manifest.json").read_text())
    assert "lws.yaml" in manifest["parallel"]["launch_files"]
    stub = tmp_path / "bin"
    stub.mkdir()
    (stub / "mpirun").write_text('#!/bin/sh\nprintf "%s\\n" "$@"\n')
    (stub / "mpirun").chmod(0o755)
    env = {
        "PATH": f"{stub}:/usr/bin:/bin",
        "LWS_LEADER_ADDRESS": "spectool-serve-0.spectool-serve.default",
        "LWS_GROUP_SIZE": "2",
        "POD_IP": "10.1.2.3",
    }
    ran = subprocess.run(leader["command"], env=env, capture_output=True, text=True, check=True)
    args = ran.stdout.split("\n")
    assert args[args.index("-np") + 1] == "16"
    assert args[args.index("--host") + 1] == (
        "spectool-serve-0.spectool-serve.default:8,spectool-serve-0-1.spectool-serve.default:8"
    )
    serve = args[args.index("trtllm-llmapi-launch") + 1 :]
    assert serve[0] == "trtllm-serve" and serve[serve.index("--host") + 1] == "10.1.2.3"
    assert leader["env"] == [
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}
    ]  # the pod's own address, not every interface
    assert serve[serve.index("--pp_size") + 1] == "2"
    assert not (tmp_path / "single" / "lws.yaml").exists()
    assert main(["build", *DSV3_PROFILE, "--out", str(tmp_path / "single")]) == 0
    assert not (tmp_path / "single" / "lws.yaml").exists()  # one node: no group to schedule


def test_offline_check_predicts_each_layouts_step_cost(offline, capsys, tmp_path) -> None:
    ds = _check(capsys, *DSV3_PROFILE, "--acceptance-length", "2.5")["will_it_pay"]
    assert ds["layout"]["attention_dp"] and ds["layout"]["tp_link"] == "NVLink"
    rows = {r["concurrency"]: r for r in ds["concurrency"]}
    assert rows[1]["base_step_ms"] == rows[8]["base_step_ms"]  # a (dummy) request per rank
    assert rows[64]["base_step_ms"] > rows[8]["base_step_ms"]
    assert all(r["best_k"] and r["ks"][r["best_k"] - 1]["speedup"] > 1 for r in rows.values())
    big = _check(capsys, *L405_PROFILE)["will_it_pay"]
    assert big["layout"]["pp"] == 2 and big["layout"]["pp_link"] == ["inter-node"]
    main(["check", *L405_PROFILE])
    out = " ".join(capsys.readouterr().out.split())  # the console wraps long lines
    assert "TP 8 x PP 2, EP 1 on 2 x 8 GPUs; TP over NVLink, stage sends over inter-node" in out
    step = f"c=1 step (predicted): plain {big['concurrency'][0]['base_step_ms']:.2f} ms"
    assert step in out
    argv = ["tune", *L405_PROFILE, "--engine", "trtllm", "--predict-only"]
    assert main([*argv, "--acceptance-length", "2.4", "--out", str(tmp_path / "t")]) == 2
    assert "tune needs the checkpoints' headers" in capsys.readouterr().err


def test_a_separate_drafter_with_pipeline_parallelism_is_an_error(offline, capsys) -> None:
    """TensorRT-LLM's pipeline-parallel executor loop refuses a separate drafter (every release):
    check says so for a draft model and for n-gram at PP 2; EAGLE-3 (one model) at PP 2 has no
    such finding."""
    for argv in (
        ["spectool:demo-target", "spectool:demo-drafter", "--engine", "trtllm"],
        ["qwen3-8b-ngram", "--tp", "2"],
    ):
        report = _check(capsys, *argv, "--gpu", "h100-sxm", "--pp", "2")
        codes = {f["code"] for f in report["findings"] if f["severity"] == "error"}
        assert "DRAFTER_WITH_PIPELINE_PARALLEL" in codes
    plain = _check(capsys, "qwen3-8b-ngram", "--tp", "2", "--gpu", "h100-sxm")
    assert "DRAFTER_WITH_PIPELINE_PARALLEL" not in {f["code"] for f in plain["findings"]}
    eagle = _check(capsys, *L405_PROFILE)
    assert "DRAFTER_WITH_PIPELINE_PARALLEL" not in {f["code"] for f in eagle["findings"]}
