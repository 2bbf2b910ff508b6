"""What the operator gets wrong that only a real API server's behaviour shows.

kubesim's API server now evaluates selectors on the server, refuses duplicate
keys in an applied list and runs the CRD's CEL rules on /scale and every
update, and answers 409 to a write with a stale resourceVersion. Each test
below is the operator's behaviour against that server, for a defect of the
operator that only those refusals showed (each failed before its fix).
"""

from __future__ import annotations

import datetime

from kubesim.apiserver import ApiServer
from kubesim.testing import (
    DEPLOYMENTS,
    LLMS,
    NS,
    create,
    eventually,
    llmservice,
    obj,
    patch,
    path_of,
)
from pagoda.operator.api import KubeApi
from pagoda.operator.autoscaler import Autoscaler
from pagoda.operator.config import OperatorConfig
from pagoda.operator.handlers import child_selector
from pagoda.operator.llmservice import parse

CHILD_RESOURCES = (
    "apps/v1/deployments",
    "v1/services",
    "v1/configmaps",
    "policy/v1/poddisruptionbudgets",
    "v1/pods",
    "discovery.k8s.io/v1/endpointslices",
)


async def test_every_child_watch_is_filtered_on_the_server(operator: ApiServer) -> None:
    await create(operator, llmservice())
    await eventually(lambda: obj(operator, DEPLOYMENTS, "chat"))
    watched = {r.resource: r for r in operator.watch_requests if r.watch}
    assert set(CHILD_RESOURCES) <= set(watched)
    for resource in CHILD_RESOURCES:
        assert watched[resource].label_selector == child_selector(resource.split("/")), resource


async def test_a_status_write_during_the_scrape_does_not_void_the_scale_decision(
    cluster: ApiServer,
) -> None:
    created = await create(
        cluster, llmservice(autoscaling={"maxReplicas": 4, "targetQueueDepth": 2})
    )
    ready = {"podIP": "10.0.0.1", "conditions": [{"type": "Ready", "status": "True"}]}
    await create(
        cluster,
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "chat-a", "namespace": NS},
         "spec": {}, "status": ready},
    )  # fmt: skip
    writes = iter(range(100))

    async def scrape_while_the_status_is_written(url: str, timeout: float) -> str:
        path = path_of(LLMS, NS, "chat") + "/status"
        await patch(cluster, path, {"status": {"endpoint": f"http://chat-{next(writes)}"}})
        return "vllm:num_requests_waiting 8\n"

    api = KubeApi.from_environment()
    try:
        scaler = Autoscaler(api, scrape_while_the_status_is_written)
        now = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(minutes=10)
        await scaler.tick(parse(created, OperatorConfig()), {}, 0.0, now)
    finally:
        api.close()
    assert obj(cluster, LLMS, "chat")["spec"]["replicas"] == 4


async def test_a_users_env_var_of_the_operators_name_wins_without_a_duplicate(
    operator: ApiServer,
) -> None:
    claim = {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "hf"}}
    await create(operator, {**claim, "metadata": {"name": "hf", "namespace": NS}})
    env = [{"name": "HF_HUB_OFFLINE", "value": "0"}]
    cache = {"claimName": "hf"}  # an hf:// model: the operator sets HF_HUB_OFFLINE too
    await create(operator, llmservice(model="hf://org/m", modelCache=cache, env=env))
    deployment = await eventually(lambda: obj(operator, DEPLOYMENTS, "chat"))
    env = deployment["spec"]["template"]["spec"]["containers"][0]["env"]
    assert [e["value"] for e in env if e["name"] == "HF_HUB_OFFLINE"] == ["0"]


async def test_lowering_max_replicas_below_the_live_count_clamps(operator: ApiServer) -> None:
    autoscaling = {"enabled": True, "minReplicas": 1, "maxReplicas": 4}
    await create(operator, llmservice(replicas=3, autoscaling=autoscaling))
    await eventually(lambda: obj(operator, DEPLOYMENTS, "chat"))
    await patch(operator, path_of(LLMS, NS, "chat"), {"spec": {"autoscaling": {"maxReplicas": 2}}})
    await eventually(lambda: obj(operator, DEPLOYMENTS, "chat")["spec"]["replicas"] == 2)
