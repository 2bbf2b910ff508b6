"""The per-request series an autoscaler reads: arrivals and the time in the batch."""

import time

from pagoda.runtime.core.events import EngineCoreEvent, EngineCoreEventType
from pagoda.runtime.core.outputs import EngineCoreOutput, EngineCoreOutputs
from pagoda.runtime.engine.output_processor import ProcessedOutputs
from pagoda.runtime.entrypoints.openai.metrics import ServingMetrics
from pagoda.runtime.outputs import CompletionOutput, RequestOutput
from prometheus_client import CollectorRegistry, generate_latest


def _value(text: str, series: str) -> float:
    line = next(x for x in text.splitlines() if x.startswith(series + " "))
    return float(line.split()[-1])


def test_arrivals_count_sequences_and_inference_time_leaves_the_queue_out():
    registry = CollectorRegistry()
    metrics = ServingMetrics("m", 256, registry)
    now = time.monotonic()
    # Arrived 10 s ago, admitted 4 s ago (6 s in the queue), finishes now.
    metrics.on_request_added("a", ["a"], 5, now - 10)
    metrics.on_request_added("b", ["b-0", "b-1"], 5, now)  # n=2: two sequences
    scheduled = EngineCoreEvent(EngineCoreEventType.SCHEDULED, now - 4)
    metrics.on_step(
        EngineCoreOutputs([EngineCoreOutput("a", [7], events=[scheduled])]),
        ProcessedOutputs([], []),
    )
    done = RequestOutput("a", None, [], [CompletionOutput(0, "", [7], finish_reason="stop")], True)
    metrics.on_step(EngineCoreOutputs(), ProcessedOutputs([done], []))

    text = generate_latest(registry).decode()
    label = '{model_name="m"}'
    assert _value(text, f"pagoda:requests_received_total{label}") == 3
    assert _value(text, f"vllm:request_inference_time_seconds_count{label}") == 1
    inference = _value(text, f"vllm:request_inference_time_seconds_sum{label}")
    assert 4 <= inference < 5  # from admission, not from arrival
    assert 6 <= _value(text, f"vllm:request_queue_time_seconds_sum{label}") < 6.1


def test_a_request_never_scheduled_has_no_inference_time():
    registry = CollectorRegistry()
    metrics = ServingMetrics("m", 256, registry)
    metrics.on_request_added("a", ["a"], 5, time.monotonic())
    metrics.on_request_aborted("a")
    text = generate_latest(registry).decode()
    assert _value(text, 'pagoda:requests_received_total{model_name="m"}') == 1
    assert _value(text, 'vllm:request_inference_time_seconds_count{model_name="m"}') == 0


def _admitted(arrived_ago: float, scheduled_ago: float):
    """Metrics that saw request "a" arrive and be first scheduled so many
    seconds ago: (registry, metrics, now, the SCHEDULED event to report)."""
    registry = CollectorRegistry()
    metrics = ServingMetrics("m", 256, registry)
    now = time.monotonic()
    metrics.on_request_added("a", ["a"], 5, now - arrived_ago)
    return (
        registry,
        metrics,
        now,
        EngineCoreEvent(EngineCoreEventType.SCHEDULED, now - scheduled_ago),
    )


def test_prefill_and_decode_time_split_the_time_in_the_batch_at_the_first_token():
    registry, metrics, now, scheduled = _admitted(10, 6)
    # Admitted 6 s ago; its first token 5 s ago (1 s of prefill), two more
    # tokens, the last 2 s ago (3 s of decode).
    for timestamp, events in ((now - 5, [scheduled]), (now - 3, []), (now - 2, [])):
        metrics.on_step(
            EngineCoreOutputs([EngineCoreOutput("a", [7], events=events)], timestamp=timestamp),
            ProcessedOutputs([], []),
        )
    done = RequestOutput(
        "a", None, [], [CompletionOutput(0, "", [7] * 3, finish_reason="length")], True
    )
    metrics.on_step(EngineCoreOutputs(), ProcessedOutputs([done], []))

    text = generate_latest(registry).decode()
    label = '{model_name="m"}'
    assert _value(text, f"vllm:request_prefill_time_seconds_count{label}") == 1
    assert abs(_value(text, f"vllm:request_prefill_time_seconds_sum{label}") - 1) < 1e-6
    assert abs(_value(text, f"vllm:request_decode_time_seconds_sum{label}") - 3) < 1e-6
    # TTFT = queue (4 s) + prefill (1 s).
    assert abs(_value(text, f"vllm:request_queue_time_seconds_sum{label}") - 4) < 1e-6
    assert abs(_value(text, f"vllm:time_to_first_token_seconds_sum{label}") - 5) < 1e-6


def test_a_request_finished_before_its_first_token_has_no_prefill_or_decode_time():
    # Finished by the engine with no token (aborted there): in the batch,
    # but never prefilled to a token.
    registry, metrics, _, scheduled = _admitted(2, 1)
    metrics.on_step(
        EngineCoreOutputs([EngineCoreOutput("a", [], events=[scheduled])]),
        ProcessedOutputs([], []),
    )
    done = RequestOutput("a", None, [], [CompletionOutput(0, "", [], finish_reason="abort")], True)
    metrics.on_step(EngineCoreOutputs(), ProcessedOutputs([done], []))
    text = generate_latest(registry).decode()
    label = '{model_name="m"}'
    assert _value(text, f"vllm:request_inference_time_seconds_count{label}") == 1
    for series in ("prefill", "decode"):
        assert _value(text, f"vllm:request_{series}_time_seconds_count{label}") == 0
