"""The Deployment renderer: defaults, then each optional field on its own."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
from pagoda.operator.config import OperatorConfig
from pagoda.operator.llmservice import parse
from pagoda.operator.model import ResourcesSpec
from pagoda.operator.render.configmap import config_hash, engine_env
from pagoda.operator.render.deployment import (
    CONFIG_HASH_ANNOTATION,
    TEMPLATE_HASH_ANNOTATION,
    render_deployment,
)

CONFIG = OperatorConfig(
    runtime_image="registry.test/runtime:1",
    profiles={"h100": ResourcesSpec(gpus=1, gpu_type="NVIDIA-H100", cpu="8", memory="64Gi")},
)


# The admin port's key, from the admin Secret the operator keeps.
ADMIN_KEY_ENV = {
    "name": "PAGODA_ADMIN_KEY",
    "valueFrom": {"secretKeyRef": {"name": "chat-admin", "key": "token"}},
}


def render(config: OperatorConfig = CONFIG, **spec: Any) -> dict[str, Any]:
    body = {
        "metadata": {"name": "chat", "namespace": "ml", "uid": "u-1", "generation": 3},
        "spec": {"model": "smollm2-135m-instruct", **spec},
    }
    deployment = render_deployment(parse(body, config), config)
    kubernetes_validate.validate(deployment, "1.30", strict=True)
    return deployment


def pod(deployment: dict[str, Any]) -> dict[str, Any]:
    return deployment["spec"]["template"]["spec"]


def container(deployment: dict[str, Any]) -> dict[str, Any]:
    return pod(deployment)["containers"][0]


def test_defaults_serve_the_builtin_model_on_cpu() -> None:
    d = render()
    c = container(d)
    assert d["metadata"]["name"] == "chat" and d["metadata"]["namespace"] == "ml"
    assert d["spec"]["replicas"] == 1
    assert c["image"] == "registry.test/runtime:1"
    assert c["command"] == ["pagoda", "serve"]
    assert c["args"] == [
        "smollm2-135m-instruct",
        "--host",
        "0.0.0.0",
        "--port",
        "8000",
        "--admin-port",
        "8001",
        "--served-model-name",
        "chat",
        "--tensor-parallel-size",
        "1",
        "--drain-timeout",
        "60",
    ]
    assert c["envFrom"] == [{"configMapRef": {"name": "chat-engine"}}]
    assert c["ports"] == [
        {"name": "http", "containerPort": 8000, "protocol": "TCP"},
        {"name": "admin", "containerPort": 8001, "protocol": "TCP"},
    ]
    assert c["resources"] == {"requests": {"cpu": "1", "memory": "2Gi"}}
    assert c["env"] == [ADMIN_KEY_ENV, {"name": "PAGODA_NUM_THREADS", "value": "1"}]
    assert "volumeMounts" not in c
    assert "nodeSelector" not in pod(d) and "tolerations" not in pod(d) and "volumes" not in pod(d)


def test_with_autoscaling_the_pods_follow_the_bounds_whatever_the_count() -> None:
    assert render(replicas=6, autoscaling={"maxReplicas": 4})["spec"]["replicas"] == 4
    assert (
        render(replicas=1, autoscaling={"minReplicas": 2, "maxReplicas": 4})["spec"]["replicas"]
        == 2
    )
    off = {"maxReplicas": 4, "enabled": False}
    assert render(replicas=6, autoscaling=off)["spec"]["replicas"] == 6


def test_owner_reference_makes_the_llmservice_the_controller() -> None:
    (owner,) = render()["metadata"]["ownerReferences"]
    assert owner == {
        "apiVersion": "pagoda.dev/v1alpha1",
        "kind": "LLMService",
        "name": "chat",
        "uid": "u-1",
        "controller": True,
        "blockOwnerDeletion": True,
    }


def test_probes_gate_on_health_with_a_startup_budget() -> None:
    c = container(render(startupTimeoutSeconds=3600))
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert c[probe]["httpGet"] == {"path": "/health", "port": "http"}
    startup = c["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 3600


def test_serving_flags_follow_the_spec() -> None:
    args = container(
        render(servedModelName="llama3", resources={"gpus": 1}, drain={"timeoutSeconds": 5})
    )["args"]
    flags = dict(zip(args[1::2], args[2::2]))
    assert flags["--served-model-name"] == "llama3"
    assert flags["--tensor-parallel-size"] == "1"
    assert flags["--drain-timeout"] == "5"


def test_rollout_drops_no_request() -> None:
    d = render(drain={"timeoutSeconds": 120, "preStopSeconds": 10})
    assert d["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    assert container(d)["lifecycle"]["preStop"] == {"sleep": {"seconds": 10}}
    # SIGKILL comes only after the pause and the whole drain.
    assert pod(d)["terminationGracePeriodSeconds"] > 10 + 120


def test_pre_stop_falls_back_to_exec_sleep_where_the_cluster_has_no_sleep_action() -> None:
    old_cluster = OperatorConfig(runtime_image="registry.test/runtime:1", sleep_action=False)
    d = render(old_cluster, drain={"preStopSeconds": 10})
    assert container(d)["lifecycle"]["preStop"] == {"exec": {"command": ["sleep", "10"]}}


def test_gpu_pods_roll_out_without_a_surge_by_default() -> None:
    d = render(replicas=2, resources={"gpus": 1})
    assert d["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}
    one = render(replicas=1, resources={"gpus": 1})
    assert one["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    surge = render(resources={"gpus": 1}, rollout={"maxSurge": 1, "maxUnavailable": 0})
    assert surge["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}


def test_a_gpu_pod_is_never_best_effort() -> None:
    res = container(render(resources={"gpus": 2, "allowUnusedGpus": True}))["resources"]
    assert res["requests"] == {"cpu": "8", "memory": "32Gi", "nvidia.com/gpu": 2}
    assert res["limits"] == {"nvidia.com/gpu": 2}  # no memory limit guessed for the user


def test_pods_spread_across_nodes_by_default() -> None:
    (spread,) = pod(render())["topologySpreadConstraints"]
    assert spread["topologyKey"] == "kubernetes.io/hostname"
    assert spread["whenUnsatisfiable"] == "ScheduleAnyway"
    assert spread["labelSelector"]["matchLabels"] == render()["spec"]["selector"]["matchLabels"]
    assert spread["matchLabelKeys"] == ["pod-template-hash"]
    zone = {
        "maxSkew": 1,
        "topologyKey": "topology.kubernetes.io/zone",
        "whenUnsatisfiable": "DoNotSchedule",
    }
    zone["labelSelector"] = {"matchLabels": {"app.kubernetes.io/name": "pagoda-runtime"}}
    custom = render(scheduling={"topologySpreadConstraints": [zone]})
    assert pod(custom)["topologySpreadConstraints"] == [zone]
    assert "topologySpreadConstraints" not in pod(
        render(scheduling={"topologySpreadConstraints": []})
    )


def test_rollout_and_drain_overrides() -> None:
    d = render(rollout={"maxSurge": "25%", "maxUnavailable": 1}, drain={"preStopSeconds": 0})
    assert d["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": "25%", "maxUnavailable": 1}
    assert "lifecycle" not in container(d)


def test_pods_run_unprivileged() -> None:
    d = render()
    assert pod(d)["securityContext"]["runAsNonRoot"] is True
    assert pod(d)["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert container(d)["securityContext"]["allowPrivilegeEscalation"] is False
    assert container(d)["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert pod(d)["enableServiceLinks"] is False
    assert pod(d)["automountServiceAccountToken"] is False


def test_gpus_are_requested_and_tolerated() -> None:
    d = render(
        resources={"gpus": 1, "gpuType": "NVIDIA-A100-SXM4-80GB", "cpu": 8, "memory": "96Gi"}
    )
    res = container(d)["resources"]
    assert res["requests"] == {"cpu": "8", "memory": "96Gi", "nvidia.com/gpu": 1}
    assert res["limits"] == {"memory": "96Gi", "nvidia.com/gpu": 1}
    assert pod(d)["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod(d)[
        "tolerations"
    ]


def test_operator_config_names_the_gpu_resource_and_label() -> None:
    config = OperatorConfig(gpu_resource="amd.com/gpu", gpu_type_label="amd.com/gpu.product")
    d = render(config, resources={"gpus": 1, "gpuType": "MI300X"})
    assert container(d)["resources"]["limits"]["amd.com/gpu"] == 1
    assert pod(d)["nodeSelector"] == {"amd.com/gpu.product": "MI300X"}


def test_profile_supplies_resources_and_explicit_fields_win() -> None:
    d = render(resources={"profile": "h100", "memory": "80Gi"})
    res = container(d)["resources"]
    assert res["requests"] == {"cpu": "8", "memory": "80Gi", "nvidia.com/gpu": 1}
    assert pod(d)["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100"}


def test_tensor_parallel_size_maps_to_gpus_shm_and_the_flag() -> None:
    d = render(tensorParallelSize=4, resources={"gpus": 4, "sharedMemory": "32Gi"})
    c = container(d)
    flags = dict(zip(c["args"][1::2], c["args"][2::2]))
    assert flags["--tensor-parallel-size"] == "4"
    assert c["resources"]["requests"]["nvidia.com/gpu"] == 4
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 4
    assert {"name": "dshm", "mountPath": "/dev/shm"} in c["volumeMounts"]
    (volume,) = [v for v in pod(d)["volumes"] if v["name"] == "dshm"]
    assert volume["emptyDir"] == {"medium": "Memory", "sizeLimit": "32Gi"}


def test_a_tensor_parallel_cpu_pod_has_shm_and_a_core_per_rank() -> None:
    c = container(render(tensorParallelSize=3))
    flags = dict(zip(c["args"][1::2], c["args"][2::2]))
    assert flags["--tensor-parallel-size"] == "3"
    assert c["resources"] == {"requests": {"cpu": "3", "memory": "6Gi"}}  # no GPU asked
    assert {"name": "dshm", "mountPath": "/dev/shm"} in c["volumeMounts"]


def test_one_rank_shares_no_tensors_and_has_no_shm_volume() -> None:
    assert "volumes" not in pod(render(resources={"gpus": 2, "allowUnusedGpus": True}))


def test_pvc_model_is_mounted_read_only() -> None:
    d = render(model="pvc://models/llama-3-8b")
    assert container(d)["args"][0] == "/mnt/models/llama-3-8b"
    assert pod(d)["volumes"] == [
        {"name": "model", "persistentVolumeClaim": {"claimName": "models", "readOnly": True}}
    ]
    assert container(d)["volumeMounts"] == [
        {"name": "model", "mountPath": "/mnt/models", "readOnly": True}
    ]


def test_pvc_root_is_the_model_folder() -> None:
    assert container(render(model="pvc://models"))["args"][0] == "/mnt/models"


def test_hf_model_reads_the_mounted_cache_offline() -> None:
    d = render(model="hf://meta-llama/Llama-3.1-8B-Instruct", modelCache={"claimName": "hf-cache"})
    c = container(d)
    assert c["args"][0] == "meta-llama/Llama-3.1-8B-Instruct"
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["HF_HUB_OFFLINE"] == "1" and env["HF_HOME"] == c["volumeMounts"][0]["mountPath"]
    assert c["volumeMounts"][0]["readOnly"] is True
    # Writable at the volume: the download init container fills it.
    assert pod(d)["volumes"][0]["persistentVolumeClaim"] == {
        "claimName": "hf-cache",
        "readOnly": False,
    }


def test_image_path_model_is_passed_as_is() -> None:
    assert container(render(model="/opt/models/qwen"))["args"][0] == "/opt/models/qwen"


def test_api_key_comes_from_the_secret() -> None:
    c = container(render(apiKeySecretRef={"name": "keys", "key": "token"}))
    assert c["env"][0] == {
        "name": "PAGODA_API_KEY",
        "valueFrom": {"secretKeyRef": {"name": "keys", "key": "token"}},
    }


def test_the_admin_port_is_declared_and_its_key_comes_from_the_admin_secret() -> None:
    c = container(render(apiKeySecretRef={"name": "keys"}))
    assert {"name": "admin", "containerPort": 8001, "protocol": "TCP"} in c["ports"]
    assert c["args"][c["args"].index("--admin-port") + 1] == "8001"
    assert ADMIN_KEY_ENV in c["env"]
    # The user key is a separate credential from a separate Secret.
    assert c["env"][0]["valueFrom"]["secretKeyRef"]["name"] == "keys"
    # Probes and scrape hints stay on the public port.
    assert c["readinessProbe"]["httpGet"]["port"] == "http"
    assert pod_annotations_of(render())["prometheus.io/port"] == "8000"


def pod_annotations_of(deployment: dict[str, Any]) -> dict[str, str]:
    return deployment["spec"]["template"]["metadata"]["annotations"]


def test_user_env_comes_last_so_it_wins() -> None:
    c = container(
        render(env=[{"name": "LOG_LEVEL", "value": "debug"}], apiKeySecretRef={"name": "k"})
    )
    assert c["env"][-1] == {"name": "LOG_LEVEL", "value": "debug"}


def test_env_is_merged_by_name_with_the_users_value_winning() -> None:
    # Server-side apply refuses a Deployment whose env repeats a name.
    c = container(
        render(
            model="hf://org/model",
            modelCache={"claimName": "hf"},
            env=[{"name": "HF_HUB_OFFLINE", "value": "0"}, {"name": "A", "value": "1"}],
        )
    )
    names = [e["name"] for e in c["env"]]
    assert len(names) == len(set(names)), names
    assert {"name": "HF_HUB_OFFLINE", "value": "0"} in c["env"]
    assert c["env"][-1] == {"name": "A", "value": "1"}


def test_extra_args_are_appended() -> None:
    args = container(render(engine={"extraArgs": ["--enforce-eager"]}))["args"]
    assert args[-1] == "--enforce-eager"


def test_scheduling_fields_reach_the_pod() -> None:
    affinity = {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}}
    p = pod(
        render(
            scheduling={
                "nodeSelector": {"pool": "llm"},
                "tolerations": [
                    {
                        "key": "dedicated",
                        "operator": "Equal",
                        "value": "llm",
                        "effect": "NoSchedule",
                    }
                ],
                "affinity": affinity,
                "priorityClassName": "inference",
                "runtimeClassName": "nvidia",
            },
            serviceAccountName="llm-runtime",
            imagePullSecrets=["regcred"],
        )
    )
    assert p["nodeSelector"] == {"pool": "llm"}
    assert p["tolerations"] == [
        {"key": "dedicated", "operator": "Equal", "value": "llm", "effect": "NoSchedule"}
    ]
    assert p["affinity"] == affinity
    assert p["priorityClassName"] == "inference" and p["runtimeClassName"] == "nvidia"
    assert p["serviceAccountName"] == "llm-runtime"
    assert p["imagePullSecrets"] == [{"name": "regcred"}]


def test_image_and_pull_policy_override_the_default() -> None:
    c = container(render(image="my.registry/pagoda:dev", imagePullPolicy="Always"))
    assert c["image"] == "my.registry/pagoda:dev" and c["imagePullPolicy"] == "Always"


def test_pod_annotations_merge_with_scrape_hints_and_config_hash() -> None:
    d = render(podAnnotations={"team": "search"})
    annotations = d["spec"]["template"]["metadata"]["annotations"]
    assert annotations["team"] == "search"
    assert annotations["prometheus.io/port"] == "8000"
    assert CONFIG_HASH_ANNOTATION in annotations


def test_engine_change_changes_the_config_hash_and_so_rolls_pods() -> None:
    a = render()["spec"]["template"]["metadata"]["annotations"][CONFIG_HASH_ANNOTATION]
    b = render(engine={"maxModelLen": 4096})["spec"]["template"]["metadata"]["annotations"]
    assert b[CONFIG_HASH_ANNOTATION] != a


def test_the_template_hash_names_the_pods_of_the_current_spec() -> None:
    def template_hash(**spec: Any) -> str:
        return render(**spec)["spec"]["template"]["metadata"]["annotations"][
            TEMPLATE_HASH_ANNOTATION
        ]

    assert template_hash() == template_hash()
    assert template_hash(image="registry.test/runtime:2") != template_hash()
    assert template_hash(replicas=5) == template_hash()  # scaling is not a new template


def test_config_hash_is_stable() -> None:
    env = {"PAGODA_A": "1", "PAGODA_B": "2"}
    assert config_hash(env) == config_hash(dict(reversed(env.items())))


def test_selector_is_minimal_and_matches_the_pod_labels() -> None:
    d = render()
    selector = d["spec"]["selector"]["matchLabels"]
    assert selector == {"app.kubernetes.io/name": "pagoda-runtime", "pagoda.dev/llmservice": "chat"}
    assert selector.items() <= d["spec"]["template"]["metadata"]["labels"].items()


def test_engine_env_is_what_the_config_hash_covers() -> None:
    body = {
        "metadata": {"name": "chat", "namespace": "ml"},
        "spec": {"model": "smollm2-135m-instruct"},
    }
    env = engine_env(parse(body, CONFIG))
    annotations = render()["spec"]["template"]["metadata"]["annotations"]
    assert annotations[CONFIG_HASH_ANNOTATION] == config_hash(env)


# -- LoRA ---------------------------------------------------------------------


def template_hash_of(deployment: dict[str, Any]) -> str:
    return deployment["spec"]["template"]["metadata"]["annotations"][TEMPLATE_HASH_ANNOTATION]


def test_lora_flags_and_the_adapters_file_volume() -> None:
    d = render(adapters=[{"name": "sql", "source": "/opt/sql"}], lora={"maxLoras": 2})
    args = container(d)["args"]
    flags = dict(zip(args[1::2], args[2::2], strict=False))
    assert "--enable-lora" in args
    assert args[args.index("--max-loras") + 1] == "2"
    assert args[args.index("--max-lora-rank") + 1] == "16"
    assert "--max-cpu-loras" not in args  # the runtime's default: twice --max-loras
    assert args[args.index("--lora-adapters-file") + 1] == "/etc/pagoda/adapters/adapters.json"
    assert flags  # the flags come before extraArgs, as every owned flag
    assert {"name": "adapters", "configMap": {"name": "chat-adapters"}} in pod(d)["volumes"]
    assert {
        "name": "adapters",
        "mountPath": "/etc/pagoda/adapters",
        "readOnly": True,
    } in container(d)["volumeMounts"]


def test_no_lora_no_flags_no_volume() -> None:
    d = render()
    assert "--enable-lora" not in container(d)["args"]
    assert "volumes" not in pod(d)


def test_changing_adapters_rolls_no_pod_but_turning_lora_on_does() -> None:
    one = render(adapters=[{"name": "a", "source": "/opt/a"}])
    many = render(adapters=[{"name": f"a{i}", "source": f"/opt/a{i}"} for i in range(20)])
    assert template_hash_of(one) == template_hash_of(many)
    two = render(
        adapters=[{"name": "a", "source": "/opt/a2"}, {"name": "b", "source": "pvc://models/b"}],
        lora={"maxCpuLoras": 2},
    )
    # Another adapter on a claim already mounted, or none, changes no template.
    assert template_hash_of(one) == template_hash_of(render(lora={}))
    assert template_hash_of(two) != template_hash_of(render())  # LoRA on: new flags
    same_claims = render(
        adapters=[{"name": "x", "source": "pvc://models/x"}], lora={"maxCpuLoras": 2}
    )
    assert template_hash_of(two) == template_hash_of(same_claims)


def test_adapters_on_another_claim_mount_it_read_only() -> None:
    d = render(
        model="pvc://models/base",
        adapters=[
            {"name": "a", "source": "pvc://models/loras/a"},  # the model's claim: no new volume
            {"name": "b", "source": "pvc://loras/b"},
        ],
    )
    claims = [
        v["persistentVolumeClaim"]["claimName"]
        for v in pod(d)["volumes"]
        if "persistentVolumeClaim" in v
    ]
    assert claims == ["models", "loras"]
    mounts = {m["mountPath"] for m in container(d)["volumeMounts"]}
    assert {"/mnt/models", "/mnt/adapters/loras", "/etc/pagoda/adapters"} <= mounts


def test_hf_adapters_read_the_model_cache_offline() -> None:
    d = render(
        modelCache={"claimName": "hf"},
        adapters=[{"name": "a", "source": "hf://org/lora"}],
    )
    env = {e["name"]: e.get("value") for e in container(d)["env"]}
    assert env["HF_HUB_OFFLINE"] == "1" and env["HF_HOME"] == "/var/cache/pagoda/huggingface"


def test_a_cpu_pod_runs_one_engine_thread_per_requested_core() -> None:
    def threads(**spec: Any) -> str | None:
        env = {e["name"]: e.get("value") for e in container(render(**spec)).get("env", [])}
        return env.get("PAGODA_NUM_THREADS")

    assert threads(resources={"cpu": "8"}) == "8"
    assert threads(resources={"cpu": "2500m"}) == "2"
    assert threads(resources={"cpu": "500m"}) == "1"
    assert threads() == "1"  # the default request of a CPU pod
    assert threads(resources={"gpus": 1, "cpu": "8"}) is None
    assert threads(tensorParallelSize=2, resources={"cpu": "4"}) is None
    # The user's own variable replaces it (env is keyed by name: no duplicate).
    env = container(
        render(resources={"cpu": "8"}, env=[{"name": "PAGODA_NUM_THREADS", "value": "3"}])
    )["env"]
    assert [e["value"] for e in env if e["name"] == "PAGODA_NUM_THREADS"] == ["3"]
