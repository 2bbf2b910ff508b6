"""`pagoda download`: fill the Hugging Face cache with a model before `pagoda serve`.

Run as the runtime pod's init container. While it downloads it serves
`GET /progress` (JSON, `Progress.to_json`) on the pod's port, which the main
container does not use yet: the operator reads it as it reads /metrics (the
pod has no Kubernetes credentials to report anything itself). It logs a
progress line every `--log-interval` seconds for `kubectl logs`.

A failure a person must fix (a refused token, an unknown repo or revision, a
full disk) ends it with exit status 1 and one line on stderr, also written to
the termination-message file, so the pod's status (and from there the
LLMService's ModelReady condition) says why.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import re
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from pagoda.runtime.model_loader.hub_download import (
    DownloadError,
    HubDownloader,
    ModelRef,
    describe_hub_error,
    gib,
)

logger = logging.getLogger("pagoda.download")
TERMINATION_LOG = "/dev/termination-log"
_UNITS = {
    "": 1,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
}


def quantity_bytes(text: str) -> int:
    """A Kubernetes byte quantity ("40Gi", "500M", "1073741824") in bytes."""
    match = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?)([kMGTP]i?)?", text.strip())
    if match is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not a byte quantity such as 40Gi")
    return int(float(match.group(1)) * _UNITS[match.group(2) or ""])


def default_cache_dir() -> Path:
    """huggingface_hub's cache folder: HF_HUB_CACHE, else HF_HOME/hub, else ~/.cache."""
    if "HF_HUB_CACHE" in os.environ:
        return Path(os.environ["HF_HUB_CACHE"])
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "huggingface"
    )
    return Path(home) / "hub"


def add_download_args(p: argparse.ArgumentParser) -> None:
    """The flags of `pagoda download`."""
    p.add_argument("model", help="hf://org/repo[@revision] (the revision defaults to main)")
    p.add_argument("--revision", default=None, help="branch, tag or commit (instead of @revision)")
    p.add_argument(
        "--cache-dir",
        type=Path,
        default=None,
        help="the Hugging Face hub cache (default: $HF_HUB_CACHE, else $HF_HOME/hub)",
    )
    p.add_argument(
        "--include",
        action="append",
        default=None,
        metavar="PATTERN",
        help="download the files matching these fnmatch patterns instead of what the "
        "runtime reads (config, tokenizer, one weight format); repeatable",
    )
    p.add_argument("--max-workers", type=int, default=8, help="files downloaded at once")
    p.add_argument(
        "--size-limit",
        type=quantity_bytes,
        default=None,
        help="refuse a model larger than this (the cache volume's size, e.g. 40Gi)",
    )
    p.add_argument("--host", default="0.0.0.0", help="address of the progress endpoint")
    p.add_argument(
        "--port", type=int, default=None, help="serve GET /progress on this port while running"
    )
    p.add_argument("--log-interval", type=float, default=10.0, help="seconds between log lines")
    p.add_argument(
        "--termination-log",
        default=None,
        help="where a failure's reason is written for the pod's status (default: "
        f"{TERMINATION_LOG}, where the kubelet provides it)",
    )


class _ProgressHandler(BaseHTTPRequestHandler):
    downloader: HubDownloader

    def do_GET(self) -> None:
        if self.path.split("?")[0] != "/progress":
            self.send_error(404)
            return
        body = json.dumps(self.downloader.progress().to_json()).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass  # one line per scrape would drown the progress lines


def serve_progress(downloader: HubDownloader, host: str, port: int) -> ThreadingHTTPServer:
    """Serve `GET /progress` from a daemon thread; the caller shuts it down."""
    handler = type("ProgressHandler", (_ProgressHandler,), {"downloader": downloader})
    server = ThreadingHTTPServer((host, port), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="progress", daemon=True).start()
    return server


def progress_line(downloader: HubDownloader) -> str:
    """One log line: phase, bytes, files."""
    p = downloader.progress()
    if not p.bytes_total:
        return f"{p.phase} {p.model}@{p.revision}"
    percent = 100 * p.bytes_done // p.bytes_total
    return (
        f"{p.phase} {p.model}@{p.revision}: {gib(p.bytes_done)} of {gib(p.bytes_total)} "
        f"({percent}%), {p.files_done} of {p.files_total} files"
    )


def _log_progress(downloader: HubDownloader, interval: float, stop: threading.Event) -> None:
    while not stop.wait(interval):
        logger.info(progress_line(downloader))


def _fail(message: str, termination_log: str | None) -> int:
    # The last line of the log: with FallbackToLogsOnError it is the pod's message too.
    print(f"pagoda download: error: {message}", file=sys.stderr, flush=True)
    if termination_log is None and os.path.exists(TERMINATION_LOG):
        termination_log = TERMINATION_LOG  # in a pod: the kubelet reads it first
    if termination_log is not None:
        with contextlib.suppress(OSError):
            Path(termination_log).write_text(message)
    return 1


def run_download(ns: argparse.Namespace) -> int:
    """`pagoda download`: 0 when the cache holds the model, 1 with a reason otherwise."""
    try:
        model = ModelRef.parse(ns.model)
    except DownloadError as e:
        return _fail(str(e), ns.termination_log)
    if ns.revision:
        model = ModelRef(model.repo_id, ns.revision)
    from huggingface_hub import constants
    from huggingface_hub.utils import disable_progress_bars

    if constants.HF_HUB_OFFLINE:
        return _fail("HF_HUB_OFFLINE is set: a download needs the Hub", ns.termination_log)
    disable_progress_bars()  # tqdm bars in a container log are noise; progress_line says it
    downloader = HubDownloader(
        model,
        cache_dir=ns.cache_dir or default_cache_dir(),
        patterns=tuple(ns.include) if ns.include else None,
        max_workers=ns.max_workers,
        size_limit=ns.size_limit,
    )
    server = serve_progress(downloader, ns.host, ns.port) if ns.port is not None else None
    stop = threading.Event()
    threading.Thread(
        target=_log_progress, args=(downloader, ns.log_interval, stop), daemon=True
    ).start()
    try:
        snapshot = downloader.run()
    except DownloadError as e:
        return _fail(str(e), ns.termination_log)
    except Exception as e:
        reason = describe_hub_error(e, model)
        if reason is None:
            if isinstance(e, OSError) and e.errno is not None:
                reason = f"{type(e).__name__}: {e}"
            else:
                logger.exception("download failed")
                reason = f"{model.repo_id}@{model.revision}: {type(e).__name__}: {e}"
        return _fail(reason, ns.termination_log)
    finally:
        stop.set()
        if server is not None:
            server.shutdown()
            server.server_close()
    logger.info(progress_line(downloader))
    logger.info("%s@%s is in %s", model.repo_id, model.revision, snapshot)
    return 0
