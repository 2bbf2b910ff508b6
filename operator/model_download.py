"""Where the pods' model downloads stand: each init container's state and its /progress.

A pod whose `model-download` init container runs serves `GET /progress` on
its port (runtime/entrypoints/download.py); the operator reads it the way it
reads /metrics (the pod has no Kubernetes credentials to report anything
itself). `pod_downloads` reads the init container's state from the pod's
status (pure); `read_progress` asks the downloading pods for their bytes.
`status.model_ready_condition` turns both into the ModelReady condition.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pagoda.operator.pod_http import PodHttp, PodHttpError
from pagoda.operator.render.labels import RUNTIME_PORT
from pagoda.operator.render.model_download import DOWNLOAD_CONTAINER, PROGRESS_PATH

TIMEOUT = 2.0
MAX_BODY = 64 << 10
# How often a sync loop re-reads the progress while a pod downloads: no pod
# event marks a download's bytes, and the resync (30 s) is too slow a clock.
REFRESH_SECONDS = 5.0


@dataclass(frozen=True, slots=True)
class Progress:
    """What one pod's download says of itself (its GET /progress)."""

    bytes_done: int
    bytes_total: int
    phase: str = "Downloading"


@dataclass(frozen=True, slots=True)
class PodDownload:
    """The download of one pod, from its init container's status.

    `state` is Pending (not started), Downloading, Done or Failed; `message`
    is a failure's termination message.
    """

    pod: str
    state: str
    message: str = ""
    ip: str | None = None


def _init_status(pod: Mapping[str, Any]) -> Mapping[str, Any] | None:
    for status in (pod.get("status") or {}).get("initContainerStatuses") or []:
        if status.get("name") == DOWNLOAD_CONTAINER:
            return status
    return None


def pod_download(pod: Mapping[str, Any]) -> PodDownload | None:
    """Where this pod's download is; None for a pod without one (another model)."""
    spec_init = [c.get("name") for c in (pod.get("spec") or {}).get("initContainers") or []]
    if DOWNLOAD_CONTAINER not in spec_init:
        return None
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    name = meta.get("name", "?")
    found = _init_status(pod)
    if found is None:
        return PodDownload(name, "Pending")
    state = found.get("state") or {}
    last = (found.get("lastState") or {}).get("terminated") or {}
    terminated = state.get("terminated") or {}
    if terminated:
        if terminated.get("exitCode") == 0:
            return PodDownload(name, "Done")
        return PodDownload(
            name, "Failed", terminated.get("message") or terminated.get("reason", "")
        )
    if state.get("running"):
        return PodDownload(name, "Downloading", ip=status.get("podIP"))
    if last and last.get("exitCode") != 0:
        # Waiting to retry (CrashLoopBackOff) after a failure: that failure is the news.
        return PodDownload(name, "Failed", last.get("message") or last.get("reason", ""))
    return PodDownload(name, "Pending")


def pod_downloads(pods: Iterable[Mapping[str, Any]]) -> list[PodDownload]:
    """The downloads of the pods that have one, terminating pods left out."""
    out = []
    for pod in pods:
        if (pod.get("metadata") or {}).get("deletionTimestamp"):
            continue
        found = pod_download(pod)
        if found is not None:
            out.append(found)
    return out


def downloading(pods: Iterable[Mapping[str, Any]]) -> bool:
    """Whether some pod's download runs now (its progress is news)."""
    return any(d.state == "Downloading" for d in pod_downloads(pods))


def parse_progress(body: bytes) -> Progress | None:
    """A /progress answer, or None when it is not one."""
    try:
        data = json.loads(body)
        done, total = int(data["bytesDone"]), int(data["bytesTotal"])
    except (ValueError, KeyError, TypeError):
        return None
    if done < 0 or total < 0:
        return None
    return Progress(min(done, total), total, str(data.get("phase", "Downloading")))


async def read_progress(
    pods: Iterable[Mapping[str, Any]], http: PodHttp, timeout: float = TIMEOUT
) -> dict[str, Progress]:
    """The progress of each downloading pod that answers (by pod name); the others are left out."""

    async def one(download: PodDownload) -> tuple[str, Progress | None]:
        url = f"http://{download.ip}:{RUNTIME_PORT}{PROGRESS_PATH}"
        try:
            status, body = await http.request("GET", url, timeout, max_body=MAX_BODY)
        except PodHttpError:
            return download.pod, None
        return download.pod, parse_progress(body) if status == 200 else None

    asking = [d for d in pod_downloads(pods) if d.state == "Downloading" and d.ip]
    answers = await asyncio.gather(*(one(d) for d in asking))
    return {name: progress for name, progress in answers if progress is not None}


class ProgressReader:
    """`read_progress` over one `PodHttp`, for the sync loops (closed at shutdown)."""

    def __init__(self, timeout: float = TIMEOUT) -> None:
        self.timeout = timeout
        self._http = PodHttp()

    async def __call__(self, pods: Iterable[Mapping[str, Any]]) -> dict[str, Progress]:
        return await read_progress(pods, self._http, self.timeout)

    async def close(self) -> None:
        await self._http.close()
