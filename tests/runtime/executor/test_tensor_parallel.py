"""Tensor parallelism on the CPU (gloo): TP=N computes what TP=1 computes, on
sharded, replicated and GQA key/value heads and on SmolLM2 under preemption;
sizes the model cannot split are refused; a dead worker fails the engine at
once and no process is left behind."""

import os
import pickle
import signal
import time

import pytest
from pagoda.runtime.config import CacheConfig, SchedulerConfig
from pagoda.runtime.core.request import Request
from pagoda.runtime.core.scheduler import Scheduler
from pagoda.runtime.entrypoints.llm import LLM
from pagoda.runtime.executor.abstract import WorkerDiedError
from pagoda.runtime.sampling_params import InvalidRequestError, SamplingParams

TINY = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=8,
    vocab_size=256,
    max_position_embeddings=512,
)
OPTIONS = {"dtype": "float32", "max_model_len": 256, "num_kv_blocks": 96, "block_size": 8}
PROMPTS = [list(range(3, 40)), [7, 8, 9], list(range(100, 180)), [42] * 20]


def outputs(llm: LLM, params: SamplingParams) -> list[tuple[list[int], list[float]]]:
    """Each prompt's tokens and their log-probabilities."""
    result = []
    for out in llm.generate(PROMPTS, params):
        completion = out.outputs[0]
        lps = [pos[t].logprob for t, pos in zip(completion.token_ids, completion.logprobs)]
        result.append((completion.token_ids, lps))
    return result


def assert_same(tp1, tpn) -> None:
    for (tokens1, lps1), (tokens_n, lps_n) in zip(tp1, tpn):
        assert tokens_n == tokens1
        assert lps_n == pytest.approx(lps1, abs=1e-4)


@pytest.fixture(scope="module")
def tiny_folders(tiny_checkpoint, tmp_path_factory):
    from transformers import LlamaConfig

    folders = {}
    for kv_heads in (8, 2, 1):
        folder = tmp_path_factory.mktemp(f"kv{kv_heads}")
        tiny_checkpoint(folder, LlamaConfig(**TINY, num_key_value_heads=kv_heads), seed=kv_heads)
        folders[kv_heads] = folder
    return folders


@pytest.mark.parametrize("kv_heads", [8, 2, 1], ids=["kv-sharded-8", "gqa-kv-2", "kv-replicated-1"])
def test_tp2_equals_tp1_on_sharded_and_replicated_kv_heads(tiny_folders, kv_heads):
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=1)
    folder = str(tiny_folders[kv_heads])
    tp1 = outputs(LLM(folder, **OPTIONS), params)
    llm = LLM(folder, tensor_parallel_size=2, **OPTIONS)
    try:
        assert_same(tp1, outputs(llm, params))
    finally:
        llm.engine.shutdown()


def test_random_weights_do_not_depend_on_the_split():
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, logprobs=1)
    options = dict(
        OPTIONS,
        model="smollm2-135m",
        random_weights=True,
        hf_overrides={"num_hidden_layers": 2, "vocab_size": 512},
    )
    tp1 = outputs(LLM(**options), params)
    llm = LLM(tensor_parallel_size=3, **options)  # 9 heads, 3 KV heads
    try:
        assert_same(tp1, outputs(llm, params))
    finally:
        llm.engine.shutdown()


@pytest.mark.slow
@pytest.mark.model
def test_tp3_equals_tp1_on_smollm2_with_chunked_prefill_and_preemption(prompts):
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, logprobs=1)
    # 16 tokens a step and 16 blocks of 16 (the longest prompt alone takes
    # 13): prompts arrive in chunks while others decode, and requests are
    # preempted and recomputed.
    tight = dict(
        dtype="float32",
        max_model_len=256,
        max_num_batched_tokens=16,
        max_num_seqs=8,
        num_kv_blocks=16,
    )

    def run(llm):
        outs = llm.generate(prompts, params)
        return [
            (
                o.outputs[0].token_ids,
                [p[t].logprob for t, p in zip(o.outputs[0].token_ids, o.outputs[0].logprobs)],
            )
            for o in outs
        ]

    tp1_llm = LLM(**tight)
    tp1 = run(tp1_llm)
    assert tp1_llm.engine.engine_core.scheduler.make_stats().num_preemptions > 0
    llm = LLM(tensor_parallel_size=3, **tight)
    try:
        assert_same(tp1, run(llm))
        assert llm.engine.engine_core.scheduler.make_stats().num_preemptions > 0
    finally:
        llm.engine.shutdown()


@pytest.mark.model
def test_a_size_that_does_not_divide_the_heads_is_refused_naming_both():
    with pytest.raises(InvalidRequestError) as err:
        LLM(tensor_parallel_size=2)  # SmolLM2: 9 heads, 3 KV heads
    assert err.value.param == "tensor_parallel_size"
    assert "tensor_parallel_size 2" in str(err.value) and "9 attention heads" in str(err.value)


def test_a_killed_worker_fails_the_engine_at_once_and_leaves_no_process(tiny_folders):
    llm = LLM(str(tiny_folders[2]), tensor_parallel_size=2, **OPTIONS)
    executor = llm.engine.engine_core.executor
    pids = [w.pid for w in executor.workers]
    os.kill(pids[1], signal.SIGKILL)
    deadline = time.monotonic() + 10
    while executor._failure is None and time.monotonic() < deadline:
        time.sleep(0.05)
    with pytest.raises(WorkerDiedError, match="worker 1 died"):
        llm.generate(PROMPTS[:1], SamplingParams(max_tokens=4))
    llm.engine.shutdown()
    deadline = time.monotonic() + 10
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(_alive(pid) for pid in pids)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"


def step_message_bytes(prompt_len: int, num_reqs: int = 16) -> int:
    """Pickled size of a steady decode step's broadcast for `num_reqs` requests."""
    max_len = prompt_len + 128
    sched = Scheduler(
        SchedulerConfig(
            max_num_seqs=num_reqs, max_num_batched_tokens=num_reqs * max_len, max_model_len=max_len
        ),
        CacheConfig(block_size=16),
        num_blocks=num_reqs * (max_len // 16),
    )
    for i in range(num_reqs):
        # Distinct prompts: no prefix-cache hits to muddle the comparison.
        prompt = [i, *range(prompt_len - 1)]
        sched.add_request(Request(f"r{i}", prompt, SamplingParams(max_tokens=64), max_len))
    from pagoda.runtime.core.sched_output import ModelRunnerOutput

    sampled = {}
    for _ in range(3):  # prefill, then decodes
        out = sched.schedule()
        sampled = {r: [5] for r in out.num_scheduled_tokens}
        sched.update_from_output(out, ModelRunnerOutput(sampled_token_ids=sampled))
    out = sched.schedule()
    return len(pickle.dumps(("step", out, sampled), protocol=pickle.HIGHEST_PROTOCOL))


def test_the_step_broadcast_does_not_grow_with_prompt_length():
    short, long = step_message_bytes(64), step_message_bytes(4096)
    assert long <= short * 1.1, (short, long)
