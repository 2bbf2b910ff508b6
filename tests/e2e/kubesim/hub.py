"""A stand-in for the Hugging Face Hub's HTTP API, for `pagoda download` and its init container.

Serves the routes `huggingface_hub` calls to download a model, with the
headers it reads, from repos held in memory:

* `GET /api/models/{org}/{name}[/revision/{rev}]`: the model info, with
  `siblings` (size, git blob id, LFS sha256) when `?blobs=true`;
* `GET /api/models/{org}/{name}/tree/{rev}`: the file list (snapshot_download);
* `HEAD|GET /{org}/{name}/resolve/{rev}/{path}`: a file, with `ETag` (the
  git blob id), `X-Repo-Commit`, `Content-Length`, and `Range: bytes=N-`
  answered with 206 and `Content-Range`. An LFS file is a 302 to the "CDN"
  (`/cdn/{sha256}`, no token needed) with `X-Linked-Etag` (its sha256) and
  `X-Linked-Size`, as the Hub sends its large files to its CDN.

Errors are the Hub's: a token that is not one of `tokens` gets 401 "Invalid
credentials in Authorization header"; a private repo without a valid token,
or a missing one, 401/404 with `X-Error-Code: RepoNotFound`; an unknown
revision 404 `RevisionNotFound`; an unknown file 404 `EntryNotFound`.

Faults for tests: `cut_after(path, n)` ends the next download of a file after
n bytes (a dropped connection), `corrupt_next(path)` serves wrong bytes of
the right length once. `requests` records every request (method, path,
Range header) so a test can see what was fetched, and from where.

Point `HF_ENDPOINT` at `url`.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from fnmatch import fnmatch
from pathlib import Path
from urllib.parse import unquote

from aiohttp import web

LFS_PATTERNS = ("*.safetensors", "*.bin", "*.pt", "*.pth", "*.gguf", "*.model")
LFS_THRESHOLD = 10 << 20


@dataclass(frozen=True, slots=True)
class HubFile:
    """One file of a commit."""

    content: bytes
    lfs: bool

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.content).hexdigest()

    @property
    def git_blob(self) -> bytes:
        """What git stores: the content, or for an LFS file its pointer."""
        if not self.lfs:
            return self.content
        return (
            f"version https://git-lfs.github.com/spec/v1\noid sha256:{self.sha256}\n"
            f"size {len(self.content)}\n"
        ).encode()

    @property
    def blob_id(self) -> str:
        blob = self.git_blob
        return hashlib.sha1(b"blob %d\0" % len(blob) + blob).hexdigest()

    @property
    def etag(self) -> str:
        return self.sha256 if self.lfs else self.blob_id


@dataclass
class HubRepo:
    """A model repo: commits (sha -> files) and branches (name -> sha)."""

    private: bool = False
    commits: dict[str, dict[str, HubFile]] = field(default_factory=dict)
    branches: dict[str, str] = field(default_factory=dict)

    def resolve(self, revision: str) -> str | None:
        if revision in self.branches:
            return self.branches[revision]
        return revision if revision in self.commits else None


@dataclass(frozen=True, slots=True)
class Request:
    """One request the hub answered."""

    method: str
    path: str
    range: str | None


class Hub:
    """The stand-in Hub; `await start()`, then use `url` as HF_ENDPOINT."""

    def __init__(self, tokens: set[str] | None = None) -> None:
        self.tokens = set(tokens or ())
        self.repos: dict[str, HubRepo] = {}
        self.requests: list[Request] = []
        self._cuts: dict[str, int] = {}
        self._corrupt: set[str] = set()
        # sha256 -> (path, file) of the LFS files a resolve sent to the CDN.
        self._cdn_files: dict[str, tuple[str, HubFile]] = {}
        self._runner: web.AppRunner | None = None
        self.url = ""

    # -------------------------------------------------------------- repos
    def commit(
        self,
        repo_id: str,
        files: dict[str, bytes],
        branch: str = "main",
        private: bool = False,
    ) -> str:
        """Commit `files` (the whole tree) to `branch`; returns the commit sha."""
        repo = self.repos.setdefault(repo_id, HubRepo(private=private))
        repo.private = private
        tree = {
            path: HubFile(
                data, any(fnmatch(path, p) for p in LFS_PATTERNS) or len(data) > LFS_THRESHOLD
            )
            for path, data in files.items()
        }
        listing = json.dumps(sorted((p, f.etag) for p, f in tree.items())) + str(len(repo.commits))
        sha = hashlib.sha1(listing.encode()).hexdigest()
        repo.commits[sha] = tree
        repo.branches[branch] = sha
        return sha

    def commit_folder(self, repo_id: str, folder: Path, **kwargs) -> str:
        """Commit every file under `folder` (a saved checkpoint) to the repo."""
        files = {
            str(p.relative_to(folder)): p.read_bytes()
            for p in sorted(folder.rglob("*"))
            if p.is_file()
        }
        return self.commit(repo_id, files, **kwargs)

    def cut_after(self, path: str, n: int) -> None:
        """The next GET of `path` sends n bytes, then drops the connection."""
        self._cuts[path] = n

    def corrupt_next(self, path: str) -> None:
        """The next GET of `path` sends bytes of the right length but the wrong content."""
        self._corrupt.add(path)

    def downloads(self, path: str) -> list[Request]:
        """The GETs that sent one file's content (from the repo, or the CDN for an LFS file)."""
        cdn = {f"/cdn/{sha}" for sha, (p, _) in self._cdn_files.items() if p == path}
        return [
            r
            for r in self.requests
            if r.method == "GET" and (r.path in cdn or (r.path.endswith("/" + path) and not cdn))
        ]

    # ------------------------------------------------------------- server
    async def start(self, host: str = "127.0.0.1") -> str:
        app = web.Application()
        app.router.add_get("/api/models/{org}/{name}", self._info)
        app.router.add_get("/api/models/{org}/{name}/revision/{revision}", self._info)
        app.router.add_get("/api/models/{org}/{name}/tree/{revision}", self._tree)
        app.router.add_route("*", "/{org}/{name}/resolve/{revision}/{path:.+}", self._resolve)
        app.router.add_route("*", "/cdn/{sha256}", self._cdn)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://{host}:{port}"
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # ------------------------------------------------------------- routes
    def _authorize(self, request: web.Request, repo_id: str) -> HubRepo:
        self.requests.append(Request(request.method, request.path, request.headers.get("Range")))
        auth = request.headers.get("Authorization", "")
        token = auth.removeprefix("Bearer ").strip() if auth.startswith("Bearer ") else None
        if token is not None and token not in self.tokens:
            raise _error(401, "Invalid credentials in Authorization header")
        repo = self.repos.get(repo_id)
        if repo is None or (repo.private and token is None):
            raise _error(401 if token is None else 404, "Repository not found", "RepoNotFound")
        return repo

    def _commit(self, repo: HubRepo, revision: str) -> tuple[str, dict[str, HubFile]]:
        sha = repo.resolve(unquote(revision))
        if sha is None:
            raise _error(404, f"Invalid rev id: {revision}", "RevisionNotFound")
        return sha, repo.commits[sha]

    async def _info(self, request: web.Request) -> web.Response:
        repo_id = f"{request.match_info['org']}/{request.match_info['name']}"
        repo = self._authorize(request, repo_id)
        sha, tree = self._commit(repo, request.match_info.get("revision", "main"))
        siblings: list[dict[str, object]] = []
        for path, f in sorted(tree.items()):
            entry: dict[str, object] = {"rfilename": path}
            if request.query.get("blobs") in ("true", "True", "1"):
                entry["size"] = len(f.content)
                entry["blobId"] = f.blob_id
                if f.lfs:
                    entry["lfs"] = {
                        "size": len(f.content),
                        "sha256": f.sha256,
                        "pointerSize": len(f.git_blob),
                    }
            siblings.append(entry)
        body = {
            "_id": repo_id,
            "id": repo_id,
            "modelId": repo_id,
            "sha": sha,
            "private": repo.private,
            "gated": False,
            "disabled": False,
            "tags": [],
            "siblings": siblings,
        }
        return web.json_response(body)

    async def _tree(self, request: web.Request) -> web.Response:
        repo_id = f"{request.match_info['org']}/{request.match_info['name']}"
        repo = self._authorize(request, repo_id)
        _, tree = self._commit(repo, request.match_info["revision"])
        entries = []
        for path, f in sorted(tree.items()):
            entry: dict[str, object] = {
                "type": "file",
                "path": path,
                "size": len(f.content),
                "oid": f.blob_id,
            }
            if f.lfs:
                entry["lfs"] = {
                    "size": len(f.content),
                    "oid": f.sha256,
                    "pointerSize": len(f.git_blob),
                }
            entries.append(entry)
        return web.json_response(entries)

    async def _resolve(self, request: web.Request) -> web.StreamResponse:
        repo_id = f"{request.match_info['org']}/{request.match_info['name']}"
        repo = self._authorize(request, repo_id)
        sha, tree = self._commit(repo, request.match_info["revision"])
        path = request.match_info["path"]
        f = tree.get(path)
        if f is None:
            raise _error(404, f"Entry not found: {path}", "EntryNotFound")
        if f.lfs:
            self._cdn_files[f.sha256] = (path, f)
            headers = {
                "Location": f"/cdn/{f.sha256}",
                "X-Repo-Commit": sha,
                "X-Linked-Etag": f'"{f.sha256}"',
                "X-Linked-Size": str(len(f.content)),
                "ETag": f'"{f.blob_id}"',
            }
            return web.Response(status=302, headers=headers)
        return await self._send(request, path, f, {"ETag": f'"{f.etag}"', "X-Repo-Commit": sha})

    async def _cdn(self, request: web.Request) -> web.StreamResponse:
        self.requests.append(Request(request.method, request.path, request.headers.get("Range")))
        found = self._cdn_files.get(request.match_info["sha256"])
        if found is None:
            raise web.HTTPForbidden()
        path, f = found
        return await self._send(request, path, f, {"ETag": f'"{f.sha256}"'})

    async def _send(
        self, request: web.Request, path: str, f: HubFile, extra: dict[str, str]
    ) -> web.StreamResponse:
        """The bytes of a file, a Range of them, or the headers alone (HEAD); faults applied."""
        headers = {
            **extra,
            "Accept-Ranges": "bytes",
            "Content-Type": "application/octet-stream",
        }
        start = _range_start(request.headers.get("Range"), len(f.content))
        status = 206 if start else 200
        if start:
            headers["Content-Range"] = f"bytes {start}-{len(f.content) - 1}/{len(f.content)}"
        body = f.content[start:]
        headers["Content-Length"] = str(len(body))
        if request.method == "HEAD":
            return web.Response(status=status, headers=headers)
        if path in self._corrupt:
            self._corrupt.discard(path)
            body = bytes(b ^ 0xFF for b in body)
        response = web.StreamResponse(status=status, headers=headers)
        await response.prepare(request)
        cut = self._cuts.pop(path, None)
        if cut is not None:
            await response.write(body[:cut])
            assert request.transport is not None
            request.transport.close()  # a dropped connection, mid-body
            return response
        await response.write(body)
        await response.write_eof()
        return response


def _range_start(header: str | None, size: int) -> int:
    if not header or not header.startswith("bytes="):
        return 0
    first = header.removeprefix("bytes=").split("-", 1)[0]
    start = int(first) if first else 0
    if start >= size:
        raise web.HTTPRequestRangeNotSatisfiable(headers={"Content-Range": f"bytes */{size}"})
    return start


def _error(status: int, message: str, code: str | None = None) -> web.HTTPException:
    headers = {"X-Error-Message": message, "Content-Type": "application/json"}
    if code:
        headers["X-Error-Code"] = code
    cls = {401: web.HTTPUnauthorized, 403: web.HTTPForbidden, 404: web.HTTPNotFound}[status]
    return cls(headers=headers, text=json.dumps({"error": message}))
