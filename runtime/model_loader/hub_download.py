"""Download a Hugging Face Hub model into the local cache, for a later offline start.

`pagoda download hf://org/repo[@revision]` runs before `pagoda serve` (an init
container on Kubernetes, KServe's storage initializer's job): it fills the
standard cache layout under HF_HOME (`hub/models--org--repo/{blobs,snapshots,
refs}`), so the runtime then finds the model with HF_HUB_OFFLINE=1 exactly as
`huggingface_hub.snapshot_download(local_files_only=True)` would.

What it adds to a plain `snapshot_download`:

* Only what the runtime reads: config, tokenizer and generation files and one
  weight format (safetensors, else PyTorch .bin), at the repo's root; never
  the GGUF, ONNX or `original/` duplicates many repos carry.
* Resumable across restarts: a file is written to `blobs/<etag>.incomplete`,
  a name stable across runs, and the next run asks the Hub for the rest
  (an HTTP Range), so a pod evicted at 90% of 100 GiB keeps its 90%.
  (`huggingface_hub` itself writes a per-process temporary file it deletes
  on failure, so its downloads restart from zero.) Pods sharing a claim take
  turns per file under huggingface_hub's own lock file (`.locks/`): the
  second finds the file done; where a filesystem ignores the lock, the hash
  check catches the mixed result and the file is fetched again.
* Verified: each file's content is hashed against what the Hub lists (the
  LFS sha256, or the git blob id of a small file) before it enters the cache,
  and a file already in the cache is hashed again before it is trusted unless
  it is unchanged (size, mtime, inode) since this command last verified it
  (a stamp in `.pagoda-verified/`: pods sharing a claim do not re-read 100 GiB
  at every start); a corrupt one is fetched again.
* Observable: `progress()` reports bytes on disk against the total at any
  moment, read from the files themselves, so it covers resumed files too.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import os
import shutil
import threading
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from fnmatch import fnmatch
from pathlib import Path

logger = logging.getLogger(__name__)

# What the runtime reads from a model folder besides the weights.
CONFIG_PATTERNS = (
    "*.json",  # config, generation_config, tokenizer(_config), weight indexes
    "tokenizer.model",  # sentencepiece
    "*.tiktoken",
    "*.txt",  # merges.txt, vocab.txt
    "*.jinja",  # chat templates kept outside tokenizer_config.json
)
# One weight format, the first the repo has (the runtime's own preference).
WEIGHT_PATTERNS = (("*.safetensors",), ("*.bin",))
# Never weights: training artefacts that share the .bin suffix.
EXCLUDED = ("training_args.bin", "optimizer.bin", "scheduler.bin", "rng_state*.bin")
HASH_CHUNK = 8 << 20


class DownloadError(Exception):
    """The download cannot succeed as asked; the message says why, for a person."""


@dataclass(frozen=True, slots=True)
class ModelRef:
    """`hf://org/repo[@revision]`."""

    repo_id: str
    revision: str = "main"

    @classmethod
    def parse(cls, text: str) -> ModelRef:
        """Read `hf://org/repo[@revision]` (the `hf://` prefix is optional)."""
        body = text.removeprefix("hf://")
        repo_id, _, revision = body.partition("@")
        org, _, name = repo_id.partition("/")
        if not org or not name or "/" in name:
            raise DownloadError(f"{text!r} is not hf://org/repo[@revision]")
        return cls(repo_id, revision or "main")


@dataclass(frozen=True, slots=True)
class RepoFile:
    """One file of the repo at a commit, as the Hub lists it."""

    path: str
    size: int
    # The cache's blob name: the LFS sha256, else the git blob id.
    etag: str
    lfs: bool

    def digest(self, path: Path) -> str:
        """The hash of `path` that must equal `etag` (sha256 for LFS, a git blob id otherwise)."""
        if self.lfs:
            h = hashlib.sha256()
        else:
            # Git hashes "blob <size>\0" + content with SHA-1.
            h = hashlib.sha1(f"blob {path.stat().st_size}\0".encode())
        with path.open("rb") as f:
            while chunk := f.read(HASH_CHUNK):
                h.update(chunk)
        return h.hexdigest()


@dataclass(frozen=True, slots=True)
class Plan:
    """What to download: the files of one commit."""

    model: ModelRef
    commit: str
    files: tuple[RepoFile, ...]

    @property
    def total_bytes(self) -> int:
        """The size of every planned file together."""
        return sum(f.size for f in self.files)


def select_files(
    files: Iterable[RepoFile], patterns: Iterable[str] | None = None
) -> list[RepoFile]:
    """The files the runtime needs: root-level config and tokenizer files and one weight format.

    `patterns` (fnmatch, against the path in the repo) replaces the default choice.
    """
    files = list(files)
    if patterns is not None:
        patterns = tuple(patterns)
        return [f for f in files if any(fnmatch(f.path, p) for p in patterns)]
    root = [f for f in files if "/" not in f.path and not any(fnmatch(f.path, e) for e in EXCLUDED)]
    chosen = [f for f in root if any(fnmatch(f.path, p) for p in CONFIG_PATTERNS)]
    for weights in WEIGHT_PATTERNS:
        found = [f for f in root if any(fnmatch(f.path, p) for p in weights)]
        if found:
            chosen += found
            break
    return chosen


def repo_files(siblings: Iterable[object]) -> list[RepoFile]:
    """`RepoFile`s from `HfApi.model_info(..., files_metadata=True).siblings`."""
    out = []
    for s in siblings:
        lfs = getattr(s, "lfs", None)
        etag = lfs.sha256 if lfs is not None else getattr(s, "blob_id", None)
        size = lfs.size if lfs is not None else getattr(s, "size", None)
        if etag is None or size is None:
            raise DownloadError(f"the Hub listed {s.rfilename} without its hash or size")
        out.append(RepoFile(s.rfilename, int(size), etag, lfs is not None))
    return out


@dataclass(slots=True)
class Progress:
    """A snapshot of a download, as `GET /progress` serves it."""

    phase: str  # Resolving, Downloading, Verifying, Complete, Failed
    model: str
    revision: str
    commit: str | None = None
    bytes_total: int = 0
    bytes_done: int = 0
    files_total: int = 0
    files_done: int = 0
    message: str = ""

    def to_json(self) -> dict[str, object]:
        """camelCase, as the operator reads it."""
        return {
            "phase": self.phase,
            "model": self.model,
            "revision": self.revision,
            "commit": self.commit,
            "bytesTotal": self.bytes_total,
            "bytesDone": self.bytes_done,
            "filesTotal": self.files_total,
            "filesDone": self.files_done,
            "message": self.message,
        }


@dataclass
class HubDownloader:
    """Downloads one model into a Hugging Face cache (the `hub` folder under HF_HOME).

    `endpoint` and `token` default to huggingface_hub's own (HF_ENDPOINT,
    HF_TOKEN). `size_limit` (bytes) refuses a model larger than the volume it
    is written to before anything is written (an emptyDir's sizeLimit is
    enforced by eviction, not by a full disk).
    """

    model: ModelRef
    cache_dir: Path
    endpoint: str | None = None
    token: str | None = None
    patterns: tuple[str, ...] | None = None
    max_workers: int = 8
    size_limit: int | None = None
    _plan: Plan | None = field(default=None, init=False)
    _phase: str = field(default="Resolving", init=False)
    _message: str = field(default="", init=False)
    _done: set[str] = field(default_factory=set, init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False)

    # ------------------------------------------------------------ layout
    @property
    def storage(self) -> Path:
        """The repo's folder in the cache: models--org--name."""
        return self.cache_dir / ("models--" + self.model.repo_id.replace("/", "--"))

    def blob(self, f: RepoFile) -> Path:
        return self.storage / "blobs" / f.etag

    def partial(self, f: RepoFile) -> Path:
        return self.storage / "blobs" / (f.etag + ".incomplete")

    def pointer(self, commit: str, f: RepoFile) -> Path:
        return self.storage / "snapshots" / commit / f.path

    def stamp(self, f: RepoFile) -> Path:
        """Where the blob's fingerprint is kept once its hash was checked."""
        return self.storage / ".pagoda-verified" / f.etag

    def _verified(self, f: RepoFile) -> bool:
        """The blob is the file this command last hashed and found right."""
        with contextlib.suppress(OSError):
            return self.stamp(f).read_text() == _fingerprint(self.blob(f))
        return False

    def _intact(self, f: RepoFile) -> bool:
        """The blob is cached with the content the Hub lists."""
        blob = self.blob(f)
        if not blob.is_file():
            return False
        return self._verified(f) or (blob.stat().st_size == f.size and f.digest(blob) == f.etag)

    def _mark_verified(self, f: RepoFile) -> None:
        stamp = self.stamp(f)
        stamp.parent.mkdir(parents=True, exist_ok=True)
        stamp.write_text(_fingerprint(self.blob(f)))

    # ---------------------------------------------------------- progress
    def progress(self) -> Progress:
        """How far the download is, measured on disk (safe to call from any thread)."""
        with self._lock:
            plan, phase, message, done = self._plan, self._phase, self._message, len(self._done)
        out = Progress(phase, self.model.repo_id, self.model.revision, message=message)
        if plan is None:
            return out
        out.commit, out.bytes_total = plan.commit, plan.total_bytes
        out.files_total, out.files_done = len(plan.files), done
        out.bytes_done = sum(self._bytes_on_disk(f) for f in plan.files)
        return out

    def _bytes_on_disk(self, f: RepoFile) -> int:
        for path in (self.blob(f), self.partial(f)):
            with contextlib.suppress(OSError):
                return min(f.size, path.stat().st_size)
        return 0

    def _set_phase(self, phase: str, message: str = "") -> None:
        with self._lock:
            self._phase, self._message = phase, message

    # -------------------------------------------------------------- plan
    def resolve(self) -> Plan:
        """Ask the Hub for the revision's commit and files (one API call)."""
        from huggingface_hub import HfApi

        api = HfApi(endpoint=self.endpoint, token=self.token)
        info = api.model_info(self.model.repo_id, revision=self.model.revision, files_metadata=True)
        files = select_files(repo_files(info.siblings or []), self.patterns)
        if not files:
            raise DownloadError(
                f"{self.model.repo_id}@{self.model.revision} has no files the runtime can "
                "read (config.json and *.safetensors or *.bin at the repo's root)"
            )
        if not any(f.path == "config.json" for f in files) and self.patterns is None:
            raise DownloadError(
                f"{self.model.repo_id}@{self.model.revision} has no config.json at its root: "
                "not a transformers model folder"
            )
        plan = Plan(self.model, info.sha, tuple(files))
        with self._lock:
            self._plan = plan
        return plan

    # --------------------------------------------------------------- run
    def run(self) -> Path:
        """Resolve, check space, download what is missing, verify; the snapshot folder."""
        try:
            plan = self.resolve()
            self._set_phase("Verifying")
            present = self._verify_present(plan)
            self._check_space(plan, present)
            self._set_phase("Downloading")
            self._fetch_all(plan, present)
            self._write_ref(plan)
        except BaseException as e:
            self._set_phase("Failed", str(e))
            raise
        self._set_phase("Complete")
        return self.storage / "snapshots" / plan.commit

    def _verify_present(self, plan: Plan) -> set[str]:
        """Paths whose blob is already cached with the right hash (each is linked)."""

        def check(f: RepoFile) -> bool:
            if not self._intact(f):
                return False  # fetched (and a corrupt copy removed) under the file's lock
            self._mark_verified(f)
            self._link(plan.commit, f)
            return True

        with ThreadPoolExecutor(self.max_workers) as pool:
            ok = dict(zip(plan.files, pool.map(check, plan.files), strict=True))
        present = {f.path for f, good in ok.items() if good}
        with self._lock:
            self._done |= present
        return present

    def _check_space(self, plan: Plan, present: set[str]) -> None:
        if self.size_limit is not None and plan.total_bytes > self.size_limit:
            raise DownloadError(
                f"{self.model.repo_id} needs {gib(plan.total_bytes)} but the cache volume is "
                f"limited to {gib(self.size_limit)}: raise modelCache.sizeLimit"
            )
        missing = sum(f.size - self._bytes_on_disk(f) for f in plan.files if f.path not in present)
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        free = shutil.disk_usage(self.cache_dir).free
        if missing > free:
            raise DownloadError(
                f"disk full: {self.model.repo_id} needs {gib(missing)} more but only "
                f"{gib(free)} is free in {self.cache_dir}"
            )

    def _fetch_all(self, plan: Plan, present: set[str]) -> None:
        todo = [f for f in plan.files if f.path not in present]
        # Small files first: config and tokenizer errors show before the long part.
        todo.sort(key=lambda f: f.size)
        with ThreadPoolExecutor(self.max_workers) as pool:
            for f in pool.map(lambda f: self._fetch(plan.commit, f), todo):
                with self._lock:
                    self._done.add(f.path)

    def lock(self, f: RepoFile) -> Path:
        """huggingface_hub's lock file for this blob (so its own downloads take turns too)."""
        return self.cache_dir / ".locks" / self.storage.name / f"{f.etag}.lock"

    def _fetch(self, commit: str, f: RepoFile) -> RepoFile:
        """One file, under its lock: another process may have finished it meanwhile."""
        from filelock import FileLock

        self.lock(f).parent.mkdir(parents=True, exist_ok=True)
        with FileLock(self.lock(f)):
            if self._intact(f):
                self._mark_verified(f)
                self._link(commit, f)
                return f
            if self.blob(f).exists():
                logger.warning("%s: the cached copy is corrupt; fetching it again", f.path)
                self.blob(f).unlink()
                self.pointer(commit, f).unlink(missing_ok=True)
            return self._fetch_locked(commit, f)

    def _fetch_locked(self, commit: str, f: RepoFile) -> RepoFile:
        """Resume the file's partial download, verify it, move it into the cache."""
        for attempt in (1, 2):
            partial = self.partial(f)
            partial.parent.mkdir(parents=True, exist_ok=True)
            self._download(commit, f, partial)
            digest = f.digest(partial)
            if digest == f.etag:
                os.replace(partial, self.blob(f))
                self._mark_verified(f)
                self._link(commit, f)
                return f
            partial.unlink()
            logger.warning(
                "%s: hash %s, expected %s (attempt %d); downloading it again",
                f.path,
                digest,
                f.etag,
                attempt,
            )
        raise DownloadError(f"{f.path}: the downloaded content does not match the Hub's hash twice")

    def _download(self, commit: str, f: RepoFile, partial: Path) -> None:
        from huggingface_hub import hf_hub_url
        from huggingface_hub.file_download import http_get
        from huggingface_hub.utils import build_hf_headers

        have = partial.stat().st_size if partial.exists() else 0
        if have > f.size:
            have = 0  # not a prefix of this file: start again
        if have:
            logger.info("%s: resuming at %s of %s", f.path, gib(have), gib(f.size))
        url = hf_hub_url(self.model.repo_id, f.path, revision=commit, endpoint=self.endpoint)
        headers = build_hf_headers(token=self.token if self.token is not None else None)
        headers["Accept-Encoding"] = "identity"  # the byte count must be the file's
        with partial.open("r+b" if have else "wb") as out:
            out.truncate(have)
            out.seek(have)
            try:
                http_get(url, out, resume_size=have, headers=headers, expected_size=f.size)
            except OSError as e:
                if e.errno == errno.ENOSPC:
                    raise DownloadError(
                        f"disk full while writing {f.path} into {self.cache_dir}"
                    ) from e
                raise

    def _link(self, commit: str, f: RepoFile) -> None:
        """snapshots/<commit>/<path> -> ../../blobs/<etag>, relative, as huggingface_hub links."""
        pointer = self.pointer(commit, f)
        pointer.parent.mkdir(parents=True, exist_ok=True)
        target = os.path.relpath(self.blob(f), pointer.parent)
        if pointer.is_symlink() and os.readlink(pointer) == target:
            return
        # Made aside and renamed in: another pod on the claim may link it at the same time.
        aside = pointer.with_name(f".{pointer.name}.{os.getpid()}.{threading.get_ident()}")
        aside.unlink(missing_ok=True)
        os.symlink(target, aside)
        os.replace(aside, pointer)

    def _write_ref(self, plan: Plan) -> None:
        """refs/<revision> names the commit, so an offline lookup by revision finds it."""
        if plan.commit == self.model.revision:
            return
        ref = self.storage / "refs" / self.model.revision
        ref.parent.mkdir(parents=True, exist_ok=True)
        tmp = ref.with_name(ref.name + ".tmp")
        tmp.write_text(plan.commit)
        os.replace(tmp, ref)


def _fingerprint(path: Path) -> str:
    st = path.stat()
    return f"{st.st_size} {st.st_mtime_ns} {st.st_ino}"


def gib(n: int) -> str:
    """Bytes as GiB with one decimal (MiB below one GiB), as the status shows them."""
    if n < 1 << 30:
        return f"{n / (1 << 20):.1f} MiB"
    return f"{n / (1 << 30):.1f} GiB"


def describe_hub_error(error: BaseException, model: ModelRef) -> str | None:
    """A one-line reason for a Hub error a person must fix (bad token, no such repo)."""
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    name = f"{model.repo_id}@{model.revision}"
    if isinstance(error, RevisionNotFoundError):
        return f"revision {model.revision!r} not found in {model.repo_id} (404)"
    if isinstance(error, GatedRepoError):
        return f"{model.repo_id} is gated: the token's account must accept its terms (403)"
    if isinstance(error, RepositoryNotFoundError):
        return (
            f"{name}: repository not found, or private and the token (HF_TOKEN, from "
            f"hfTokenSecretRef) cannot read it ({_status(error)})"
        )
    if isinstance(error, HfHubHTTPError):
        status = _status(error)
        if status == 401:
            return f"{name}: the Hub refused the token (401): check hfTokenSecretRef"
        if status == 403:
            return f"{name}: the token may not read this repository (403)"
        return f"{name}: the Hub answered {status}: {str(error).splitlines()[0]}"
    return None


def _status(error: BaseException) -> int | None:
    response = getattr(error, "response", None)
    return getattr(response, "status_code", None)
