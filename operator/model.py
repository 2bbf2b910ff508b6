"""The typed model of an `LLMService`: the one source of truth for its schema.

Every field of the custom resource is declared here once, with its type, range,
default and description. `pagoda.operator.crd` turns these models into the
CRD's structural OpenAPI schema, and the operator validates every object with
the same models before any logic runs. Cross-field rules are written twice,
side by side: as CEL (enforced by a real API server at admission) and as a
pydantic validator (enforced by the operator, for objects that predate a rule
or API servers that do not run CEL). `tests/operator/test_model.py` evaluates
both on the same cases so the two cannot drift apart.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import AliasGenerator, BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.alias_generators import to_camel

GROUP = "pagoda.dev"
VERSION = "v1alpha1"
KIND = "LLMService"
PLURAL = "llmservices"
SINGULAR = "llmservice"
SHORT_NAMES = ("llms",)
API_VERSION = f"{GROUP}/{VERSION}"

BUILTIN_MODELS = ("smollm2-135m-instruct",)

# The most GPUs one pod may request, and so the largest tensor-parallel size
# (one GPU per rank; a 16-GPU node is the largest common one).
MAX_GPUS_PER_POD = 16

# A model source: hf://org/name[@revision] (downloaded into the model cache by
# the pods' init container), pvc://claim[/path], an absolute path inside the
# image, or a bare built-in name.
MODEL_PATTERN = (
    r"^(hf://[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*(@[A-Za-z0-9][A-Za-z0-9._/-]*)?"
    r"|pvc://[a-z0-9]([-a-z0-9]*[a-z0-9])?(/[^/].*)?"
    r"|/.+"
    r"|[A-Za-z0-9][A-Za-z0-9._-]*)$"
)
# Kubernetes resource.Quantity, as the API server parses it.
# Written with character classes, not backslashes, so the same text is a valid
# pattern both in Python and inside a CEL string literal.
QUANTITY_PATTERN = (
    r"^([+-])?(([0-9]+([.][0-9]*)?)|([.][0-9]+))"
    r"(([KMGTPE]i)|[numkMGTPE]|([eE]([+-])?(([0-9]+([.][0-9]*)?)|([.][0-9]+))))?$"
)
PERCENT_PATTERN = r"^[0-9]+%$"
# Bounds on the string forms: the API server estimates a CEL rule's cost from
# the longest string it may see, and an unbounded one is sized to the whole
# request (3 MiB), which puts a `matches` near the per-rule limit.
QUANTITY_MAX = 64
PERCENT_MAX = 8
# Service names become DNS labels (RFC 1035); the children carry the name as a
# label value too, so both limits apply to the LLMService's own name.
NAME_PATTERN = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
NAME_MAX = 63
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
ENV_NAME_PATTERN = r"^[-._a-zA-Z][-._a-zA-Z0-9]*$"
# The operator owns these runtime flags: it sets them from typed fields, so
# repeating them in extraArgs would silently fight the spec.
OWNED_FLAGS = (
    "host",
    "port",
    "served-model-name",
    "api-key",
    "api-key-file",
    "tensor-parallel-size",
    "drain-timeout",
    "enable-lora",
    "max-loras",
    "max-lora-rank",
    "max-cpu-loras",
    "lora-adapters-file",
    "admin-port",
    "admin-key",
    "revision",
)
OWNED_FLAGS_PATTERN = r"^--(" + "|".join(OWNED_FLAGS) + r")(=.*)?$"

GPUS_MESSAGE = (
    "resources.gpus must equal tensorParallelSize: each tensor-parallel rank drives one GPU "
    "and any more would sit idle (set resources.allowUnusedGpus to request them anyway); "
    "0 or unset runs the ranks on the CPU"
)

IntOrPercent = Annotated[
    int | str,
    Field(json_schema_extra={"x-pagoda-int-or-string": True}),
]
Quantity = Annotated[
    int | str,
    Field(json_schema_extra={"x-pagoda-quantity": True}),
]


class RuleError(ValueError):
    """A cross-field rule failed; `field_path` is relative to the model, as in CEL's fieldPath."""

    def __init__(self, field_path: str, message: str) -> None:
        super().__init__(message)
        self.field_path = field_path


def cel(rule: str, message: str, field_path: str | None = None) -> dict[str, str]:
    """One `x-kubernetes-validations` entry; fieldPath points kubectl at the culprit."""
    entry = {"rule": rule, "message": message}
    if field_path:
        entry["fieldPath"] = field_path
    return entry


class Model(BaseModel):
    """Base of every spec model: camelCase on the wire, unknown fields ignored.

    Ignored, not rejected: a newer CRD may add a field before this operator is
    upgraded, and an older operator must keep serving every object (the API
    server stores the field; the operator logs it, see `unknown_fields`) rather
    than mark them all InvalidSpec.
    """

    model_config = ConfigDict(
        alias_generator=AliasGenerator(validation_alias=to_camel, serialization_alias=to_camel),
        populate_by_name=True,
        extra="ignore",
        frozen=True,
    )


def _quantity(value: int | str | None) -> str | None:
    if value is None:
        return None
    if isinstance(value, int) and value < 0:
        raise ValueError("must not be negative")
    text = str(value)
    if len(text) > QUANTITY_MAX or not re.match(QUANTITY_PATTERN, text):
        raise ValueError(f"{text!r} is not a Kubernetes quantity (e.g. 8, 500m, 16Gi)")
    return text


def _int_or_percent(value: int | str) -> int | str:
    if isinstance(value, int):
        if value < 0:
            raise ValueError("must not be negative")
        return value
    if len(value) > PERCENT_MAX or not re.match(PERCENT_PATTERN, value):
        raise ValueError(f"{value!r} is neither a count nor a percentage like '25%'")
    return value


class ResourcesSpec(Model):
    """Compute for one runtime pod: explicit values, or a named profile with overrides."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "!has(self.gpuType) || has(self.profile) || (has(self.gpus) && self.gpus > 0)",
                    "gpuType needs gpus > 0",
                    ".gpuType",
                ),
            ]
        }
    )

    profile: str | None = Field(
        None,
        min_length=1,
        max_length=63,
        description="A named profile from the operator's configuration (the chart's "
        "`profiles` value). Explicit fields below override the profile's.",
    )
    gpus: int | None = Field(
        None,
        ge=0,
        le=MAX_GPUS_PER_POD,
        description="GPUs per pod (`nvidia.com/gpu`). 0 or unset: CPU only. Must equal "
        "tensorParallelSize unless allowUnusedGpus is set.",
    )
    allow_unused_gpus: bool | None = Field(
        None,
        description="Allow more GPUs than tensorParallelSize uses (the others sit idle, "
        "e.g. for a sidecar that needs one).",
    )
    gpu_type: str | None = Field(
        None,
        min_length=1,
        max_length=63,
        description="GPU product, matched against the node label the operator is configured "
        "with (default `nvidia.com/gpu.product`), e.g. `NVIDIA-H100-80GB-HBM3`.",
    )
    cpu: Quantity | None = Field(None, description="CPU request per pod, e.g. `8`.")
    memory: Quantity | None = Field(
        None, description="Memory request and limit per pod, e.g. `64Gi`."
    )
    shared_memory: Quantity | None = Field(
        None,
        description="Size of the memory-backed /dev/shm that processes sharing tensors need "
        "(mounted when tensorParallelSize > 1). Default 8Gi; counts against `memory`.",
    )

    @field_validator("cpu", "memory", "shared_memory")
    @classmethod
    def _check_quantities(cls, value: int | str | None) -> str | None:
        return _quantity(value)

    @model_validator(mode="after")
    def _gpu_type_needs_gpus(self) -> ResourcesSpec:
        if self.gpu_type and not self.profile and not (self.gpus or 0) > 0:
            raise RuleError(".gpuType", "gpuType needs gpus > 0")
        return self


# The runtime's dtype names (pagoda.runtime.config.DTYPES), for weights and KV cache.
Dtype = Literal["auto", "float32", "bfloat16", "float16"]


class EngineSpec(Model):
    """Engine arguments; unset fields take the runtime's own defaults."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "!has(self.maxNumBatchedTokens) || !has(self.maxNumSeqs)"
                    " || self.maxNumBatchedTokens >= self.maxNumSeqs",
                    "maxNumBatchedTokens must be at least maxNumSeqs: every running "
                    "sequence needs one token of the step's budget",
                    ".maxNumBatchedTokens",
                ),
            ]
        }
    )

    max_model_len: int | None = Field(
        None, ge=16, le=1048576, description="Context length (prompt + output) in tokens."
    )
    max_num_seqs: int | None = Field(
        None, ge=1, le=4096, description="Most sequences batched in one step."
    )
    max_num_batched_tokens: int | None = Field(
        None, ge=1, le=1048576, description="Token budget of one scheduler step."
    )
    gpu_memory_utilization: float | None = Field(
        None, gt=0, le=1, description="Fraction of GPU memory the engine may use (0, 1]."
    )
    kv_cache_memory: float | None = Field(
        None,
        gt=0,
        le=4096,
        description="KV cache size in GiB on CPU-only pods (`--kv-cache-memory`).",
    )
    dtype: Dtype = Field("auto", description="Weight and activation dtype.")
    kv_cache_dtype: Dtype | None = Field(
        None,
        description="KV cache dtype (runtime default: auto, the model's). float16 or "
        "bfloat16 under float32 weights halve the cache's memory per token.",
    )
    enable_prefix_caching: bool | None = Field(
        None, description="Reuse KV blocks of shared prompt prefixes (runtime default: on)."
    )
    extra_args: list[Annotated[str, Field(max_length=1024)]] = Field(
        default_factory=list,
        max_length=64,
        description="More `pagoda serve` flags, appended verbatim. Flags the operator "
        "sets from typed fields (--host, --port, --served-model-name, --api-key, "
        "--tensor-parallel-size, --drain-timeout, the LoRA flags) are rejected.",
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    f"self.all(a, !a.matches('{OWNED_FLAGS_PATTERN}'))",
                    "extraArgs must not repeat flags the operator sets from typed fields",
                ),
            ]
        },
    )

    @model_validator(mode="after")
    def _budget_covers_seqs(self) -> EngineSpec:
        tokens, seqs = self.max_num_batched_tokens, self.max_num_seqs
        if tokens is not None and seqs is not None and tokens < seqs:
            raise RuleError(
                ".maxNumBatchedTokens",
                "maxNumBatchedTokens must be at least maxNumSeqs: every running "
                "sequence needs one token of the step's budget",
            )
        return self

    @field_validator("extra_args")
    @classmethod
    def _no_owned_flags(cls, args: list[str]) -> list[str]:
        for arg in args:
            if re.match(OWNED_FLAGS_PATTERN, arg):
                raise ValueError(
                    f"{arg!r}: extraArgs must not repeat flags the operator sets from typed fields"
                )
        return args


class SecretKeyRef(Model):
    """A key of a Secret in the LLMService's namespace."""

    name: str = Field(..., min_length=1, max_length=253, pattern=DNS_SUBDOMAIN)
    key: str = Field(
        "api-key",
        min_length=1,
        max_length=253,
        pattern=r"^[-._a-zA-Z0-9]+$",
        description="The key inside the Secret.",
    )


class HFTokenSecretRef(SecretKeyRef):
    """A key of a Secret holding a Hugging Face access token, for private and gated repos."""

    key: str = Field(
        "token",
        min_length=1,
        max_length=253,
        pattern=r"^[-._a-zA-Z0-9]+$",
        description="The key inside the Secret.",
    )


SIZE_LIMIT_MESSAGE = (
    "modelCache.sizeLimit sizes the emptyDir an hf:// model is downloaded to: "
    "it needs an hf:// model"
)
MODEL_CACHE_MESSAGE = (
    "modelCache is a PersistentVolumeClaim (claimName) or a per-pod emptyDir (sizeLimit): "
    "set exactly one"
)


class ModelCacheSpec(Model):
    """Where the pods keep the Hugging Face cache (HF_HOME) that hf:// models are downloaded to.

    A claim is shared by the pods and keeps the download across restarts; an
    emptyDir (the default, unbounded unless sizeLimit is set) is per pod and
    filled again by every new pod.
    """

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel("has(self.claimName) != has(self.sizeLimit)", MODEL_CACHE_MESSAGE),
            ]
        }
    )

    claim_name: str | None = Field(
        None,
        min_length=1,
        max_length=253,
        pattern=DNS_SUBDOMAIN,
        description="A PersistentVolumeClaim holding the cache (ReadWriteMany for replicas on "
        "several nodes). The download writes into it; the runtime mounts it read-only.",
    )
    size_limit: Quantity | None = Field(
        None,
        description="Without a claim: the size of each pod's emptyDir cache (e.g. 40Gi). A "
        "model larger than this fails its download at once, before writing.",
    )

    @field_validator("size_limit")
    @classmethod
    def _check_size(cls, value: int | str | None) -> str | None:
        return _quantity(value)

    @model_validator(mode="after")
    def _one_kind(self) -> ModelCacheSpec:
        if (self.claim_name is None) == (self.size_limit is None):
            raise RuleError("", MODEL_CACHE_MESSAGE)
        return self


class ServiceSpec(Model):
    """The Service in front of the pods (the OpenAI-compatible endpoint)."""

    type: Literal["ClusterIP", "NodePort", "LoadBalancer"] = "ClusterIP"
    port: int = Field(80, ge=1, le=65535, description="The Service's port.")
    annotations: dict[str, str] = Field(
        default_factory=dict, description="Annotations on the Service (load balancer settings)."
    )


class Toleration(Model):
    """A pod toleration, as in the core API."""

    key: str | None = None
    operator: Literal["Exists", "Equal"] | None = None
    value: str | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    toleration_seconds: int | None = None


class SchedulingSpec(Model):
    """Where the pods may run."""

    node_selector: dict[str, str] = Field(default_factory=dict)
    tolerations: list[Toleration] = Field(default_factory=list, max_length=64)
    affinity: dict[str, Any] | None = Field(
        None, description="A core/v1 Affinity, passed to the pods as is."
    )
    priority_class_name: str | None = Field(None, max_length=253, pattern=DNS_SUBDOMAIN)
    runtime_class_name: str | None = Field(
        None, max_length=253, pattern=DNS_SUBDOMAIN, description="e.g. `nvidia`."
    )
    topology_spread_constraints: list[dict[str, Any]] | None = Field(
        None,
        max_length=16,
        description="core/v1 TopologySpreadConstraints of the pods. Unset: spread across "
        "nodes when possible (kubernetes.io/hostname, ScheduleAnyway); [] for none.",
    )


UNIQUE_ENV_MESSAGE = "env names must be unique"
UNIQUE_PULL_SECRETS_MESSAGE = "imagePullSecrets must be unique"
# Variables the operator derives from other fields. A user's value for one of
# them would silently contradict that field, so the spec is refused instead;
# any other name the operator sets (HF_HUB_OFFLINE, PAGODA_NUM_THREADS) the
# user's value overrides.
API_KEY_ENV = "PAGODA_API_KEY"
API_KEY_ENV_MESSAGE = f"{API_KEY_ENV} comes from apiKeySecretRef: set one of them, not both"
ADMIN_KEY_ENV = "PAGODA_ADMIN_KEY"
ADMIN_KEY_ENV_MESSAGE = (
    f"{ADMIN_KEY_ENV} is the key of the pods' admin port, which the operator keeps in the "
    "Secret NAME-admin: it cannot be set in env"
)
HF_HOME_ENV = "HF_HOME"
HF_HOME_ENV_MESSAGE = (
    f"{HF_HOME_ENV} is where the operator mounts the model cache (an hf:// model or "
    "modelCache): it cannot be set in env"
)


class EnvVar(Model):
    """An extra environment variable of the runtime container, as in the core API."""

    name: str = Field(..., min_length=1, max_length=256, pattern=ENV_NAME_PATTERN)
    value: str | None = None
    value_from: dict[str, Any] | None = Field(
        None, description="A core/v1 EnvVarSource (secretKeyRef, configMapKeyRef, fieldRef...)."
    )


class RolloutSpec(Model):
    """How a changed spec rolls out. Unset fields default to a surge (maxSurge 1, maxUnavailable 0: a new pod starts before an old one stops, no capacity lost), except for GPU pods of a service with several replicas, which step down one pod at a time (maxSurge 0, maxUnavailable 1: no spare GPU is assumed). A single GPU replica surges: its new pod needs a free GPU, and waits (Pending) for one while the old pod serves."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "!has(self.maxSurge) || !has(self.maxUnavailable)"
                    " || !(type(self.maxSurge) == string"
                    " ? self.maxSurge == '0%' : self.maxSurge == 0)"
                    " || !(type(self.maxUnavailable) == string"
                    " ? self.maxUnavailable == '0%' : self.maxUnavailable == 0)",
                    "maxSurge and maxUnavailable cannot both be zero",
                ),
            ]
        }
    )

    max_surge: IntOrPercent | None = Field(
        None,
        description="Extra pods during a rollout (count or %). Default: 1, or 0 for GPU "
        "pods with several replicas.",
    )
    max_unavailable: IntOrPercent | None = Field(
        None,
        description="Pods that may be missing during a rollout (count or %). Default: 0, "
        "or 1 for GPU pods with several replicas.",
    )

    @field_validator("max_surge", "max_unavailable")
    @classmethod
    def _check(cls, value: int | str | None) -> int | str | None:
        return None if value is None else _int_or_percent(value)

    @model_validator(mode="after")
    def _not_both_zero(self) -> RolloutSpec:
        if self.max_surge in (0, "0%") and self.max_unavailable in (0, "0%"):
            raise RuleError("", "maxSurge and maxUnavailable cannot both be zero")
        return self


class DrainSpec(Model):
    """How a terminating pod finishes its work (rolling updates, scale-in, node drains)."""

    timeout_seconds: int = Field(
        60,
        ge=0,
        le=3600,
        description="After SIGTERM the runtime stops accepting requests and finishes "
        "in-flight ones for up to this long (`--drain-timeout`).",
    )
    pre_stop_seconds: int = Field(
        5,
        ge=0,
        le=120,
        description="Before SIGTERM the pod keeps serving this long, so that endpoints "
        "and load balancers stop routing to it first.",
    )


# -- LoRA adapters --------------------------------------------------------------

# What `model` selects in a request; the runtime's own rule, kept to a DNS-ish
# length so it also fits Event messages and status entries.
ADAPTER_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
ADAPTER_NAME_MAX = 63
MAX_ADAPTERS = 64
# hf://org/repo[/subfolder], pvc://claim[/path], or an absolute path in the pod.
ADAPTER_SOURCE_PATTERN = (
    r"^(hf://[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*(/[^/]+)*"
    r"|pvc://[a-z0-9]([-a-z0-9]*[a-z0-9])?(/[^/]+)*"
    r"|/.+)$"
)
UNIQUE_ADAPTERS_MESSAGE = "adapter names must be unique"
HF_ADAPTER_MESSAGE = (
    "an hf:// adapter is read from a claim someone filled (adapters are never downloaded): "
    "set modelCache.claimName"
)


class AdapterSpec(Model):
    """A LoRA adapter (PEFT folder) every pod serves under `name`."""

    name: str = Field(
        ...,
        min_length=1,
        max_length=ADAPTER_NAME_MAX,
        pattern=ADAPTER_NAME_PATTERN,
        description="What clients send as `model` to use the adapter.",
    )
    source: str = Field(
        ...,
        min_length=1,
        max_length=512,
        pattern=ADAPTER_SOURCE_PATTERN,
        description="The PEFT folder: `pvc://claim/path` (the model's claim, or another one "
        "mounted read-only), `hf://org/repo[/subfolder]` (read from modelCache, never "
        "downloaded), or an absolute path inside the pod (the image, or the model volume at "
        "/mnt/models).",
    )


class LoRASpec(Model):
    """The pods' LoRA capacity. Changing it restarts the pods; changing `adapters` does not."""

    max_loras: int = Field(
        4, ge=1, le=64, description="Adapters active in one batch (`--max-loras`)."
    )
    max_lora_rank: int = Field(
        16, ge=1, le=512, description="Highest adapter rank served (`--max-lora-rank`)."
    )
    max_cpu_loras: int | None = Field(
        None,
        ge=1,
        le=1024,
        description="Adapters kept in host memory per pod, LRU beyond, reread from their "
        "folder when needed again (`--max-cpu-loras`). Default: twice maxLoras.",
    )


class ScaleUpSpec(Model):
    """How fast the autoscaler adds replicas (HPA's scale-up behavior, in two numbers)."""

    stabilization_seconds: int = Field(
        0,
        ge=0,
        le=3600,
        description="Scale up only to the lowest recommendation of this many seconds "
        "(0: at once). Panic scale-ups wait too.",
    )
    max_step_percent: int = Field(
        100,
        ge=1,
        le=10000,
        description="One decision adds at most this percentage of the current replicas, "
        "or maxStepPods, whichever is more.",
    )
    max_step_pods: int = Field(
        4,
        ge=1,
        le=1024,
        description="One decision adds at most this many pods (see maxStepPercent).",
    )


class ScaleDownSpec(Model):
    """How cautiously the autoscaler removes replicas."""

    stabilization_seconds: int = Field(
        300,
        ge=0,
        le=3600,
        description="Scale down only to the highest recommendation of this many seconds: "
        "a dip in load shorter than this removes nothing.",
    )
    max_step_pods: int | None = Field(
        None,
        ge=1,
        le=1024,
        description="One decision removes at most this many pods (unset: no limit).",
    )


class KedaSpec(Model):
    """Where KEDA reads the runtime's metrics (mode: keda)."""

    server_address: str = Field(
        ...,
        min_length=1,
        max_length=1024,
        pattern=r"^https?://.+",
        description="The Prometheus server that scrapes the runtime pods, e.g. "
        "`http://prometheus-operated.monitoring.svc:9090`.",
    )
    polling_interval_seconds: int = Field(
        30, ge=1, le=3600, description="How often KEDA queries Prometheus (pollingInterval)."
    )
    cooldown_seconds: int = Field(
        300,
        ge=0,
        le=86400,
        description="Idle time before KEDA scales to zero when minReplicas is 0 (cooldownPeriod).",
    )


class AutoscalingSpec(Model):
    """Scale the replicas on queue depth, from the runtime pods' own /metrics."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "self.minReplicas <= self.maxReplicas",
                    "minReplicas must not exceed maxReplicas",
                    ".minReplicas",
                ),
                cel(
                    "self.panicWindowSeconds <= self.stableWindowSeconds",
                    "the panic window is the short one: panicWindowSeconds must not exceed "
                    "stableWindowSeconds",
                    ".panicWindowSeconds",
                ),
                cel(
                    "self.mode != 'keda' || has(self.keda)",
                    "mode keda reads the metrics from Prometheus: set keda.serverAddress",
                    ".keda",
                ),
            ]
        }
    )

    enabled: bool = Field(
        True,
        description="Off: replicas stay as written (the settings below are kept for later).",
    )
    mode: Literal["builtin", "keda"] = Field(
        "builtin",
        description="`builtin`: the operator scrapes the pods and scales (no Prometheus "
        "needed). `keda`: the operator renders a KEDA ScaledObject on the same metric "
        "instead, for clusters that run KEDA and Prometheus.",
    )
    min_replicas: int = Field(
        1,
        ge=0,
        le=1024,
        description="Fewest replicas. 0 scales to zero when idle: requests then fail until "
        "a pod is up (nothing holds them), and only a write to the scale subresource "
        "brings the first pod back.",
    )
    max_replicas: int = Field(..., ge=1, le=1024, description="Most replicas.")
    target_queue_depth: float = Field(
        4,
        gt=0,
        le=100000,
        description="Requests waiting per replica (vllm:num_requests_waiting + "
        "pagoda:num_requests_pending): the primary signal.",
    )
    target_kv_cache_usage: float | None = Field(
        None,
        validation_alias="targetKVCacheUsage",
        serialization_alias="targetKVCacheUsage",
        gt=0,
        le=1,
        description="KV-cache usage per replica (0-1), a secondary signal; the replica "
        "count is the largest any signal asks for.",
    )
    target_running_requests: float | None = Field(
        None,
        gt=0,
        le=100000,
        description="Requests in the batch per replica, a secondary signal, and the "
        "batch the arrival rate is sized for (without it, a full engine.maxNumSeqs). Keeps "
        "headroom: set it below engine.maxNumSeqs.",
    )
    metrics_interval_seconds: int = Field(
        5, ge=1, le=300, description="How often each ready pod's /metrics is read."
    )
    stable_window_seconds: int = Field(
        60,
        ge=1,
        le=3600,
        description="Demand is averaged over this window (Knative's stable window).",
    )
    panic_window_seconds: int = Field(
        6,
        ge=1,
        le=3600,
        description="The short window: when its demand needs twice the current replicas, "
        "scale up at once and scale down nothing for a stable window (panic mode).",
    )
    scale_up: ScaleUpSpec = Field(default_factory=ScaleUpSpec)
    scale_down: ScaleDownSpec = Field(default_factory=ScaleDownSpec)
    keda: KedaSpec | None = Field(None, description="Settings of mode keda.")

    @model_validator(mode="after")
    def _cross_field(self) -> AutoscalingSpec:
        if self.min_replicas > self.max_replicas:
            raise RuleError(".minReplicas", "minReplicas must not exceed maxReplicas")
        if self.panic_window_seconds > self.stable_window_seconds:
            raise RuleError(
                ".panicWindowSeconds",
                "the panic window is the short one: panicWindowSeconds must not exceed "
                "stableWindowSeconds",
            )
        if self.mode == "keda" and self.keda is None:
            raise RuleError(
                ".keda", "mode keda reads the metrics from Prometheus: set keda.serverAddress"
            )
        return self


class LLMServiceSpec(Model):
    """What the user asks for: one OpenAI-compatible endpoint backed by N runtime pods."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel(
                    "has(self.resources.profile) || !has(self.resources.gpus)"
                    " || self.resources.gpus == 0"
                    " || self.resources.gpus == self.tensorParallelSize"
                    " || (has(self.resources.allowUnusedGpus) && self.resources.allowUnusedGpus"
                    " && self.resources.gpus > self.tensorParallelSize)",
                    GPUS_MESSAGE,
                    ".resources.gpus",
                ),
                cel(
                    "!has(self.modelCache) || !has(self.modelCache.sizeLimit)"
                    " || self.model.startsWith('hf://')",
                    SIZE_LIMIT_MESSAGE,
                    ".modelCache.sizeLimit",
                ),
                cel(
                    "!has(self.adapters) || (has(self.modelCache) && has(self.modelCache.claimName))"
                    " || self.adapters.all(a, !a.source.startsWith('hf://'))",
                    HF_ADAPTER_MESSAGE,
                    ".modelCache",
                ),
                cel(
                    f"!has(self.env) || !self.env.exists(e, e.name == '{ADMIN_KEY_ENV}')",
                    ADMIN_KEY_ENV_MESSAGE,
                    ".env",
                ),
                cel(
                    f"!has(self.apiKeySecretRef) || !has(self.env)"
                    f" || !self.env.exists(e, e.name == '{API_KEY_ENV}')",
                    API_KEY_ENV_MESSAGE,
                    ".env",
                ),
                cel(
                    f"!(has(self.modelCache) || self.model.startsWith('hf://')) || !has(self.env)"
                    f" || !self.env.exists(e, e.name == '{HF_HOME_ENV}')",
                    HF_HOME_ENV_MESSAGE,
                    ".env",
                ),
            ]
        }
    )

    model: str = Field(
        ...,
        min_length=1,
        max_length=512,
        pattern=MODEL_PATTERN,
        description="The model: a built-in name (`smollm2-135m-instruct`), "
        "`hf://org/name[@revision]` (downloaded by each pod's init container into modelCache, "
        "then served offline), `pvc://claim/path`, or an absolute path inside the image.",
    )
    served_model_name: str | None = Field(
        None,
        min_length=1,
        max_length=256,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._:/-]*$",
        description="The name clients send as `model`. Default: the LLMService's name.",
    )
    image: str | None = Field(
        None,
        min_length=1,
        max_length=512,
        description="The runtime image. Default: the operator's configured runtime image.",
    )
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] | None = None
    image_pull_secrets: list[Annotated[str, Field(pattern=DNS_SUBDOMAIN, max_length=253)]] = Field(
        default_factory=list,
        max_length=16,
        description="Secret names for the registry.",
        # The pod's imagePullSecrets is a map keyed by name: no duplicates.
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )
    service_account_name: str | None = Field(
        None, max_length=253, pattern=DNS_SUBDOMAIN, description="The pods' ServiceAccount."
    )
    replicas: int = Field(
        1,
        ge=0,
        le=1024,
        description="Runtime pods. `kubectl scale` sets it; with autoscaling, the initial "
        "count only (the autoscaler writes it through the scale subresource), and a count "
        "outside [minReplicas, maxReplicas] is brought within them, as HPA does.",
    )
    min_available: int = Field(
        1,
        ge=1,
        le=1024,
        description="Serving endpoints needed to report Ready (at most `replicas`). A "
        "scale-out never lowers readiness; fewer serving pods than this does.",
    )
    resources: ResourcesSpec = Field(default_factory=ResourcesSpec)
    tensor_parallel_size: int = Field(
        1,
        ge=1,
        le=MAX_GPUS_PER_POD,
        description="Processes one model replica is sharded over, in one pod "
        "(`--tensor-parallel-size`): one rank per GPU on GPU pods (equals resources.gpus), "
        "ranks sharing the pod's cores on CPU pods. Must divide the model's attention heads.",
    )
    engine: EngineSpec = Field(default_factory=EngineSpec)
    api_key_secret_ref: SecretKeyRef | None = Field(
        None, description="Clients must send this key as a bearer token (PAGODA_API_KEY)."
    )
    model_cache: ModelCacheSpec | None = Field(
        None,
        description="The Hugging Face cache of hf:// models: a claim, or a per-pod emptyDir "
        "(the default).",
    )
    hf_token_secret_ref: HFTokenSecretRef | None = Field(
        None,
        description="A Hugging Face token (HF_TOKEN) for downloading private or gated hf:// "
        "models; only the download init container sees it.",
    )
    service: ServiceSpec = Field(default_factory=ServiceSpec)
    scheduling: SchedulingSpec = Field(default_factory=SchedulingSpec)
    env: list[EnvVar] = Field(
        default_factory=list,
        max_length=128,
        description="Extra environment variables of the runtime container. A name the "
        "operator also sets (HF_HUB_OFFLINE, PAGODA_NUM_THREADS) takes the value given here.",
        # Keyed by name, as the container's own env list: the API server refuses
        # duplicates instead of letting the Deployment's apply fail later.
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    pod_annotations: dict[str, str] = Field(default_factory=dict)
    rollout: RolloutSpec = Field(default_factory=RolloutSpec)
    drain: DrainSpec = Field(default_factory=DrainSpec)
    startup_timeout_seconds: int = Field(
        1800,
        ge=30,
        le=21600,
        description="How long a pod may take to load its model before it is restarted "
        "(the startup probe's budget). Large models from network storage need minutes.",
    )
    autoscaling: AutoscalingSpec | None = Field(
        None, description="Scale replicas on queue depth (unset: replicas stay as written)."
    )
    lora: LoRASpec | None = Field(
        None,
        description="Serve LoRA adapters (on when set or when `adapters` is not empty).",
    )
    adapters: list[AdapterSpec] = Field(
        default_factory=list,
        max_length=MAX_ADAPTERS,
        description="LoRA adapters every pod serves. Changes are hot-loaded into running "
        "pods (no restart); restarted and new pods load them before they turn Ready.",
        # A map keyed by name: the API server refuses duplicates itself, in
        # linear time, where a CEL rule would cost quadratic time per write.
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )

    @field_validator("env")
    @classmethod
    def _unique_env(cls, env: list[EnvVar]) -> list[EnvVar]:
        names = [var.name for var in env]
        if len(set(names)) != len(names):
            raise ValueError(UNIQUE_ENV_MESSAGE)
        return env

    @field_validator("image_pull_secrets")
    @classmethod
    def _unique_pull_secrets(cls, names: list[str]) -> list[str]:
        if len(set(names)) != len(names):
            raise ValueError(UNIQUE_PULL_SECRETS_MESSAGE)
        return names

    @field_validator("adapters")
    @classmethod
    def _unique_adapters(cls, adapters: list[AdapterSpec]) -> list[AdapterSpec]:
        names = [a.name for a in adapters]
        if len(set(names)) != len(names):
            raise ValueError(UNIQUE_ADAPTERS_MESSAGE)
        return adapters

    @model_validator(mode="after")
    def _cross_field(self) -> LLMServiceSpec:
        if not self.resources.profile:
            check_gpus(
                self.resources.gpus or 0,
                self.tensor_parallel_size,
                bool(self.resources.allow_unused_gpus),
            )
        claim = self.model_cache.claim_name if self.model_cache else None
        size_limit = self.model_cache.size_limit if self.model_cache else None
        if size_limit is not None and not self.model.startswith("hf://"):
            raise RuleError(".modelCache.sizeLimit", SIZE_LIMIT_MESSAGE)
        if claim is None and any(a.source.startswith("hf://") for a in self.adapters):
            raise RuleError(".modelCache", HF_ADAPTER_MESSAGE)
        names = {var.name for var in self.env}
        if ADMIN_KEY_ENV in names:
            raise RuleError(".env", ADMIN_KEY_ENV_MESSAGE)
        if self.api_key_secret_ref is not None and API_KEY_ENV in names:
            raise RuleError(".env", API_KEY_ENV_MESSAGE)
        if self.mounts_model_cache and HF_HOME_ENV in names:
            raise RuleError(".env", HF_HOME_ENV_MESSAGE)
        return self

    @property
    def mounts_model_cache(self) -> bool:
        """Whether the pods get a Hugging Face cache (HF_HOME) from the operator."""
        return self.model.startswith("hf://") or self.model_cache is not None

    @property
    def lora_enabled(self) -> bool:
        """Whether the pods run with LoRA (a pod-level setting: flipping it restarts them)."""
        return self.lora is not None or bool(self.adapters)


def check_gpus(gpus: int, tensor_parallel_size: int, allow_unused: bool) -> None:
    """One GPU per rank; also applied after a profile is resolved.

    A CPU pod (no GPU) runs its ranks as processes sharing its cores (gloo),
    so any tensor-parallel size fits it.
    """
    if gpus == 0:
        ok = True
    else:
        ok = gpus == tensor_parallel_size or (allow_unused and gpus > tensor_parallel_size)
    if not ok:
        raise RuleError(".resources.gpus", GPUS_MESSAGE)


class Condition(Model):
    """A status condition following the Kubernetes API conventions (metav1.Condition)."""

    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str
    message: str = ""
    last_transition_time: str
    observed_generation: int | None = None


class ScaleDecision(Model):
    """The autoscaler's last change of the replica count."""

    reason: str = Field(..., description="Why, in one word: Panic, AboveTarget, BelowTarget...")
    message: str = ""
    from_: int = Field(..., validation_alias="from", serialization_alias="from")
    to: int
    time: str


class AutoscalingStatus(Model):
    """What the autoscaler last measured and decided (status.autoscaling)."""

    mode: str | None = Field(None, description="builtin or keda.")
    queue_depth: float | None = Field(
        None, description="Requests waiting, summed over the pods that answered."
    )
    running_requests: float | None = Field(None, description="Requests in the batch, summed.")
    kv_cache_usage: float | None = Field(
        None, description="Mean KV-cache usage (0-1) of the pods that answered."
    )
    arrival_rate: float | None = Field(
        None,
        description="Requests per second received by the ready pods over the stable window "
        "(pagoda:requests_received_total); absent while not known.",
    )
    service_time_seconds: float | None = Field(
        None,
        description="Mean time a request spends in the batch "
        "(vllm:request_inference_time_seconds); arrivalRate times it is the batch the "
        "arrivals keep busy.",
    )
    pods_measured: int | None = Field(None, description="Ready pods whose /metrics answered.")
    pods_unanswered: int | None = Field(None, description="Ready pods whose /metrics did not.")
    pods_starting: int | None = Field(None, description="Pods not ready yet: capacity coming.")
    desired_replicas: int | None = Field(None, description="The replica count decided last.")
    panic: bool | None = Field(None, description="Whether the scaler is in panic mode.")
    last_scale_time: str | None = None
    last_decision: ScaleDecision | None = None


class AdapterStatus(Model):
    """How many ready pods serve one adapter (status.adapters)."""

    name: str
    ready_pods: int = Field(0, description="Ready pods serving the adapter.")
    failed_pods: int = Field(0, description="Ready pods that refused it after repeated attempts.")
    message: str = Field("", description="The runtime's last error, if any.")


class LLMServiceStatus(Model):
    """What the operator observed; written only by the operator."""

    observed_generation: int | None = None
    replicas: int | None = Field(None, description="Pods that exist (scale subresource).")
    ready_replicas: int | None = None
    updated_replicas: int | None = None
    selector: str | None = Field(
        None, description="Label selector of the pods (scale subresource, for HPAs)."
    )
    endpoint: str | None = Field(None, description="In-cluster URL of the OpenAI API.")
    conditions: list[Condition] = Field(default_factory=list)
    autoscaling: AutoscalingStatus | None = None
    adapters: list[AdapterStatus] | None = None


def unknown_fields(model: type[BaseModel], data: Any, path: str = "spec") -> list[str]:
    """Paths in `data` that `model` does not declare (ignored, see `Model`)."""
    if not isinstance(data, dict):
        return []
    known = {
        (info.validation_alias if isinstance(info.validation_alias, str) else None)
        or to_camel(name): info
        for name, info in model.model_fields.items()
    }
    found = []
    for key, value in data.items():
        info = known.get(key)
        if info is None:
            found.append(f"{path}.{key}")
            continue
        for sub in _models_in(info.annotation):
            if isinstance(value, list):
                for index, item in enumerate(value):
                    found += unknown_fields(sub, item, f"{path}.{key}[{index}]")
            else:
                found += unknown_fields(sub, value, f"{path}.{key}")
    return found


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The Model classes inside a field's type (`X | None`, `list[X]`)."""
    if isinstance(annotation, type) and issubclass(annotation, Model):
        return [annotation]
    return [m for arg in getattr(annotation, "__args__", ()) for m in _models_in(arg)]
