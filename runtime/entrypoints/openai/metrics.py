"""Prometheus metrics of the API server, under vLLM's names and labels.

The API process owns the registry: the engine core reports a `SchedulerStats`
with every output batch (cumulative counters, current gauges) and this module
turns those, plus the per-request timings seen here, into series labelled
`model_name`, so dashboards, KEDA/HPA rules and routers written for vLLM work
unchanged. prometheus_client adds `_total` to counter names on exposition
(`vllm:prompt_tokens_total`), as vLLM's exposition shows them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from pagoda.runtime.core.events import EngineCoreEventType
from pagoda.runtime.core.outputs import EngineCoreOutputs, SpecDecodingStats
from pagoda.runtime.engine.output_processor import ProcessedOutputs
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics

# vLLM's buckets, so histogram_quantile queries carry over.
_LATENCY_BUCKETS = [
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
]  # fmt: skip
_ITL_BUCKETS = [
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
]  # fmt: skip
_E2E_BUCKETS = [
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0,
    40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
]  # fmt: skip


def _token_buckets(max_model_len: int) -> list[float]:
    """1, 2, 5, 10, 20, 50, ... up to max_model_len (vLLM's build_1_2_5_buckets)."""
    out: list[float] = []
    exponent = 0
    while True:
        for m in (1, 2, 5):
            value = m * 10**exponent
            if value > max_model_len:
                return out
            out.append(value)
        exponent += 1


@dataclass
class _RequestTimes:
    arrival_time: float
    num_prompt_tokens: int
    child_ids: list[str]
    first_token_time: float | None = None
    last_token_time: dict[str, float] = field(default_factory=dict)
    num_generation_tokens: int = 0
    queued_recorded: bool = False
    # When the engine first admitted it to the batch (the core's clock).
    scheduled_time: float | None = None


class ServingMetrics:
    """The server's metrics; implements AsyncLLM's `StatLogger`."""

    def __init__(self, model_name: str, max_model_len: int, registry: CollectorRegistry):
        # `*_created` series double the exposition for no dashboard's benefit
        # (vLLM drops them too).
        disable_created_metrics()
        self.registry = registry
        labels = ["model_name"]

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, labels, registry=registry).labels(model_name)

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, labels, registry=registry).labels(model_name)

        def histogram(name: str, doc: str, buckets: list[float]) -> Histogram:
            return Histogram(name, doc, labels, buckets=buckets, registry=registry).labels(
                model_name
            )

        self.running = gauge("vllm:num_requests_running", "Requests in the model's batch.")
        self.waiting = gauge("vllm:num_requests_waiting", "Requests waiting to be scheduled.")
        self.kv_usage = gauge("vllm:kv_cache_usage_perc", "KV-cache usage; 1 means 100 percent.")
        self.prompt_tokens = counter("vllm:prompt_tokens", "Prefill tokens processed.")
        self.generation_tokens = counter("vllm:generation_tokens", "Generation tokens processed.")
        self.preemptions = counter("vllm:num_preemptions", "Cumulative preemptions.")
        self.prefix_queries = counter(
            "vllm:prefix_cache_queries", "Prefix-cache queries, in tokens."
        )
        self.prefix_hits = counter("vllm:prefix_cache_hits", "Prefix-cache hits, in tokens.")
        self._success = Counter(
            "vllm:request_success",
            "Finished requests, by finish reason.",
            ["model_name", "finished_reason"],
            registry=registry,
        )
        self._model_name = model_name
        # Pagoda's own series (vLLM has no equivalent).
        self.pending = gauge(
            "pagoda:num_requests_pending",
            "Engine-core requests still in the API process (being tokenized or "
            "validated); queue depth = vllm:num_requests_waiting + this.",
        )
        self._lora_info = Gauge(
            "vllm:lora_requests_info",
            "The LoRA adapters of running and waiting requests (as labels; the value "
            "is when they last changed).",
            ["running_lora_adapters", "waiting_lora_adapters", "max_lora"],
            registry=registry,
        )
        self._lora_info_key: tuple[str, str] | None = None
        self.max_lora = 0
        self.lora_names: Callable[[int], str] = str
        self.loras_loaded = gauge(
            "pagoda:lora_adapters_loaded", "LoRA adapters this server serves by name."
        )
        self._lora_loads = Counter(
            "pagoda:lora_adapter_loads",
            "LoRA adapter loads, by outcome (ok, replaced, error).",
            ["model_name", "outcome"],
            registry=registry,
        )
        self._lora_unloads = Counter(
            "pagoda:lora_adapter_unloads",
            "LoRA adapter unloads, by outcome (ok, not_found).",
            ["model_name", "outcome"],
            registry=registry,
        )
        self.received = counter(
            "pagoda:requests_received",
            "Requests the engine accepted, one per sequence (as vllm:num_requests_running "
            "counts them); its rate times vllm:request_inference_time_seconds is the "
            "concurrency the arrivals ask for (Little's law).",
        )
        self._rejected = Counter(
            "pagoda:requests_rejected",
            "Requests refused with an error status, by reason.",
            ["model_name", "reason"],
            registry=registry,
        )
        self.ttft = histogram(
            "vllm:time_to_first_token_seconds", "Time to first token.", _LATENCY_BUCKETS
        )
        self.itl = histogram(
            "vllm:inter_token_latency_seconds", "Time between tokens.", _ITL_BUCKETS
        )
        self.tpot = histogram(
            "vllm:request_time_per_output_token_seconds",
            "Mean time per output token after the first, per request.",
            _ITL_BUCKETS,
        )
        self.e2e = histogram(
            "vllm:e2e_request_latency_seconds", "End-to-end request latency.", _E2E_BUCKETS
        )
        self.queue_time = histogram(
            "vllm:request_queue_time_seconds", "Time waiting before first scheduled.", _E2E_BUCKETS
        )
        self.inference_time = histogram(
            "vllm:request_inference_time_seconds",
            "Time from first scheduled to finished (prefill and decode, no queue).",
            _E2E_BUCKETS,
        )
        # A finished request's time in the batch, split where its first token
        # came (vLLM's two series): TTFT = queue + prefill, so a slow first
        # token reads as waiting or as computing without a client-side trace.
        self.prefill_time = histogram(
            "vllm:request_prefill_time_seconds",
            "Time from first scheduled to the first token.",
            _E2E_BUCKETS,
        )
        self.decode_time = histogram(
            "vllm:request_decode_time_seconds",
            "Time from the first token to the last.",
            _E2E_BUCKETS,
        )
        token_buckets = _token_buckets(max_model_len)
        self.request_prompt_tokens = histogram(
            "vllm:request_prompt_tokens", "Prompt tokens per request.", token_buckets
        )
        self.request_generation_tokens = histogram(
            "vllm:request_generation_tokens", "Generated tokens per request.", token_buckets
        )
        self.spec = _SpecDecodingMetrics(model_name, registry)
        self._last_prefix_queries = 0
        self._last_prefix_hits = 0
        self._last_preemptions = 0
        self._requests: dict[str, _RequestTimes] = {}
        self._parent_of: dict[str, str] = {}

    def track_pending(self, read: Callable[[], float]) -> None:
        """Read the pending count when scraped: no bookkeeping per request."""
        self.pending.set_function(read)

    def on_rejected(self, reason: str) -> None:
        self._rejected.labels(self._model_name, reason).inc()

    # -- StatLogger ---------------------------------------------------------------

    def on_request_added(
        self, request_id: str, child_ids: list[str], num_prompt_tokens: int, arrival_time: float
    ) -> None:
        self._requests[request_id] = _RequestTimes(arrival_time, num_prompt_tokens, child_ids)
        for cid in child_ids:
            self._parent_of[cid] = request_id
        self.received.inc(max(1, len(child_ids)))

    def on_request_aborted(self, request_id: str) -> None:
        req = self._forget(request_id)
        if req is not None:
            self._success.labels(self._model_name, "abort").inc()

    def on_lora_event(self, event: str, outcome: str) -> None:
        counter = self._lora_loads if event == "load" else self._lora_unloads
        counter.labels(self._model_name, outcome).inc()

    def _update_lora_info(self, running: dict[int, int], waiting: dict[int, int]) -> None:
        key = (
            ",".join(sorted(self.lora_names(i) for i in running)),
            ",".join(sorted(self.lora_names(i) for i in waiting)),
        )
        if key != self._lora_info_key:
            # One series at a time: the labels are the state.
            self._lora_info.clear()
            self._lora_info.labels(*key, str(self.max_lora)).set(time.time())
            self._lora_info_key = key

    def on_step(self, outputs: EngineCoreOutputs, processed: ProcessedOutputs) -> None:
        stats = outputs.scheduler_stats
        if stats is not None and self.max_lora:
            self._update_lora_info(stats.running_loras, stats.waiting_loras)
        if stats is not None:
            self.running.set(stats.num_running_reqs)
            self.waiting.set(stats.num_waiting_reqs)
            self.kv_usage.set(stats.kv_cache_usage)
            # The engine's counters are cumulative: add what is new.
            self.prefix_queries.inc(max(0, stats.prefix_cache_queries - self._last_prefix_queries))
            self.prefix_hits.inc(max(0, stats.prefix_cache_hits - self._last_prefix_hits))
            self.preemptions.inc(max(0, stats.num_preemptions - self._last_preemptions))
            self._last_prefix_queries = stats.prefix_cache_queries
            self._last_prefix_hits = stats.prefix_cache_hits
            self._last_preemptions = stats.num_preemptions
            if stats.spec_decoding is not None:
                self.spec.observe(stats.spec_decoding)
        now = outputs.timestamp
        num_new = 0
        for out in outputs.outputs:
            req = self._requests.get(self._parent_of.get(out.request_id, ""))
            if req is None:
                continue
            if out.events and not req.queued_recorded:
                scheduled = next(
                    (e for e in out.events if e.type == EngineCoreEventType.SCHEDULED), None
                )
                if scheduled is not None:  # the first admission: queue time
                    req.queued_recorded = True
                    req.scheduled_time = scheduled.timestamp
                    self.queue_time.observe(max(0.0, scheduled.timestamp - req.arrival_time))
            if not out.new_token_ids:
                continue
            n = len(out.new_token_ids)
            num_new += n
            req.num_generation_tokens += n
            last = req.last_token_time.get(out.request_id)
            if last is None:
                if req.first_token_time is None:
                    req.first_token_time = now
                    self.ttft.observe(max(0.0, now - req.arrival_time))
                    self.prompt_tokens.inc(req.num_prompt_tokens)
            else:
                self.itl.observe(max(0.0, now - last))
            req.last_token_time[out.request_id] = now
        self.generation_tokens.inc(num_new)
        for ro in processed.request_outputs:
            if ro.finished:
                self._finish(ro.request_id, ro.outputs[0].finish_reason if ro.outputs else None)

    # -- helpers ----------------------------------------------------------------------

    def _finish(self, request_id: str, finish_reason: str | None) -> None:
        req = self._forget(request_id)
        if req is None:
            return
        now = time.monotonic()
        e2e = now - req.arrival_time
        self.e2e.observe(e2e)
        if req.scheduled_time is not None:
            self.inference_time.observe(max(0.0, now - req.scheduled_time))
            if req.first_token_time is not None:
                self.prefill_time.observe(max(0.0, req.first_token_time - req.scheduled_time))
        if req.first_token_time is not None and req.last_token_time:
            last = max(req.last_token_time.values())
            self.decode_time.observe(max(0.0, last - req.first_token_time))
        self._success.labels(self._model_name, finish_reason or "stop").inc()
        self.request_prompt_tokens.observe(req.num_prompt_tokens)
        self.request_generation_tokens.observe(req.num_generation_tokens)
        per_child = req.num_generation_tokens / max(1, len(req.child_ids))
        if req.first_token_time is not None and per_child > 1:
            self.tpot.observe((now - req.first_token_time) / (per_child - 1))

    def _forget(self, request_id: str) -> _RequestTimes | None:
        req = self._requests.pop(request_id, None)
        if req is not None:
            for cid in req.child_ids:
                self._parent_of.pop(cid, None)
        return req


class _SpecDecodingMetrics:
    """Speculative decoding counters under vLLM's names; the engine's
    counters are cumulative, so each update adds what is new."""

    def __init__(self, model_name: str, registry: CollectorRegistry):
        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, ["model_name"], registry=registry).labels(model_name)

        self.num_drafts = counter("vllm:spec_decode_num_drafts", "Drafts verified.")
        self.num_draft_tokens = counter(
            "vllm:spec_decode_num_draft_tokens", "Draft tokens verified."
        )
        self.num_accepted_tokens = counter(
            "vllm:spec_decode_num_accepted_tokens", "Draft tokens accepted."
        )
        self._per_pos = Counter(
            "vllm:spec_decode_num_accepted_tokens_per_pos",
            "Draft tokens accepted, by position in the draft (0 is the first).",
            ["model_name", "position"],
            registry=registry,
        )
        self._model_name = model_name
        self._last = SpecDecodingStats()

    def observe(self, stats: SpecDecodingStats) -> None:
        last = self._last
        self.num_drafts.inc(max(0, stats.num_drafts - last.num_drafts))
        self.num_draft_tokens.inc(max(0, stats.num_draft_tokens - last.num_draft_tokens))
        self.num_accepted_tokens.inc(max(0, stats.num_accepted_tokens - last.num_accepted_tokens))
        before = last.num_accepted_tokens_per_pos
        for pos, n in enumerate(stats.num_accepted_tokens_per_pos):
            new = n - (before[pos] if pos < len(before) else 0)
            if new > 0:
                self._per_pos.labels(self._model_name, str(pos)).inc(new)
        self._last = SpecDecodingStats(
            stats.num_drafts,
            stats.num_draft_tokens,
            stats.num_accepted_tokens,
            list(stats.num_accepted_tokens_per_pos),
        )
