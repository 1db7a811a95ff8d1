"""A Kubernetes LeaderWorkerSet for a multi-node TensorRT-LLM build: ``lws.yaml``.

LeaderWorkerSet (``kubernetes-sigs/lws``, API ``leaderworkerset.x-k8s.io/v1``) runs a group of
pods, one leader and ``size - 1`` workers, scheduled and restarted together; the controller gives
every container ``LWS_LEADER_ADDRESS``, ``LWS_GROUP_SIZE`` and ``LWS_WORKER_INDEX``
(``api/leaderworkerset/v1`` constants) and a headless service named like the set, so worker ``i``
of group ``g`` is ``NAME-g-i.NAME.NAMESPACE`` beside the leader ``NAME-g.NAME.NAMESPACE``.

The layout follows LWS's own TensorRT-LLM example (``docs/examples/tensorrt-llm/lws.yaml`` @
0e2e095a2ff5, with ``build/server.py`` @ 4aaf9d50f542): one pod per node, ``size`` = nodes, each
pod limited to the node's GPUs (``nvidia.com/gpu``), a memory-backed ``/dev/shm``; the leader
runs ``mpirun --allow-run-as-root -np WORLD --host h1:G,h2:G,...`` over the group's pods and rank
0 serves HTTP, the workers wait. The example's ranks run ``tritonserver``; here they run the
build's ``trtllm-llmapi-launch trtllm-serve`` command, as ``launch-mpirun.sh`` does. How mpirun
reaches the workers is the cluster's: the example uses a ``kubectl exec`` agent
(``-mca plm_rsh_agent kubessh`` with a service account allowed to exec), ssh with shared keys is
the other usual way; the worker command and the image (one with TensorRT-LLM) are left to the
user, marked ``<...>``. Inside a pod the server must listen on the pod's address for the Service
and the readiness probe to reach it, so the leader gets its address from the downward API
(``POD_IP`` from ``status.podIP``) and binds ``--host $POD_IP``: that address only, not every
interface (the build's own command keeps its host).
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence

import yaml

from spectool.parallel import ParallelLayout

LWS_NAME = "lws.yaml"
SET_NAME = "spectool-serve"
IMAGE = "<TensorRT-LLM image>"


POD_IP = "POD_IP"  # the leader's own address, from the downward API (module docstring)


def _pod_serve(argv: Sequence[str]) -> str:
    """``argv`` quoted for sh, its ``--host`` the pod's address (``"$POD_IP"``, expanded by sh)."""
    out = list(argv)
    if "--host" in out:
        del out[out.index("--host") : out.index("--host") + 2]
    return " ".join(shlex.quote(a) for a in out) + f' --host "${POD_IP}"'


def leader_command(argv: Sequence[str], layout: ParallelLayout) -> str:
    """The leader's shell command: the group's host list from the LWS variables, then mpirun."""
    g = layout.gpus_per_node
    serve = _pod_serve(argv)
    return (
        'lead="${LWS_LEADER_ADDRESS%%.*}"; domain="${LWS_LEADER_ADDRESS#*.}"; '
        f'hosts="$LWS_LEADER_ADDRESS:{g}"; '
        "for i in $(seq 1 $((LWS_GROUP_SIZE - 1))); do "
        f'hosts="$hosts,$lead-$i.$domain:{g}"; done; '
        f'exec mpirun --allow-run-as-root -np {layout.world_size} --host "$hosts" '
        f"trtllm-llmapi-launch {serve}"
    )


def _volumes() -> list[dict]:
    return [{"name": "dshm", "emptyDir": {"medium": "Memory"}}]


def _container(name: str, command: str, layout: ParallelLayout, port: int | None) -> dict:
    container: dict = {
        "name": name,
        "image": IMAGE,
        "command": ["sh", "-c", command],
        "resources": {"limits": {"nvidia.com/gpu": str(layout.gpus_per_node)}},
        "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}],  # noqa: S108 (in the pod)
    }
    if port is not None:  # the leader: rank 0 serves HTTP on the pod's address
        container["env"] = [
            {"name": POD_IP, "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}
        ]
        container["ports"] = [{"containerPort": port}]
        container["readinessProbe"] = {
            "httpGet": {"path": "/health", "port": port},
            "periodSeconds": 10,
        }
    return container


def lws_manifest(argv: Sequence[str], layout: ParallelLayout, *, title: str) -> str:
    """The ``lws.yaml`` text (a comment header, then the LeaderWorkerSet) for ``argv``."""
    port = int(argv[argv.index("--port") + 1]) if "--port" in argv else 8000
    worker = "<wait for mpirun: e.g. exec /usr/sbin/sshd -D, or sleep infinity with kubessh>"
    body = {
        "apiVersion": "leaderworkerset.x-k8s.io/v1",
        "kind": "LeaderWorkerSet",
        "metadata": {"name": SET_NAME},
        "spec": {
            "replicas": 1,
            "leaderWorkerTemplate": {
                "size": layout.nodes,
                "restartPolicy": "RecreateGroupOnPodRestart",
                "leaderTemplate": {
                    "metadata": {"labels": {"role": "leader"}},
                    "spec": {
                        "containers": [
                            _container("leader", leader_command(argv, layout), layout, port)
                        ],
                        "volumes": _volumes(),
                    },
                },
                "workerTemplate": {
                    "spec": {
                        "containers": [_container("worker", worker, layout, None)],
                        "volumes": _volumes(),
                    }
                },
            },
        },
    }
    head = f"""# spectool: {title}
# TP {layout.tp} x PP {layout.pp} = {layout.world_size} ranks: a LeaderWorkerSet group of {layout.nodes} pods (one per node), {layout.gpus_per_node} GPUs each.
# After kubernetes-sigs/lws docs/examples/tensorrt-llm/lws.yaml; apply with: kubectl apply -f {LWS_NAME}
# Yours to fill in: the image (TensorRT-LLM), how mpirun reaches the workers (the worker
# command: sshd with shared keys, or LWS's example's kubectl-exec agent, -mca plm_rsh_agent
# kubessh, with a service account allowed to exec), volumes every pod mounts at the paths below
# (the model, and this build folder for --config), and a Service for port {port} (the leader's
# readiness probe is GET /health).
"""
    return head + yaml.safe_dump(body, sort_keys=False)
