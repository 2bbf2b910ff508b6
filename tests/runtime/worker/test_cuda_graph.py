"""CUDA graphs: capture sizes, and identical outputs with and without graphs
(the latter needs a GPU; it runs wherever one is present)."""

import pytest
import torch
from pagoda.runtime.worker.cuda_graph import default_capture_sizes


def test_capture_sizes_cover_every_batch_up_to_max_num_seqs():
    for max_seqs in (1, 5, 20, 64, 256):
        sizes = default_capture_sizes(max_seqs)
        assert sizes == sorted(set(sizes))
        assert sizes[-1] == max_seqs
        # Every decode batch of 1..max_num_seqs has a graph at most 2x its size.
        for n in range(1, max_seqs + 1):
            b = next(s for s in sizes if s >= n)
            assert b < 2 * n + 16


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.model
def test_graph_replay_gives_the_same_greedy_tokens_as_eager(prompts):
    from pagoda.runtime import LLM, SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=32, min_tokens=32)
    outs = {}
    for eager in (True, False):
        llm = LLM(
            dtype="float32",
            attention_backend="triton",
            enforce_eager=eager,
            max_model_len=512,
            max_num_seqs=16,
        )
        runner = llm.engine.engine_core.executor.worker.runner
        assert (runner.graph_runner is None) == eager
        outs[eager] = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
        del llm
        torch.cuda.empty_cache()
    assert outs[True] == outs[False]
