"""The operator's watches through what a real API server does to them.

A watch ends (a server timeout, a restart) and the client resumes from the
last version it saw; when that version has been compacted away the server
answers 410 Gone and the client must list again. kopf does both; these tests
hold the operator to it against kubesim's versioned watches.
"""

from __future__ import annotations

from kubesim.apiserver import ApiServer
from kubesim.testing import DEPLOYMENTS, LLMS, create, eventually, llmservice, obj


def requests_for(server: ApiServer, watch: bool) -> list[str]:
    """The resourceVersions the lists or watches of LLMServices started from."""
    return [
        r.resource_version for r in server.watch_requests if r.resource == LLMS and r.watch == watch
    ]


async def test_an_ended_watch_resumes_from_its_last_version(operator: ApiServer) -> None:
    await create(operator, llmservice())
    await eventually(lambda: obj(operator, DEPLOYMENTS, "chat"))
    lists, watches = len(requests_for(operator, False)), len(requests_for(operator, True))
    await operator.end_watches()
    resumed = await eventually(lambda: requests_for(operator, True)[watches:])
    assert resumed[0] not in ("", "0"), "a resumed watch names the version it saw last"
    assert len(requests_for(operator, False)) == lists, "no need to list again"


async def test_after_410_gone_the_operator_lists_again_and_keeps_watching(
    operator: ApiServer,
) -> None:
    await create(operator, llmservice())
    await eventually(lambda: obj(operator, DEPLOYMENTS, "chat"))
    lists, watches = len(requests_for(operator, False)), len(requests_for(operator, True))
    await operator.end_watches(compact=True)
    await eventually(lambda: len(requests_for(operator, False)) > lists)
    await eventually(lambda: len(requests_for(operator, True)) > watches + 1)  # 410, then anew
    # The new watch sees changes: a second LLMService gets its children.
    await create(operator, llmservice("second"))
    await eventually(lambda: obj(operator, DEPLOYMENTS, "second"))
