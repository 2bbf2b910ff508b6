"""The speculative decoding series under vLLM's names, fed from the engine's
cumulative counters (each scrape adds only what is new)."""

from pagoda.runtime.core.outputs import EngineCoreOutputs, SchedulerStats, SpecDecodingStats
from pagoda.runtime.engine.output_processor import ProcessedOutputs
from pagoda.runtime.entrypoints.openai.metrics import ServingMetrics
from prometheus_client import CollectorRegistry, generate_latest


def _step(metrics, stats):
    outputs = EngineCoreOutputs(scheduler_stats=SchedulerStats(spec_decoding=stats))
    metrics.on_step(outputs, ProcessedOutputs([], []))


def test_spec_decode_counters_follow_the_engine_stats():
    registry = CollectorRegistry()
    metrics = ServingMetrics("m", 256, registry)
    _step(metrics, SpecDecodingStats(2, 6, 4, [2, 1, 1]))
    _step(metrics, SpecDecodingStats(3, 9, 5, [3, 1, 1]))
    _step(metrics, SpecDecodingStats(3, 9, 5, [3, 1, 1]))  # nothing new
    text = generate_latest(registry).decode()
    assert 'vllm:spec_decode_num_drafts_total{model_name="m"} 3.0' in text
    assert 'vllm:spec_decode_num_draft_tokens_total{model_name="m"} 9.0' in text
    assert 'vllm:spec_decode_num_accepted_tokens_total{model_name="m"} 5.0' in text
    per_pos = 'vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name="m",position="0"} 3.0'
    assert per_pos in text
    assert 'position="2"} 1.0' in text
