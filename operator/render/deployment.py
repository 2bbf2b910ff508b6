"""The Deployment of runtime pods: `pagoda serve` with the spec's model and compute.

The pod is shaped for rollouts that drop no request: the readiness probe gates
traffic on /health, a preStop pause lets endpoints and load balancers forget the
pod before it is told to stop, then SIGTERM starts the runtime's drain (finish
in-flight requests up to drain.timeoutSeconds), all inside the grace period.
Every pod has CPU and memory requests (a GPU pod must never be BestEffort, the
first evicted under node pressure), spreads across nodes when it can, and a
GPU pod rolls out without a surge, since no spare GPU is assumed.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
from typing import Any

from pagoda.operator.config import OperatorConfig
from pagoda.operator.llmservice import LLMService, desired_replicas, rollout_strategy
from pagoda.operator.model import ADMIN_KEY_ENV, API_KEY_ENV, HF_HOME_ENV, LoRASpec
from pagoda.operator.render.configmap import config_hash, engine_env
from pagoda.operator.render.labels import (
    ADMIN_PORT,
    ADMIN_PORT_NAME,
    RUNTIME_PORT,
    adapters_configmap_name,
    admin_secret_name,
    configmap_name,
    deployment_name,
    labels,
    metadata,
    selector_labels,
)
from pagoda.operator.render.model_download import (
    download_container,
    downloads_model,
    hf_cache_mount,
    hf_cache_volume,
    hf_repo,
    revision_arguments,
    uses_hf_cache,
)
from pagoda.operator.render.paths import (
    ADAPTER_CLAIMS_MOUNT,
    ADAPTERS_FILE_KEY,
    ADAPTERS_FILE_MOUNT,
    HF_CACHE_MOUNT,
    MODEL_MOUNT,
    adapter_claims,
    adapter_path,
    model_claim,
)
from pagoda.operator.render.secret import ADMIN_KEY_FIELD

CONFIG_HASH_ANNOTATION = "pagoda.dev/engine-config-hash"
# A digest of the pod template: pods carrying the current one run the current spec.
TEMPLATE_HASH_ANNOTATION = "pagoda.dev/template-hash"
RUNTIME_UID = 1000
# Time between the runtime's drain deadline and SIGKILL: exiting takes a moment.
EXIT_MARGIN_SECONDS = 10
PROBE_PERIOD_SECONDS = 10


def model_argument(llms: LLMService) -> str:
    """The positional MODEL of `pagoda serve`, as the pod sees it."""
    model = llms.spec.model
    if downloads_model(llms):
        return hf_repo(llms)[0]  # resolved in HF_HOME, offline (--revision picks the revision)
    if model.startswith("pvc://"):
        return adapter_path(llms, model)  # the same rule: the claim is mounted at MODEL_MOUNT
    return model


def _claim_volume(name: str, claim: str) -> dict[str, Any]:
    return {"name": name, "persistentVolumeClaim": {"claimName": claim, "readOnly": True}}


def _adapter_volume_name(claim: str) -> str:
    # A volume name is a DNS label; a claim name may be a 253-character subdomain.
    return "lora-" + hashlib.sha256(claim.encode()).hexdigest()[:12]


def _model_volumes(llms: LLMService) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Volumes and mounts that bring the model's weights (and adapters) into the pod.

    The volumes depend on which claims hold adapters, not on the adapter
    list: adding an adapter on a claim already mounted changes no pod.
    """
    volumes, mounts = [], []
    claim = model_claim(llms)
    if claim is not None:
        volumes.append(_claim_volume("model", claim))
        mounts.append({"name": "model", "mountPath": MODEL_MOUNT, "readOnly": True})
    cache = hf_cache_volume(llms)
    if cache is not None:
        volumes.append(cache)
        mounts.append(hf_cache_mount(read_only=True))
    for claim in adapter_claims(llms):
        name = _adapter_volume_name(claim)
        volumes.append(_claim_volume(name, claim))
        mounts.append(
            {"name": name, "mountPath": f"{ADAPTER_CLAIMS_MOUNT}/{claim}", "readOnly": True}
        )
    if llms.spec.lora_enabled:
        volumes.append({"name": "adapters", "configMap": {"name": adapters_configmap_name(llms)}})
        mounts.append({"name": "adapters", "mountPath": ADAPTERS_FILE_MOUNT, "readOnly": True})
    return volumes, mounts


def lora_arguments(llms: LLMService) -> list[str]:
    """`pagoda serve` flags for LoRA: capacity, and the adapters file to converge on."""
    spec = llms.spec
    if not spec.lora_enabled:
        return []
    lora = spec.lora or LoRASpec()
    args = [
        "--enable-lora",
        "--max-loras",
        str(lora.max_loras),
        "--max-lora-rank",
        str(lora.max_lora_rank),
        "--lora-adapters-file",
        f"{ADAPTERS_FILE_MOUNT}/{ADAPTERS_FILE_KEY}",
    ]
    # Not derived from the adapter count: that would restart pods on a list change.
    if lora.max_cpu_loras is not None:
        args += ["--max-cpu-loras", str(max(lora.max_cpu_loras, lora.max_loras))]
    return args


def admin_key_env(llms: LLMService) -> dict[str, Any]:
    """PAGODA_ADMIN_KEY from the admin Secret: the key of the pod's admin port."""
    return {
        "name": ADMIN_KEY_ENV,
        "valueFrom": {"secretKeyRef": {"name": admin_secret_name(llms), "key": ADMIN_KEY_FIELD}},
    }


def _env(llms: LLMService) -> list[dict[str, Any]]:
    """The container's env: the operator's variables merged with `spec.env` by name.

    The container's env is a list keyed by name: server-side apply refuses
    the whole Deployment if a name appears twice. The user's value wins; the
    names that would contradict another field or lock the operator out
    (PAGODA_API_KEY, PAGODA_ADMIN_KEY, HF_HOME) are refused in the spec
    instead (model.py).
    """
    env: dict[str, dict[str, Any]] = {}
    if llms.spec.api_key_secret_ref:
        ref = llms.spec.api_key_secret_ref
        env[API_KEY_ENV] = {
            "name": API_KEY_ENV,
            "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}},
        }
    env[ADMIN_KEY_ENV] = admin_key_env(llms)
    if uses_hf_cache(llms):
        # Read the mounted cache only: a pod must never download weights on start.
        env[HF_HOME_ENV] = {"name": HF_HOME_ENV, "value": HF_CACHE_MOUNT}
        env["HF_HUB_OFFLINE"] = {"name": "HF_HUB_OFFLINE", "value": "1"}
    threads = engine_threads(llms)
    if threads is not None:
        env["PAGODA_NUM_THREADS"] = {"name": "PAGODA_NUM_THREADS", "value": str(threads)}
    for var in llms.spec.env:
        env[var.name] = var.model_dump(by_alias=True, exclude_none=True)
    return list(env.values())


def cpu_cores(quantity: str) -> float:
    """A CPU quantity in cores: "8" -> 8, "500m" -> 0.5, "2.5" -> 2.5."""
    return int(quantity[:-1]) / 1000 if quantity.endswith("m") else float(quantity)


def engine_threads(llms: LLMService) -> int | None:
    """torch threads of a CPU pod's engine core: its CPU request, in whole cores.

    Inside a pod the runtime sees every core of the node (no CPU limit, no
    static CPU manager), so its own default (every core) would start 64
    threads on a 64-core node for a pod that asked for 8, and OpenMP threads
    without a core stall every step. On cores of its own, the engine is
    fastest with one thread per core (docs/benchmarks.md). GPU
    pods and tensor-parallel CPU pods (which divide the cores among their
    ranks) are left to the runtime.
    """
    if llms.resources.gpus or llms.spec.tensor_parallel_size > 1:
        return None
    cpu = llms.resources.cpu or default_requests(0)[0]
    return max(1, int(cpu_cores(cpu)))


def default_requests(gpus: int, ranks: int = 1) -> tuple[str, str]:
    """(cpu, memory) requested when the spec names neither.

    Without requests a pod is BestEffort: scheduled anywhere and evicted first.
    Extended resources (GPUs) do not count towards the QoS class, so a GPU pod
    needs these too. A GPU pod's host side (tokenizer, scheduler, pinned
    buffers) grows with its GPUs. A CPU pod's tensor-parallel ranks are
    processes computing side by side: one core and one torch process each.
    """
    if gpus:
        return str(4 * gpus), f"{16 * gpus}Gi"
    return str(ranks), f"{2 * ranks}Gi"


def _resources(llms: LLMService, config: OperatorConfig) -> dict[str, Any]:
    res = llms.resources
    default_cpu, default_memory = default_requests(res.gpus, llms.spec.tensor_parallel_size)
    limits: dict[str, Any] = {}
    # No CPU limit: throttling the tokenizer and scheduler stalls the GPU.
    requests: dict[str, Any] = {"cpu": res.cpu or default_cpu}
    if res.memory:
        # Memory request == limit: an LLM pod that is OOM-killed under node
        # pressure loses minutes of model loading, so reserve what it may use.
        requests["memory"] = limits["memory"] = res.memory
    else:
        # A default request only: without a size from the user, a limit would
        # be a guess that OOM-kills a model that happens to be larger.
        requests["memory"] = default_memory
    if res.gpus:
        # Extended resources must have request == limit.
        requests[config.gpu_resource] = limits[config.gpu_resource] = res.gpus
    out: dict[str, Any] = {"requests": requests}
    if limits:
        out["limits"] = limits
    return out


def _probe(path: str, period: int, failures: int) -> dict[str, Any]:
    return {
        "httpGet": {"path": path, "port": "http"},
        "periodSeconds": period,
        "timeoutSeconds": 5,
        "failureThreshold": failures,
    }


def shares_tensors(llms: LLMService) -> bool:
    """Whether several processes of a pod exchange tensors through /dev/shm.

    With tensor parallelism each rank is a process: NCCL (GPU) moves tensors
    between ranks through shared memory, and the engine core broadcasts each
    step to the ranks through a shared-memory ring, on the CPU too. The
    container runtime's default 64Mi /dev/shm makes NCCL fail at the first
    all-reduce. One rank (the API server and its EngineCore exchange only
    small messages over a socket) needs none.
    """
    return llms.spec.tensor_parallel_size > 1


def pre_stop(seconds: int, config: OperatorConfig) -> dict[str, Any] | None:
    """The pause before SIGTERM: the native sleep action where the cluster has it.

    `lifecycle.preStop.sleep` (Kubernetes 1.30+) needs no shell and no `sleep`
    binary in the image; older clusters get `exec: sleep N`.
    """
    if not seconds:
        return None
    if config.sleep_action:
        return {"sleep": {"seconds": seconds}}
    return {"exec": {"command": ["sleep", str(seconds)]}}


def _container(llms: LLMService, config: OperatorConfig) -> dict[str, Any]:
    spec = llms.spec
    volumes_mounts = _model_volumes(llms)[1]
    if shares_tensors(llms):
        volumes_mounts.append({"name": "dshm", "mountPath": "/dev/shm"})
    container: dict[str, Any] = {
        "name": "runtime",
        "image": spec.image or config.runtime_image,
        "command": ["pagoda", "serve"],
        "args": [
            model_argument(llms),
            *revision_arguments(llms),
            "--host",
            "0.0.0.0",
            "--port",
            str(RUNTIME_PORT),
            # The adapter routes, for the operator only: the Service leaves it out.
            "--admin-port",
            str(ADMIN_PORT),
            "--served-model-name",
            llms.served_model_name,
            "--tensor-parallel-size",
            str(spec.tensor_parallel_size),
            "--drain-timeout",
            str(spec.drain.timeout_seconds),
            *lora_arguments(llms),
            *spec.engine.extra_args,
        ],
        "ports": [
            {"name": "http", "containerPort": RUNTIME_PORT, "protocol": "TCP"},
            {"name": ADMIN_PORT_NAME, "containerPort": ADMIN_PORT, "protocol": "TCP"},
        ],
        # A runtime that refuses to start says why on its last log line; this
        # puts it in the pod's status, and from there in Degraded's message.
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "envFrom": [{"configMapRef": {"name": configmap_name(llms)}}],
        "resources": _resources(llms, config),
        # Loading a large model takes minutes; the startup probe holds the other
        # two off until /health first answers, within startupTimeoutSeconds.
        "startupProbe": _probe(
            "/health",
            PROBE_PERIOD_SECONDS,
            math.ceil(spec.startup_timeout_seconds / PROBE_PERIOD_SECONDS),
        ),
        "readinessProbe": _probe("/health", 5, 3),
        # Generous: a saturated engine answers slowly, and restarting it costs
        # a full model load.
        "livenessProbe": _probe("/health", PROBE_PERIOD_SECONDS, 6),
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "runAsNonRoot": True,
        },
    }
    if spec.image_pull_policy:
        container["imagePullPolicy"] = spec.image_pull_policy
    env = _env(llms)
    if env:
        container["env"] = env
    stop = pre_stop(spec.drain.pre_stop_seconds, config)
    if stop:
        container["lifecycle"] = {"preStop": stop}
    if volumes_mounts:
        container["volumeMounts"] = volumes_mounts
    return container


def _tolerations(llms: LLMService, config: OperatorConfig) -> list[dict[str, Any]]:
    tolerations = [
        t.model_dump(by_alias=True, exclude_none=True) for t in llms.spec.scheduling.tolerations
    ]
    if llms.resources.gpus and not any(t.get("key") == config.gpu_resource for t in tolerations):
        # GPU node pools are commonly tainted with the GPU resource name.
        tolerations.append(
            {"key": config.gpu_resource, "operator": "Exists", "effect": "NoSchedule"}
        )
    return tolerations


def _pod_spec(llms: LLMService, config: OperatorConfig) -> dict[str, Any]:
    spec, sched = llms.spec, llms.spec.scheduling
    volumes = _model_volumes(llms)[0]
    if shares_tensors(llms):
        volumes.append(
            {
                "name": "dshm",
                "emptyDir": {"medium": "Memory", "sizeLimit": llms.resources.shared_memory},
            }
        )
    runtime = _container(llms, config)
    pod: dict[str, Any] = {
        "containers": [runtime],
        "terminationGracePeriodSeconds": spec.drain.pre_stop_seconds
        + spec.drain.timeout_seconds
        + EXIT_MARGIN_SECONDS,
        # Service links would inject NAME_PORT-style variables; a Service called
        # "pagoda" would then set PAGODA_PORT, which the runtime reads as --port.
        "enableServiceLinks": False,
        # The runtime never talks to the Kubernetes API.
        "automountServiceAccountToken": False,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": RUNTIME_UID,
            "runAsGroup": RUNTIME_UID,
            "fsGroup": RUNTIME_UID,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
    }
    node_selector = dict(sched.node_selector)
    if llms.resources.gpu_type:
        node_selector[config.gpu_type_label] = llms.resources.gpu_type
    if node_selector:
        pod["nodeSelector"] = node_selector
    tolerations = _tolerations(llms, config)
    if tolerations:
        pod["tolerations"] = tolerations
    if sched.affinity:
        pod["affinity"] = sched.affinity
    spread = topology_spread(llms)
    if spread:
        pod["topologySpreadConstraints"] = spread
    if sched.priority_class_name:
        pod["priorityClassName"] = sched.priority_class_name
    if sched.runtime_class_name:
        pod["runtimeClassName"] = sched.runtime_class_name
    if spec.service_account_name:
        pod["serviceAccountName"] = spec.service_account_name
    if spec.image_pull_secrets:
        pod["imagePullSecrets"] = [{"name": name} for name in spec.image_pull_secrets]
    if volumes:
        pod["volumes"] = volumes
    if downloads_model(llms):
        pod["initContainers"] = [download_container(llms, runtime)]
    return pod


def topology_spread(llms: LLMService) -> list[dict[str, Any]]:
    """The spec's constraints, or: spread the replicas across nodes when possible.

    ScheduleAnyway, so a cluster with one big GPU node still schedules them;
    matchLabelKeys counts only the pods of the current revision, so a rollout
    is not skewed by the pods it replaces.
    """
    asked = llms.spec.scheduling.topology_spread_constraints
    if asked is not None:
        return [dict(c) for c in asked]
    return [
        {
            "maxSkew": 1,
            "topologyKey": "kubernetes.io/hostname",
            "whenUnsatisfiable": "ScheduleAnyway",
            "labelSelector": {"matchLabels": selector_labels(llms)},
            "matchLabelKeys": ["pod-template-hash"],
        }
    ]


def template_hash(template: dict[str, Any]) -> str:
    """A digest of a pod template, ignoring the annotation that carries it."""
    clean = copy.deepcopy(template)
    clean.get("metadata", {}).get("annotations", {}).pop(TEMPLATE_HASH_ANNOTATION, None)
    return hashlib.sha256(json.dumps(clean, sort_keys=True).encode()).hexdigest()[:16]


def pod_annotations(llms: LLMService) -> dict[str, str]:
    """Annotations of the pod template: scrape hints, the user's, the config hash."""
    return {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": str(RUNTIME_PORT),
        "prometheus.io/path": "/metrics",
        **llms.spec.pod_annotations,
        CONFIG_HASH_ANNOTATION: config_hash(engine_env(llms)),
    }


def render_deployment(llms: LLMService, config: OperatorConfig) -> dict[str, Any]:
    """The Deployment `NAME` of runtime pods."""
    spec = llms.spec
    surge, unavailable = rollout_strategy(llms)
    template = {
        "metadata": {"labels": labels(llms), "annotations": pod_annotations(llms)},
        "spec": _pod_spec(llms, config),
    }
    template["metadata"]["annotations"][TEMPLATE_HASH_ANNOTATION] = template_hash(template)
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata(llms, deployment_name(llms)),
        "spec": {
            "replicas": desired_replicas(llms),
            "selector": {"matchLabels": selector_labels(llms)},
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxSurge": surge, "maxUnavailable": unavailable},
            },
            # A rollout is "stuck" only after the pods had their full startup budget.
            "progressDeadlineSeconds": spec.startup_timeout_seconds + 300,
            "revisionHistoryLimit": 5,
            "template": template,
        },
    }
