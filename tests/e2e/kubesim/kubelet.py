"""A kubelet for one node: every pod's real container command, run as a local process.

For each pod bound to the node it starts the container's own `command` and
`args` (from the pod spec the operator rendered, nothing re-invented) with
the environment Kubernetes would give it: `env` (values, Secret and
ConfigMap keys, the downward API), `envFrom`, plus the image's environment.
The image is this virtualenv: `command[0]` is looked up in its bin folder.

ConfigMap volumes are projected as the kubelet does (each key a symlink into
a `..data` folder that is swapped atomically) into the pod's folder, and kept
up to date while the pod runs: a changed ConfigMap reaches the running
container's files, never its environment. An emptyDir is a folder of the
pod's own; a PersistentVolumeClaim a folder of the node's, by claim name,
that outlives the pod (neither readOnly nor an emptyDir's sizeLimit is
enforced). A pod has its own mount
namespace on a real node; here the kubelet rewrites an argument or an
environment value that names a path under a volume's mountPath to its folder.

Init containers run first, in order, each to completion (a failed one is
restarted with back-off, as under restartPolicy Always) and are reported in
`initContainerStatuses` and the `Initialized` condition; the pod's container
starts once they all succeeded (`_run_init_containers`).

A pod has its own network namespace on a real node; here each pod gets its
own loopback address instead (`network.AddressPool`), and the one thing the
kubelet changes in the command is the listen address: `--host 0.0.0.0` (or
`--host=0.0.0.0`) becomes `--host <pod IP>`. Nothing else is rewritten: light
engine settings for tests belong in the LLMService spec (`engine`, `env`).

Then it does a kubelet's job, with probe periods compressed to
`probe_interval`: reports the pod Running with its IP, Ready from the
readiness probe (the runtime's real /health), restarts a container whose
process exits (restartCount, lastState with the termination message of its
policy, CrashLoopBackOff while backing off),
restarts one whose liveness probe fails. `kill()` plays a crash (an OOM
kill, say).

A deleted pod keeps its object, marked with deletionTimestamp and
deletionGracePeriodSeconds (`graceful`), until the kubelet has stopped it:
the preStop pause, SIGTERM, SIGKILL at the grace deadline (a later, shorter
grace period brings it forward). Meanwhile the readiness probe goes on (the
liveness and startup probes do not), so the pod's Ready follows the
container's drain. Then the kubelet reports the pod Succeeded or Failed and
deletes it with a grace period of 0, which removes the object.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import datetime
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from kubesim.apiserver import MERGE, ApiServer
from kubesim.network import AddressPool
from kubesim.testing import PODS, path_of

log = logging.getLogger("kubesim.kubelet")
IMAGE_BIN = Path(sys.executable).parent
# What the runtime image's Dockerfile sets (ENV lines), minus the paths.
IMAGE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "PYTHONUNBUFFERED": "1",
    "TOKENIZERS_PARALLELISM": "false",
}


class ConfigError(Exception):
    """A Secret or ConfigMap the container needs is missing (CreateContainerConfigError)."""


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class PodProcess:
    """One pod on this node: its address and its (single) container's process."""

    name: str
    namespace: str
    uid: str
    llmservice: str | None
    ip: str
    port: int
    container: dict[str, Any]
    grace_seconds: float
    workdir: Path
    # The container's /tmp: short, because unix socket paths (the runtime's
    # ipc sockets live in $TMPDIR) must fit in 107 bytes.
    tmpdir: Path
    process: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    ready: bool = False
    waiting: str | None = None
    last_exit: dict[str, Any] | None = None
    started_at: str | None = None
    # The startup probe has passed: readiness and liveness probes now run.
    started_up: bool = False
    stopping: bool = False
    # The pod's object was deleted (has a deletionTimestamp): once stopped, the
    # kubelet removes it. A pod stopped with the node keeps its object.
    deleted: bool = False
    # time.monotonic() of the deletion, and of the SIGKILL that ends its grace period.
    deletion_began: float = 0.0
    kill_at: float | None = None
    # Condition type -> (status, lastTransitionTime), as last reported.
    transitions: dict[str, tuple[str, str]] = field(default_factory=dict)
    task: asyncio.Task[None] | None = field(default=None, repr=False)
    # The pod's volumes (spec.volumes) and, per projected ConfigMap volume,
    # the resourceVersion last written into its folder.
    volumes: list[dict[str, Any]] = field(default_factory=list)
    projected: dict[str, str] = field(default_factory=dict)
    # spec.initContainers, and their statuses once they started (None: none).
    init_containers: list[dict[str, Any]] = field(default_factory=list)
    init_statuses: list[dict[str, Any]] | None = None

    @property
    def url(self) -> str:
        """Where the container listens, e.g. http://127.31.7.2:8000."""
        return f"http://{self.ip}:{self.port}"

    @property
    def pid(self) -> int | None:
        """The container's main process, while it runs."""
        return self.process.pid if self.process and self.process.poll() is None else None

    @property
    def log_path(self) -> Path:
        return self.workdir / "container.log"

    def log(self, tail: int = 4000) -> str:
        """The end of the container's output."""
        try:
            return self.log_path.read_text(errors="replace")[-tail:]
        except OSError:
            return ""


def _initialized(handle: PodProcess) -> bool:
    """Every init container has completed (the pod's Initialized condition)."""
    if not handle.init_containers:
        return True
    if handle.init_statuses is None:
        return False
    return all("terminated" in s["state"] and s["ready"] for s in handle.init_statuses)


def _named_port(container: dict[str, Any], port: int | str) -> int:
    if isinstance(port, int):
        return port
    for declared in container.get("ports") or []:
        if declared.get("name") == port:
            return int(declared["containerPort"])
    raise ValueError(f"container has no port named {port!r}")


class Kubelet:
    """Runs, probes, restarts and stops the pods of one node."""

    def __init__(
        self,
        server: ApiServer,
        workdir: Path,
        addresses: AddressPool,
        probe_interval: float = 0.5,
        node_name: str = "kubesim-node",
    ) -> None:
        self.server = server
        self.workdir = workdir
        self.addresses = addresses
        self.probe_interval = probe_interval
        self.node_name = node_name
        self._pods: dict[tuple[str, str], PodProcess] = {}
        self._http: aiohttp.ClientSession | None = None

    # ------------------------------------------------------------------ API
    def pods(self, llmservice: str | None = None) -> list[PodProcess]:
        """The pods on this node (optionally of one LLMService), terminating ones included."""
        return [p for p in self._pods.values() if llmservice is None or p.llmservice == llmservice]

    def pod(self, name: str) -> PodProcess:
        """One pod by name."""
        for found in self._pods.values():
            if found.name == name:
                return found
        raise KeyError(name)

    def kill(self, pod: PodProcess | str, sig: int = signal.SIGKILL) -> int:
        """Signal the container's main process (a crash, an OOM kill); returns its pid."""
        handle = self.pod(pod) if isinstance(pod, str) else pod
        pid = handle.pid
        if pid is None:
            raise RuntimeError(f"pod {handle.name} has no running process")
        os.kill(pid, sig)
        return pid

    # ----------------------------------------------------------- node loop
    async def sync(self) -> None:
        """Start pods bound to this node, stop pods that are gone."""
        if self._http is None:
            self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2))
        live = {}
        for pod in self.server.list_objects(PODS):
            meta = pod["metadata"]
            if (pod.get("spec") or {}).get("nodeName") == self.node_name:
                live[meta["namespace"], meta["name"]] = pod
        for key, pod in live.items():
            known = self._pods.get(key)
            if known is None and not pod["metadata"].get("deletionTimestamp"):
                self._start(pod)
            elif known is None and pod["metadata"].get("deletionGracePeriodSeconds"):
                await self._remove_unstarted(pod)
        for key, handle in list(self._pods.items()):
            pod = live.get(key)
            gone = pod is None or pod["metadata"]["uid"] != handle.uid
            meta = {} if gone or pod is None else pod["metadata"]
            if meta.get("deletionTimestamp"):
                self._mark_deleted(handle, meta)
            if gone:
                handle.stopping = True
            if handle.task is not None and handle.task.done():
                del self._pods[key]

    @staticmethod
    def _mark_deleted(handle: PodProcess, meta: dict[str, Any]) -> None:
        """The pod was deleted: stop it by its grace deadline (which may only come closer)."""
        grace = meta.get("deletionGracePeriodSeconds")
        grace = handle.grace_seconds if grace is None else float(grace)
        if not handle.deleted:
            handle.deleted, handle.stopping = True, True
            handle.deletion_began = time.monotonic()
        # A later DELETE may shorten the grace period; it counts from the first.
        deadline = handle.deletion_began + grace
        handle.kill_at = deadline if handle.kill_at is None else min(handle.kill_at, deadline)

    async def stop(self, timeout: float = 30.0) -> None:
        """Stop every pod (gracefully, then by force) and release the node."""
        for handle in self._pods.values():
            handle.stopping = True
        tasks = [h.task for h in self._pods.values() if h.task is not None]
        if tasks:
            await asyncio.wait(tasks, timeout=timeout)
        for handle in self._pods.values():
            self._kill_group(handle)
        self._pods.clear()
        if self._http is not None:
            await self._http.close()
            self._http = None

    # ------------------------------------------------------------ one pod
    def _start(self, pod: dict[str, Any]) -> None:
        meta, spec = pod["metadata"], pod["spec"]
        (container,) = spec["containers"][:1]
        port = int((container.get("ports") or [{"containerPort": 80}])[0]["containerPort"])
        workdir = self.workdir / meta["name"]
        workdir.mkdir(parents=True, exist_ok=True)
        handle = PodProcess(
            name=meta["name"],
            namespace=meta["namespace"],
            uid=meta["uid"],
            llmservice=(meta.get("labels") or {}).get("pagoda.dev/llmservice"),
            ip=self.addresses.allocate(port),
            port=port,
            container=container,
            grace_seconds=float(spec.get("terminationGracePeriodSeconds", 30)),
            workdir=workdir,
            tmpdir=Path(tempfile.mkdtemp(prefix="kubesim-")),
            volumes=list(spec.get("volumes") or []),
            init_containers=list(spec.get("initContainers") or []),
        )
        handle.task = asyncio.create_task(self._run(handle), name=f"pod {meta['name']}")
        self._pods[meta["namespace"], meta["name"]] = handle

    async def _run(self, handle: PodProcess) -> None:
        liveness_failures = 0
        try:
            await self._report(handle)
            if not await self._run_init_containers(handle):
                return
            while not handle.stopping:
                if handle.process is None or handle.process.poll() is not None:
                    liveness_failures = 0
                    if not await self._start_container(handle):
                        await asyncio.sleep(self.probe_interval)
                        continue
                if not handle.started_up:
                    # The startup probe holds the other two off while the model
                    # loads (its time budget is not enforced here).
                    handle.started_up = await self._probe(handle, "startupProbe", default=True)
                if handle.started_up:
                    ready = await self._probe(handle, "readinessProbe", default=True)
                    if ready != handle.ready:
                        handle.ready = ready
                        await self._report(handle)
                    alive = await self._probe(handle, "livenessProbe", default=True)
                    liveness_failures = 0 if alive else liveness_failures + 1
                    threshold = (handle.container.get("livenessProbe") or {}).get(
                        "failureThreshold", 3
                    )
                    if liveness_failures >= threshold:
                        log.warning("pod %s: liveness probe failed, restarting", handle.name)
                        self._kill_group(handle)  # the loop sees the exit and restarts
                if handle.process is not None:
                    with contextlib.suppress(ConfigError):  # deleted: the files stay
                        self._project_volumes(handle)
                await asyncio.sleep(self.probe_interval)
        finally:
            await self._terminate(handle)

    async def _run_init_containers(self, handle: PodProcess) -> bool:
        """Run spec.initContainers in order, each to completion; False if the pod stops first.

        Each runs with its own command, environment and mounts (a copy of the
        pod's handle that carries it), on the pod's address; a failed one is
        restarted with the kubelet's back-off (restartPolicy Always) and its
        termination message kept in lastState. The app container waits in
        PodInitializing meanwhile.
        """
        if not handle.init_containers:
            return True
        handle.init_statuses = [
            {
                "name": c["name"],
                "image": c.get("image", ""),
                "ready": False,
                "restartCount": 0,
                "state": {"waiting": {"reason": "PodInitializing"}},
            }
            for c in handle.init_containers
        ]
        handle.waiting = "PodInitializing"
        for container, status in zip(handle.init_containers, handle.init_statuses, strict=True):
            run = dataclasses.replace(handle, container=container, process=None, task=None)
            while True:
                try:
                    env = self._environment(run)
                    self._project_volumes(run)
                except ConfigError as e:
                    status["state"] = {
                        "waiting": {"reason": "CreateContainerConfigError", "message": str(e)}
                    }
                    await self._report(handle)
                    await asyncio.sleep(self.probe_interval)
                    if handle.stopping:
                        return False
                    continue
                argv = self._argv(run)
                # One line, whatever the arguments hold: the termination message is what follows.
                started_line = " ".join(argv).replace("\n", "\\n")
                with open(handle.log_path, "ab") as out:
                    out.write(f"--- start {now()}: {started_line}\n".encode())
                    out.flush()
                    run.process = subprocess.Popen(
                        argv,
                        env=env,
                        cwd=handle.workdir,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        stdin=subprocess.DEVNULL,
                        start_new_session=True,
                    )
                started = now()
                status["state"] = {"running": {"startedAt": started}}
                await self._report(handle)
                while run.process.poll() is None and not handle.stopping:
                    await asyncio.sleep(self.probe_interval)
                if handle.stopping:
                    self._kill_group(run)
                    return False
                code = run.process.returncode
                self._kill_group(run)
                exit_code = 128 + -code if code < 0 else code
                terminated = {
                    "exitCode": exit_code,
                    "reason": "Completed" if code == 0 else "Error",
                    "startedAt": started,
                    "finishedAt": now(),
                }
                message = self._termination_message(run, code)
                if message:
                    terminated["message"] = message
                if code == 0:
                    status["state"], status["ready"] = {"terminated": terminated}, True
                    await self._report(handle)
                    break
                status["lastState"] = {"terminated": terminated}
                status["restartCount"] += 1
                status["state"] = {"waiting": {"reason": "CrashLoopBackOff"}}
                await self._report(handle)
                await asyncio.sleep(min(10.0, 2.0 ** (status["restartCount"] - 1)))
                if handle.stopping:
                    return False
        handle.waiting = None
        return True

    async def _start_container(self, handle: PodProcess) -> bool:
        """(Re)start the container; False while it must wait (backoff, missing config)."""
        if handle.process is not None:
            # It exited: the container is dead, and so is everything it started.
            code = handle.process.returncode
            self._kill_group(handle)
            handle.restarts += 1
            handle.ready = False
            reason = (
                "OOMKilled" if code == -signal.SIGKILL else ("Completed" if code == 0 else "Error")
            )
            handle.last_exit = {
                "reason": reason,
                "exitCode": 128 + -code if code < 0 else code,
                "finishedAt": now(),
                "startedAt": handle.started_at,
            }
            message = self._termination_message(handle, code)
            if message:
                handle.last_exit["message"] = message
            handle.process, handle.started_at, handle.started_up = None, None, False
            backoff = 0.0 if handle.restarts == 1 else min(10.0, 2.0 ** (handle.restarts - 2))
            if backoff:
                handle.waiting = "CrashLoopBackOff"
                await self._report(handle)
                await asyncio.sleep(backoff)
                if handle.stopping:
                    return False
        try:
            env = self._environment(handle)
            self._project_volumes(handle)
        except ConfigError as e:
            handle.waiting = "CreateContainerConfigError"
            await self._report(handle, message=str(e))
            return False
        argv = self._argv(handle)
        with open(handle.log_path, "ab") as out:
            out.write(f"--- start {now()}: {' '.join(argv)}\n".encode())
            out.flush()
            handle.process = subprocess.Popen(
                argv,
                env=env,
                cwd=handle.workdir,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                # A process group per container: the container's death takes
                # its children (the runtime's EngineCore) with it.
                start_new_session=True,
            )
        handle.started_at, handle.waiting = now(), None
        await self._report(handle)
        return True

    @staticmethod
    def _termination_message(handle: PodProcess, code: int) -> str:
        """What the kubelet keeps of a failed container's output, as its policy says.

        `FallbackToLogsOnError`: the last 80 lines (at most 2048 bytes) of the
        log of a container that failed. (No container here writes
        /dev/termination-log, the other source.)
        """
        policy = handle.container.get("terminationMessagePolicy", "File")
        if policy != "FallbackToLogsOnError" or code == 0:
            return ""
        this_run = handle.log(1 << 20).rsplit("\n--- start ", 1)[-1].split("\n", 1)[-1]
        return "\n".join(this_run.splitlines()[-80:])[-2048:]

    def _argv(self, handle: PodProcess) -> list[str]:
        command = list(handle.container.get("command") or [])
        args = list(handle.container.get("args") or [])
        if not command:
            raise ValueError(f"pod {handle.name}: no command (the image's entry point is unknown)")
        program = IMAGE_BIN / command[0]
        command[0] = str(program) if program.exists() else command[0]
        rewritten = []
        for index, arg in enumerate(args):
            if arg == "0.0.0.0" and index > 0 and args[index - 1] == "--host":
                arg = handle.ip
            elif arg == "--host=0.0.0.0":
                arg = f"--host={handle.ip}"
            else:
                arg = self._mounted_path(handle, arg)
            rewritten.append(arg)
        return command + rewritten

    # ------------------------------------------------------------ volumes
    def _config_map_mounts(self, handle: PodProcess) -> list[tuple[str, str, str]]:
        """(volume name, ConfigMap name, mountPath) of the container's ConfigMap volumes."""
        by_name = {v.get("name"): v for v in handle.volumes}
        out = []
        for mount in handle.container.get("volumeMounts") or []:
            source = (by_name.get(mount.get("name")) or {}).get("configMap")
            if source is not None:
                out.append((mount["name"], source["name"], mount["mountPath"].rstrip("/")))
        return out

    def _volume_dir(self, handle: PodProcess, volume: str) -> Path:
        return handle.workdir / "volumes" / volume

    def _mounted_path(self, handle: PodProcess, arg: str) -> str:
        """`arg` with a volume's mountPath replaced by its folder here."""
        flag, eq, value = arg.partition("=") if arg.startswith("--") else ("", "", arg)
        folders = [
            (mount, self._volume_dir(handle, volume))
            for volume, _, mount in self._config_map_mounts(handle)
        ]
        folders += self._directory_mounts(handle)
        for mount, folder in folders:
            if value == mount or value.startswith(mount + "/"):
                local = str(folder) + value[len(mount) :]
                return f"{flag}{eq}{local}" if eq else local
        return arg

    def _directory_mounts(self, handle: PodProcess) -> list[tuple[str, Path]]:
        """(mountPath, folder) of the container's emptyDir and PersistentVolumeClaim volumes."""
        by_name = {v.get("name"): v for v in handle.volumes}
        out = []
        for mount in handle.container.get("volumeMounts") or []:
            volume = by_name.get(mount.get("name")) or {}
            if "emptyDir" in volume:
                folder = self._volume_dir(handle, mount["name"])
            elif "persistentVolumeClaim" in volume:
                claim = volume["persistentVolumeClaim"]["claimName"]
                folder = self.workdir / "claims" / handle.namespace / claim
            else:
                continue
            folder.mkdir(parents=True, exist_ok=True)
            out.append((mount["mountPath"].rstrip("/"), folder))
        return out

    def _project_volumes(self, handle: PodProcess) -> None:
        """Write each ConfigMap volume whose ConfigMap changed, the kubelet's way:
        the keys are symlinks into `..data`, which is swapped in one rename, so a
        reader sees the old files or the new ones, never half of each."""
        for volume, name, _ in self._config_map_mounts(handle):
            found = self.server.get_object("v1/configmaps", handle.namespace, name)
            if found is None:
                raise ConfigError(f'configmap "{name}" not found')
            version = str(found["metadata"].get("resourceVersion"))
            if handle.projected.get(volume) == version:
                continue
            folder = self._volume_dir(handle, volume)
            folder.mkdir(parents=True, exist_ok=True)
            stamp = f"..{time.time_ns()}"
            (folder / stamp).mkdir()
            data = found.get("data") or {}
            for key, value in data.items():
                (folder / stamp / key).write_text(value)
            (folder / "..data_tmp").unlink(missing_ok=True)
            os.symlink(stamp, folder / "..data_tmp")
            old = os.readlink(folder / "..data") if (folder / "..data").is_symlink() else None
            os.replace(folder / "..data_tmp", folder / "..data")
            for key in data:
                if not (folder / key).is_symlink():
                    os.symlink(f"..data/{key}", folder / key)
            for entry in folder.iterdir():
                if (
                    entry.is_symlink()
                    and entry.name not in data
                    and not entry.name.startswith("..")
                ):
                    entry.unlink()
            if old:
                shutil.rmtree(folder / old, ignore_errors=True)
            handle.projected[volume] = version

    def _environment(self, handle: PodProcess) -> dict[str, str]:
        container = handle.container
        env = {
            **IMAGE_ENV,
            "PATH": f"{IMAGE_BIN}:{os.environ.get('PATH', '/usr/bin:/bin')}",
            "HOME": os.environ.get("HOME", "/tmp"),
            "TMPDIR": str(handle.tmpdir),
            "HOSTNAME": handle.name,
        }
        for source in container.get("envFrom") or []:
            if "configMapRef" in source:
                env.update(self._config_map(handle, source["configMapRef"]["name"]))
            if "secretRef" in source:
                env.update(self._secret(handle, source["secretRef"]["name"]))
        for var in container.get("env") or []:
            if "value" in var:
                env[var["name"]] = self._mounted_path(handle, str(var["value"]))
            elif "valueFrom" in var:
                env[var["name"]] = self._value_from(handle, var["valueFrom"])
        return env

    def _config_map(self, handle: PodProcess, name: str) -> dict[str, str]:
        found = self.server.get_object("v1/configmaps", handle.namespace, name)
        if found is None:
            raise ConfigError(f'configmap "{name}" not found')
        return dict(found.get("data") or {})

    def _secret(self, handle: PodProcess, name: str) -> dict[str, str]:
        found = self.server.get_object("v1/secrets", handle.namespace, name)
        if found is None:
            raise ConfigError(f'secret "{name}" not found')
        data = {k: base64.b64decode(v).decode() for k, v in (found.get("data") or {}).items()}
        return {**data, **(found.get("stringData") or {})}

    def _value_from(self, handle: PodProcess, source: dict[str, Any]) -> str:
        if "secretKeyRef" in source:
            ref = source["secretKeyRef"]
            values = self._secret(handle, ref["name"])
        elif "configMapKeyRef" in source:
            ref = source["configMapKeyRef"]
            values = self._config_map(handle, ref["name"])
        else:
            field_path = source.get("fieldRef", {}).get("fieldPath", "")
            known = {
                "metadata.name": handle.name,
                "metadata.namespace": handle.namespace,
                "metadata.uid": handle.uid,
                "status.podIP": handle.ip,
                "spec.nodeName": self.node_name,
            }
            return known.get(field_path, "")
        if ref["key"] not in values:
            raise ConfigError(f"couldn't find key {ref['key']} in {ref['name']}")
        return values[ref["key"]]

    async def _probe(self, handle: PodProcess, kind: str, default: bool) -> bool:
        probe = handle.container.get(kind)
        if handle.pid is None:
            return False
        if not probe or "httpGet" not in probe:
            return default
        get = probe["httpGet"]
        port = _named_port(handle.container, get.get("port", handle.port))
        url = f"http://{handle.ip}:{port}{get.get('path', '/')}"
        assert self._http is not None
        try:
            async with self._http.get(url) as response:
                return 200 <= response.status < 400
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
            return False

    @staticmethod
    def _pre_stop_pause(handle: PodProcess) -> float:
        """Seconds of the preStop hook: `sleep` (1.30+) or `exec` of `sleep N`."""
        pre_stop = ((handle.container.get("lifecycle") or {}).get("preStop")) or {}
        command = (pre_stop.get("exec") or {}).get("command") or []
        if command[:1] == ["sleep"]:
            return float(command[1])
        return float((pre_stop.get("sleep") or {}).get("seconds", 0))

    async def _terminate(self, handle: PodProcess) -> None:
        """preStop, SIGTERM, SIGKILL at the grace deadline; a deleted pod is then removed."""
        process = handle.process
        if process is not None and process.poll() is None:
            started = time.monotonic()
            default_kill_at = started + handle.grace_seconds
            term_at = started + self._pre_stop_pause(handle)
            signalled, next_probe = False, started
            while process.poll() is None:
                now = time.monotonic()
                if now >= (handle.kill_at or default_kill_at):
                    break
                if not signalled and now >= term_at:
                    process.send_signal(signal.SIGTERM)
                    signalled = True
                if handle.deleted and now >= next_probe:
                    # Readiness is still probed while a deleted pod drains.
                    ready = await self._probe(handle, "readinessProbe", default=True)
                    if ready != handle.ready:
                        handle.ready = ready
                        await self._report(handle)
                    next_probe = now + self.probe_interval
                await asyncio.sleep(0.05)
        self._kill_group(handle)
        code = process.returncode if process is not None else None
        handle.process = None
        shutil.rmtree(handle.tmpdir, ignore_errors=True)
        if handle.deleted:
            try:
                await self._remove(handle, code)
            except (aiohttp.ClientError, OSError) as e:  # the API server went first
                log.warning("pod %s: cannot remove its object: %s", handle.name, e)

    async def _remove_unstarted(self, pod: dict[str, Any]) -> None:
        """A pod deleted before it ran here has nothing to stop: it goes at once."""
        meta = pod["metadata"]
        await self._delete_for_good(meta["namespace"], meta["name"], meta["uid"])

    async def _remove(self, handle: PodProcess, code: int | None) -> None:
        """Report the stopped pod's final status, then delete its object for good."""
        handle.ready = False
        await self._report(handle, exit_code=code)
        await self._delete_for_good(handle.namespace, handle.name, handle.uid)

    async def _delete_for_good(self, namespace: str, name: str, uid: str) -> None:
        """The kubelet's last word on a pod: DELETE with a grace period of 0, for this uid."""
        body = {"gracePeriodSeconds": 0, "preconditions": {"uid": uid}}
        async with self.server.delete(path_of(PODS, namespace, name), json=body) as response:
            if response.status >= 300 and response.status not in (404, 409):
                log.warning("pod %s delete: %s", name, await response.text())

    def _kill_group(self, handle: PodProcess) -> None:
        """SIGKILL the container's process group and reap its main process."""
        process = handle.process
        if process is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            log.warning("pod %s: process %s did not die", handle.name, process.pid)

    def _condition(self, handle: PodProcess, kind: str, status: str) -> dict[str, Any]:
        """A pod condition whose lastTransitionTime moves only when its status flips."""
        previous = handle.transitions.get(kind)
        if previous is None or previous[0] != status:
            previous = handle.transitions[kind] = (status, now())
        return {"type": kind, "status": status, "lastTransitionTime": previous[1]}

    async def _report(
        self, handle: PodProcess, message: str = "", exit_code: int | None = None
    ) -> None:
        """Write the pod's status as a kubelet does; `exit_code`: the container stopped for good."""
        running = handle.pid is not None and handle.waiting is None
        ready = "True" if running and handle.ready else "False"
        state: dict[str, Any]
        phase = "Running" if running else "Pending"
        if exit_code is not None:
            code = 128 - exit_code if exit_code < 0 else exit_code
            state = {
                "terminated": {
                    "exitCode": code,
                    "reason": "Completed" if code == 0 else "Error",
                    "startedAt": handle.started_at,
                    "finishedAt": now(),
                }
            }
            phase = "Succeeded" if code == 0 else "Failed"
        elif running:
            state = {"running": {"startedAt": handle.started_at}}
        else:
            reason = handle.waiting or "ContainerCreating"
            state = {"waiting": {"reason": reason, "message": message}}
        container_status = {
            "name": handle.container["name"],
            "image": handle.container.get("image", ""),
            "ready": ready == "True",
            "started": running,
            "restartCount": handle.restarts,
            "state": state,
        }
        if handle.last_exit:
            container_status["lastState"] = {"terminated": handle.last_exit}
        status = {
            "phase": phase,
            "hostIP": "127.0.0.1",
            "podIP": handle.ip,
            "podIPs": [{"ip": handle.ip}],
            "conditions": [
                self._condition(handle, "PodScheduled", "True"),
                self._condition(handle, "Initialized", "True" if _initialized(handle) else "False"),
                self._condition(handle, "ContainersReady", ready),
                self._condition(handle, "Ready", ready),
            ],
            "containerStatuses": [container_status],
        }
        if handle.init_statuses is not None:
            status["initContainerStatuses"] = handle.init_statuses
        path = path_of(PODS, handle.namespace, handle.name) + "/status"
        headers = {"Content-Type": MERGE}
        params = {"fieldManager": "kubelet"}
        async with self.server.patch(
            path, json={"status": status}, headers=headers, params=params
        ) as response:
            if response.status >= 300 and response.status != 404:
                log.warning("pod %s status: %s", handle.name, await response.text())
