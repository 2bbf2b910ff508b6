"""`pagoda download` against a stand-in Hub (kubesim.hub): what it fetches, resumes, verifies."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from kubesim.hub import Hub
from pagoda.runtime.entrypoints.download import quantity_bytes, serve_progress
from pagoda.runtime.model_loader.hub_download import (
    DownloadError,
    HubDownloader,
    ModelRef,
    RepoFile,
    select_files,
)

REPO = "acme/tiny"
WEIGHTS = bytes(range(256)) * 4096  # 1 MiB, an LFS file
FILES = {
    "config.json": b'{"model_type": "llama"}',
    "tokenizer.json": b'{"version": "1.0"}',
    "tokenizer_config.json": b"{}",
    "model.safetensors": WEIGHTS,
    # Duplicates and extras the runtime never reads.
    "pytorch_model.bin": b"pickle" * 1000,
    "model.Q4_K_M.gguf": b"GGUF" * 1000,
    "original/consolidated.00.pth": b"pth" * 1000,
    "README.md": b"# tiny",
}
WANTED = {"config.json", "tokenizer.json", "tokenizer_config.json", "model.safetensors"}
TOKEN = "hf_good"


@pytest.fixture
async def hub(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Hub]:
    """The stand-in Hub, with huggingface_hub let online (the suite runs offline)."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    server = Hub(tokens={TOKEN})
    await server.start()
    yield server
    await server.stop()


def downloader(hub: Hub, cache: Path, model: str = f"hf://{REPO}", **kwargs) -> HubDownloader:
    return HubDownloader(ModelRef.parse(model), cache, endpoint=hub.url, **kwargs)


def offline_snapshot(cache: Path, revision: str = "main") -> Path:
    """What the runtime finds with HF_HUB_OFFLINE=1: huggingface_hub's own lookup."""
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(REPO, revision=revision, cache_dir=cache, local_files_only=True))


async def test_downloads_what_the_runtime_reads_into_the_offline_cache(hub, tmp_path) -> None:
    commit = hub.commit(REPO, FILES)

    snapshot = await asyncio.to_thread(downloader(hub, tmp_path).run)

    assert (
        snapshot
        == offline_snapshot(tmp_path)
        == tmp_path / f"models--acme--tiny/snapshots/{commit}"
    )
    assert {p.name for p in snapshot.iterdir()} == WANTED
    for name in WANTED:
        assert (snapshot / name).read_bytes() == FILES[name]
        assert (snapshot / name).is_symlink()  # into blobs/, as huggingface_hub lays it out
    fetched = {
        r.path.rsplit("/resolve/main/", 1)[-1] for r in hub.requests if "/resolve/" in r.path
    }
    assert all(commit in r.path for r in hub.requests if "/resolve/" in r.path)
    assert not any(name in str(fetched) for name in ("gguf", ".bin", "original", "README"))


async def test_a_revision_is_found_offline_by_its_name(hub, tmp_path) -> None:
    hub.commit(REPO, FILES)
    v2 = hub.commit(REPO, {**FILES, "config.json": b'{"model_type": "llama", "v": 2}'}, branch="v2")

    snapshot = await asyncio.to_thread(downloader(hub, tmp_path, f"hf://{REPO}@v2").run)

    assert snapshot.name == v2 and offline_snapshot(tmp_path, "v2") == snapshot
    assert b'"v": 2' in (snapshot / "config.json").read_bytes()


async def test_files_already_present_are_verified_and_not_fetched_again(hub, tmp_path) -> None:
    hub.commit(REPO, FILES)
    await asyncio.to_thread(downloader(hub, tmp_path).run)
    hub.requests.clear()

    again = downloader(hub, tmp_path)
    await asyncio.to_thread(again.run)

    assert [r.method for r in hub.requests] == ["GET"]  # the model info, nothing else
    assert "/api/models/" in hub.requests[0].path
    assert again.progress().files_done == len(WANTED)


async def test_a_file_verified_before_and_unchanged_is_not_hashed_again(
    hub, tmp_path, monkeypatch
) -> None:
    hub.commit(REPO, FILES)
    await asyncio.to_thread(downloader(hub, tmp_path).run)
    hashed = []
    digest = RepoFile.digest
    monkeypatch.setattr(RepoFile, "digest", lambda f, p: hashed.append(f.path) or digest(f, p))

    await asyncio.to_thread(downloader(hub, tmp_path).run)
    assert hashed == []

    snapshot = offline_snapshot(tmp_path)
    (snapshot / "config.json").resolve().write_bytes(FILES["config.json"])  # touched: rehash
    await asyncio.to_thread(downloader(hub, tmp_path).run)
    assert hashed == ["config.json"]


async def test_a_corrupt_cached_file_is_fetched_again(hub, tmp_path) -> None:
    hub.commit(REPO, FILES)
    snapshot = await asyncio.to_thread(downloader(hub, tmp_path).run)
    blob = (snapshot / "model.safetensors").resolve()
    blob.write_bytes(b"\0" * len(WEIGHTS))  # same size, wrong bytes: bit rot
    hub.requests.clear()

    await asyncio.to_thread(downloader(hub, tmp_path).run)

    assert (snapshot / "model.safetensors").read_bytes() == WEIGHTS
    assert len(hub.downloads("model.safetensors")) == 1
    assert hub.downloads("config.json") == []


async def test_a_download_that_does_not_match_the_hash_is_fetched_again(hub, tmp_path) -> None:
    hub.commit(REPO, FILES)
    hub.corrupt_next("model.safetensors")

    snapshot = await asyncio.to_thread(downloader(hub, tmp_path).run)

    assert (snapshot / "model.safetensors").read_bytes() == WEIGHTS
    assert len(hub.downloads("model.safetensors")) == 2


async def test_a_partial_file_left_by_a_killed_download_is_resumed(hub, tmp_path) -> None:
    hub.commit(REPO, FILES)
    d = downloader(hub, tmp_path)
    plan = await asyncio.to_thread(d.resolve)
    (weights,) = [f for f in plan.files if f.path == "model.safetensors"]
    d.partial(weights).parent.mkdir(parents=True)
    d.partial(weights).write_bytes(WEIGHTS[:300_000])  # what a killed pod left

    snapshot = await asyncio.to_thread(downloader(hub, tmp_path).run)

    assert (snapshot / "model.safetensors").read_bytes() == WEIGHTS
    (get,) = hub.downloads("model.safetensors")
    assert get.range == "bytes=300000-"
    assert not d.partial(weights).exists()


async def test_a_dropped_connection_is_retried_to_a_whole_file(hub, tmp_path) -> None:
    hub.commit(REPO, FILES)
    hub.cut_after("model.safetensors", 200_000)

    snapshot = await asyncio.to_thread(downloader(hub, tmp_path).run)

    assert (snapshot / "model.safetensors").read_bytes() == WEIGHTS
    assert len(hub.downloads("model.safetensors")) == 2


async def test_a_private_repo_needs_the_token(hub, tmp_path) -> None:
    hub.commit(REPO, FILES, private=True)

    snapshot = await asyncio.to_thread(downloader(hub, tmp_path, token=TOKEN).run)

    assert (snapshot / "model.safetensors").read_bytes() == WEIGHTS


async def test_progress_counts_bytes_on_disk_partial_files_included(hub, tmp_path) -> None:
    hub.commit(REPO, FILES)
    d = downloader(hub, tmp_path)
    assert d.progress().phase == "Resolving" and d.progress().bytes_total == 0
    plan = await asyncio.to_thread(d.resolve)
    (weights,) = [f for f in plan.files if f.path == "model.safetensors"]
    d.partial(weights).parent.mkdir(parents=True)
    d.partial(weights).write_bytes(WEIGHTS[:1000])

    assert d.progress().bytes_done == 1000
    assert d.progress().bytes_total == sum(len(FILES[n]) for n in WANTED)

    await asyncio.to_thread(d.run)
    server = serve_progress(d, "127.0.0.1", 0)
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/progress"
        body = await asyncio.to_thread(lambda: json.load(urllib.request.urlopen(url)))
    finally:
        server.shutdown()
        server.server_close()
    assert body["phase"] == "Complete" and body["bytesDone"] == body["bytesTotal"]
    assert body["filesDone"] == body["filesTotal"] == len(WANTED)
    assert body["commit"] == plan.commit


async def test_a_model_larger_than_the_volume_is_refused_before_writing(hub, tmp_path) -> None:
    hub.commit(REPO, FILES)

    with pytest.raises(DownloadError, match="limited to"):
        await asyncio.to_thread(downloader(hub, tmp_path, size_limit=1 << 19).run)
    assert hub.downloads("model.safetensors") == []


def _cli(hub: Hub, tmp_path: Path, *args: str, token: str | None = None):
    # As the init container's env says: the image's offline default is overridden.
    env = {**os.environ, "HF_ENDPOINT": hub.url, "HF_HOME": str(tmp_path / "home")}
    env["HF_HUB_OFFLINE"] = "0"
    if token is not None:
        env["HF_TOKEN"] = token
    log = tmp_path / "termination-log"
    command = [sys.executable, "-m", "pagoda.runtime.entrypoints.cli", "download", *args]
    return log, subprocess.run(
        [*command, "--termination-log", str(log)], env=env, capture_output=True, text=True
    )


async def test_cli_fills_hf_home_and_exits_zero(hub, tmp_path) -> None:
    hub.commit(REPO, FILES, private=True)

    _, done = await asyncio.to_thread(_cli, hub, tmp_path, f"hf://{REPO}", token=TOKEN)

    assert done.returncode == 0, done.stderr
    assert (offline_snapshot(tmp_path / "home" / "hub") / "model.safetensors").exists()


async def test_cli_reports_a_refused_token_as_401(hub, tmp_path) -> None:
    hub.commit(REPO, FILES, private=True)

    log, done = await asyncio.to_thread(_cli, hub, tmp_path, f"hf://{REPO}", token="hf_bad")

    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert "401" in last and "hfTokenSecretRef" in last
    assert log.read_text() in last


async def test_cli_reports_an_unknown_revision_as_404(hub, tmp_path) -> None:
    hub.commit(REPO, FILES)

    log, done = await asyncio.to_thread(_cli, hub, tmp_path, f"hf://{REPO}@no-such-branch")

    assert done.returncode == 1
    assert "revision 'no-such-branch' not found in acme/tiny (404)" in log.read_text()


async def test_cli_reports_an_unknown_repo(hub, tmp_path) -> None:
    log, done = await asyncio.to_thread(_cli, hub, tmp_path, "hf://acme/absent")

    assert done.returncode == 1
    assert "repository not found" in log.read_text()


def _file(path: str) -> RepoFile:
    return RepoFile(path, 1, "e", path.endswith((".safetensors", ".bin")))


def test_safetensors_are_preferred_over_bin_and_only_the_root_is_read() -> None:
    files = [_file(p) for p in ("config.json", "a.safetensors", "b.bin", "sub/c.safetensors")]
    assert [f.path for f in select_files(files)] == ["config.json", "a.safetensors"]


def test_bin_weights_are_fetched_when_there_are_no_safetensors() -> None:
    files = [_file(p) for p in ("config.json", "pytorch_model.bin", "training_args.bin")]
    assert [f.path for f in select_files(files)] == ["config.json", "pytorch_model.bin"]


def test_patterns_replace_the_default_choice() -> None:
    files = [_file(p) for p in ("config.json", "a.safetensors", "sub/c.safetensors")]
    assert [f.path for f in select_files(files, ["sub/*"])] == ["sub/c.safetensors"]


@pytest.mark.parametrize(
    ("text", "repo", "revision"),
    [
        ("hf://org/m", "org/m", "main"),
        ("hf://org/m@v1.0", "org/m", "v1.0"),
        ("org/m@abc", "org/m", "abc"),
    ],
)
def test_model_refs_parse(text: str, repo: str, revision: str) -> None:
    assert ModelRef.parse(text) == ModelRef(repo, revision)


@pytest.mark.parametrize("text", ["hf://org", "hf://org/m/sub", "hf:///m"])
def test_bad_model_refs_are_refused(text: str) -> None:
    with pytest.raises(DownloadError):
        ModelRef.parse(text)


def test_size_limits_read_as_kubernetes_quantities() -> None:
    assert quantity_bytes("40Gi") == 40 << 30
    assert quantity_bytes("500M") == 500_000_000
    assert quantity_bytes("1024") == 1024


async def test_two_pods_on_one_claim_download_each_file_once(hub, tmp_path) -> None:
    hub.commit(REPO, FILES)

    first, second = await asyncio.gather(
        asyncio.to_thread(downloader(hub, tmp_path).run),
        asyncio.to_thread(downloader(hub, tmp_path).run),
    )

    assert first == second
    assert (first / "model.safetensors").read_bytes() == WEIGHTS
    for name in WANTED:
        assert len(hub.downloads(name)) == 1, name
