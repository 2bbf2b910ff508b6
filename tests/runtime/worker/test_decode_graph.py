"""Decode graphs: capture sizes; on the CPU, replayed C++ kernel calls give
the eager forward's tokens and log-probabilities bit for bit, padded batches
included; a model whose forward issues a torch op the graph cannot
record is caught by the check and runs eagerly, as does one whose capture
fails; on a GPU, CUDA graphs give
the eager tokens and log-probabilities (that test needs a GPU, no model
files, and runs wherever a GPU is present)."""

import gc
import logging

import pytest
import torch
from pagoda.kernels.cpu import extension, linear_ops
from pagoda.runtime import LLM, SamplingParams
from pagoda.runtime.models import llama
from pagoda.runtime.worker.decode_graph import CPU_MAX_CAPTURE_SIZE, default_capture_sizes

needs_cpu_kernels = pytest.mark.skipif(
    extension() is None, reason="the C++ CPU kernels do not build"
)


def needs_cpu_graphs(dtype: str):
    """A CPU graph needs every linear in pagoda's kernel (AVX-512, or AVX2 with FMA)."""
    return pytest.mark.skipif(
        linear_ops(getattr(torch, dtype)) is None,
        reason=f"no pagoda packed linear for {dtype} on this CPU: linears run in oneDNN",
    )


# CPU graphs are what these tests are about: pinned to the CPU, so that on a
# GPU machine (where "auto" picks CUDA) they still test the CPU path.
TINY = dict(
    device="cpu",
    model="smollm2-135m",
    random_weights=True,
    hf_overrides={"num_hidden_layers": 2, "vocab_size": 512},
    max_model_len=256,
    max_num_seqs=8,
    num_kv_blocks=64,
)
# Lengths and output lengths that leave 8, 7, ... 1 requests decoding: steps
# replay the graphs of 8, 4, 2 and 1 rows, most of them padded.
PROMPTS = [[3 + i + 7 * j for j in range(5 + 9 * i)] for i in range(8)]


def test_capture_sizes_cover_every_batch_up_to_max_num_seqs():
    for max_seqs in (1, 5, 20, 64, 256):
        sizes = default_capture_sizes(max_seqs)
        assert sizes == sorted(set(sizes))
        assert sizes[-1] == max_seqs
        # Every decode batch of 1..max_num_seqs has a graph at most 2x its size.
        for n in range(1, max_seqs + 1):
            b = next(s for s in sizes if s >= n)
            assert b < 2 * n + 16


def test_cpu_capture_sizes_stop_at_16():
    assert default_capture_sizes(1, "cpu") == [1]
    assert default_capture_sizes(5, "cpu") == [1, 2, 4, 5]
    assert default_capture_sizes(256, "cpu") == [1, 2, 4, 8, CPU_MAX_CAPTURE_SIZE]


def run(llm: LLM) -> tuple[list, int]:
    """Each prompt's tokens and log-probabilities, and how many steps replayed a graph."""
    runner = llm.engine.engine_core.executor.worker.runner
    replays = 0
    if runner.graph_runner is not None:
        replay = runner.graph_runner.run

        def counted(*args):
            nonlocal replays
            replays += 1
            return replay(*args)

        runner.graph_runner.run = counted
    result = []
    for out in llm.generate(PROMPTS, [params(i) for i in range(len(PROMPTS))]):
        c = out.outputs[0]
        result.append((c.token_ids, [p[t].logprob for t, p in zip(c.token_ids, c.logprobs)]))
    return result, replays


def params(i: int) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=3 + 2 * i, ignore_eos=True, logprobs=2)


@needs_cpu_kernels
@pytest.mark.parametrize(
    "dtype", [pytest.param(d, marks=needs_cpu_graphs(d)) for d in ("float32", "bfloat16")]
)
def test_cpu_graphs_give_the_eager_tokens_and_logprobs(dtype):
    eager, none = run(LLM(dtype=dtype, enforce_eager=True, **TINY))
    assert none == 0
    llm = LLM(dtype=dtype, **TINY)
    graphs = llm.engine.engine_core.executor.worker.runner.graph_runner
    assert graphs is not None and sorted(graphs.graphs) == [1, 2, 4, 8]
    replayed, replays = run(llm)
    assert replays >= 15  # every decode step but those sharing a step with a prefill
    assert replayed == eager


@needs_cpu_kernels
@needs_cpu_graphs("float32")
def test_a_forward_the_graph_cannot_record_runs_eagerly(monkeypatch, caplog):
    eager, _ = run(LLM(dtype="float32", enforce_eager=True, **TINY))
    forward = llama.LlamaMLP.forward

    def with_a_torch_op(self, x):
        return forward(self, x) * 1.0  # an aten op: not a recorded kernel call

    monkeypatch.setattr(llama.LlamaMLP, "forward", with_a_torch_op)
    with caplog.at_level(logging.WARNING, logger="pagoda.runtime.worker.decode_graph"):
        llm = LLM(dtype="float32", **TINY)
    assert llm.engine.engine_core.executor.worker.runner.graph_runner is None
    assert "differs from the eager forward" in caplog.text
    assert run(llm) == (eager, 0)


@needs_cpu_kernels
@needs_cpu_graphs("float32")
def test_a_capture_that_fails_leaves_the_engine_eager(monkeypatch, caplog):
    from pagoda.runtime.worker.decode_graph import DecodeGraphRunner

    random_inputs = DecodeGraphRunner._random_inputs

    def bad_slots(self, b, gen):
        random_inputs(self, b, gen)
        self.slot_mapping[:b] = 10**9  # the cache write refuses it

    monkeypatch.setattr(DecodeGraphRunner, "_random_inputs", bad_slots)
    with caplog.at_level(logging.WARNING, logger="pagoda.runtime.worker.decode_graph"):
        llm = LLM(dtype="float32", **TINY)
    assert llm.engine.engine_core.executor.worker.runner.graph_runner is None
    assert "outside the cache" in caplog.text
    tokens, replays = run(llm)
    assert replays == 0 and all(len(t) == 3 + 2 * i for i, (t, _) in enumerate(tokens))


@needs_cpu_kernels
@needs_cpu_graphs("bfloat16")
@pytest.mark.model
def test_cpu_graphs_give_smollm2s_eager_tokens(prompts, smollm2_gguf):
    sampling = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    options = dict(device="cpu", dtype="bfloat16", max_model_len=512, max_num_seqs=8)
    eager = LLM(enforce_eager=True, **options).generate(prompts, sampling)
    graphs = LLM(**options).generate(prompts, sampling)
    assert [o.outputs[0].token_ids for o in graphs] == [o.outputs[0].token_ids for o in eager]


def test_no_cpu_graph_where_a_forward_op_is_not_a_cpu_kernel(monkeypatch):
    """The Triton backend (its interpreter is Python) and oneDNN's linears are
    ops a CPU graph cannot record: the engine starts eager without trying."""
    from pagoda.runtime.worker.decode_graph import DecodeGraphRunner

    def never(self):
        raise AssertionError("a CPU graph was captured")

    monkeypatch.setattr(DecodeGraphRunner, "capture", never)
    llm = LLM(dtype="float32", attention_backend="triton", **TINY)
    assert llm.engine.engine_core.executor.worker.runner.graph_runner is None
    monkeypatch.setattr("pagoda.kernels.cpu.linear_ops", lambda dtype: None)
    llm = LLM(dtype="float32", **TINY)
    assert llm.engine.engine_core.executor.worker.runner.graph_runner is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize(
    ("dtype", "num_requests"),
    [("float32", 8), ("bfloat16", 8), ("float16", 8), ("float32", 5)],
)
def test_graph_replay_gives_the_same_greedy_tokens_as_eager(dtype, num_requests):
    # SmolLM2-135M's full shape with random weights (nothing to download on a
    # GPU machine). Eight requests of one output length keep the batch at 8,
    # a capture size, so the graph replays the eager step's very kernels and
    # the tokens must agree exactly, in the half dtypes too. Five requests
    # replay the graph of 8 with three padded rows of length 0, which must
    # leave the real rows' results alone (float32: the linears' kernels may
    # differ between 5 and 8 rows, so only rounding may differ).
    prompts = PROMPTS[:num_requests]
    params = SamplingParams(temperature=0.0, max_tokens=32, min_tokens=32, logprobs=1)
    outs = {}
    for eager in (True, False):
        llm = LLM(
            model="smollm2-135m",
            random_weights=True,
            dtype=dtype,
            attention_backend="triton",
            enforce_eager=eager,
            max_model_len=512,
            max_num_seqs=16,
            # Kernel tests may share the GPU (pytest-xdist).
            gpu_memory_utilization=0.3,
        )
        runner = llm.engine.engine_core.executor.worker.runner
        assert (runner.graph_runner is None) == eager
        outs[eager] = [o.outputs[0] for o in llm.generate(prompts, params)]
        del llm, runner
        gc.collect()  # the engine's cycles hold the KV cache until collected
        torch.cuda.empty_cache()
    assert [o.token_ids for o in outs[True]] == [o.token_ids for o in outs[False]]
    for a, b in zip(outs[True], outs[False]):
        la = [d[t].logprob for d, t in zip(a.logprobs, a.token_ids)]
        lb = [d[t].logprob for d, t in zip(b.logprobs, b.token_ids)]
        assert la == pytest.approx(lb, abs=1e-3 if dtype == "float32" else 5e-2)
