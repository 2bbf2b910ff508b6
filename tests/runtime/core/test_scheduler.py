"""Scheduler: budgets, chunked prefill, preemption, stop conditions, no leaks.

A fake runner plays the model from the SchedulerOutput messages alone. Its KV
cache stores token ids in slots: writing each step's tokens and reading every
request's whole context back through its block table checks block tables,
prefix hits and evictions end to end. Its "model" samples a deterministic
function of all previous tokens, so a request's correct output is known
without any scheduler.
"""

import random
from collections import defaultdict
from dataclasses import dataclass, field

import pytest
from pagoda.runtime.config import CacheConfig, SchedulerConfig
from pagoda.runtime.core.events import EngineCoreEventType
from pagoda.runtime.core.outputs import SchedulerStats
from pagoda.runtime.core.request import FinishReason, Request, RequestStatus
from pagoda.runtime.core.sched_output import ModelRunnerOutput
from pagoda.runtime.core.scheduler import Scheduler
from pagoda.runtime.sampling_params import InvalidRequestError, SamplingParams

BS = 4
VOCAB = 1000


def next_token(tokens):
    return hash(tuple(tokens)) % VOCAB


def expected_output(prompt, max_tokens):
    tokens = list(prompt)
    for _ in range(max_tokens):
        tokens.append(next_token(tokens))
    return tokens[len(prompt) :]


@dataclass
class RunnerState:
    tokens: list
    blocks: list
    computed: int


@dataclass
class FakeRunner:
    num_blocks: int
    block_size: int = BS
    reqs: dict = field(default_factory=dict)

    def __post_init__(self):
        self.kv = [None] * (self.num_blocks * self.block_size)

    def slot(self, state, pos):
        return state.blocks[pos // self.block_size] * self.block_size + pos % self.block_size

    def execute(self, out):
        for req_id in out.finished_req_ids:
            self.reqs.pop(req_id, None)
        for new in out.scheduled_new_reqs:
            assert new.req_id not in self.reqs
            tokens = list(new.prompt_token_ids) + list(new.output_token_ids)
            self.reqs[new.req_id] = RunnerState(
                tokens, list(new.block_ids), new.num_computed_tokens
            )
        cached = out.scheduled_cached_reqs
        for req_id, block_ids, computed in zip(
            cached.req_ids, cached.new_block_ids, cached.num_computed_tokens
        ):
            state = self.reqs[req_id]
            assert state.computed == computed
            state.blocks.extend(block_ids)
        # Like the attention layer: every write of the step before any read.
        for req_id, n in out.num_scheduled_tokens.items():
            state = self.reqs[req_id]
            for pos in range(state.computed, state.computed + n):
                self.kv[self.slot(state, pos)] = state.tokens[pos]
        sampled = {}
        for req_id, n in out.num_scheduled_tokens.items():
            state = self.reqs[req_id]
            state.computed += n
            context = [self.kv[self.slot(state, p)] for p in range(state.computed)]
            assert context == state.tokens[: state.computed], f"{req_id} read wrong KV"
            if state.computed == len(state.tokens):
                token = next_token(state.tokens)
                state.tokens.append(token)
                sampled[req_id] = [token]
        return ModelRunnerOutput(sampled_token_ids=sampled)


def make_scheduler(
    num_blocks=64, max_num_seqs=16, budget=64, max_model_len=128, caching=True, overlap=False
):
    return Scheduler(
        SchedulerConfig(
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=budget,
            max_model_len=max_model_len,
            async_scheduling=overlap,
        ),
        CacheConfig(block_size=BS, enable_prefix_caching=caching),
        num_blocks,
    )


def make_request(req_id, prompt, max_tokens=4, eos=None, max_model_len=128, **params):
    return Request(
        request_id=req_id,
        prompt_token_ids=list(prompt),
        sampling_params=SamplingParams(max_tokens=max_tokens, **params),
        eos_token_ids=(eos,) if isinstance(eos, int) else tuple(eos or ()),
        max_model_len=max_model_len,
    )


def check_step(sched, out):
    assert out.total_num_scheduled_tokens <= sched.max_num_batched_tokens
    assert out.total_num_scheduled_tokens == sum(out.num_scheduled_tokens.values())
    assert len(out.num_scheduled_tokens) <= sched.max_num_seqs
    assert all(n > 0 for n in out.num_scheduled_tokens.values())
    for req_id in out.num_scheduled_tokens:
        request = sched.requests[req_id]
        assert request.num_computed_tokens <= request.num_tokens + request.num_output_placeholders
        assert request.num_output_placeholders <= (2 if sched.async_scheduling else 0)


@dataclass
class Run:
    outputs: dict = field(default_factory=lambda: defaultdict(list))
    finish: dict = field(default_factory=dict)
    stop_reason: dict = field(default_factory=dict)
    steps: list = field(default_factory=list)


def step(sched, runner, run):
    out = sched.schedule()
    check_step(sched, out)
    run.steps.append(out)
    result = sched.update_from_output(out, runner.execute(out))
    record(run, result)
    return out, result


def record(run, result):
    for o in result.outputs:
        run.outputs[o.request_id] += o.new_token_ids
        if o.finished:
            run.finish[o.request_id] = o.finish_reason
            run.stop_reason[o.request_id] = o.stop_reason


def run_all(sched, runner=None, max_steps=5000, before_step=None):
    runner = runner or FakeRunner(sched.kv_cache_manager.num_blocks)
    run = Run()
    for i in range(max_steps):
        if before_step:
            before_step(i)
        if not sched.has_unfinished_requests():
            return run
        step(sched, runner, run)
    raise AssertionError("requests did not finish")


def run_all_overlapped(sched, runner=None, max_steps=5000, before_step=None):
    """EngineCore's async loop: step N+1 is scheduled and run before step N's
    tokens reach the scheduler. The fake runner knows the tokens it sampled,
    as the real one reads them from the device."""
    assert sched.async_scheduling
    runner = runner or FakeRunner(sched.kv_cache_manager.num_blocks)
    run = Run()
    in_flight = None
    for i in range(max_steps):
        if before_step:
            before_step(i)
        if not sched.has_unfinished_requests() and in_flight is None:
            return run
        previous, in_flight = in_flight, None
        if sched.has_unfinished_requests():
            out = sched.schedule()
            check_step(sched, out)
            run.steps.append(out)
            in_flight = (out, runner.execute(out))
        if previous is not None:
            record(run, sched.update_from_output(*previous))
    raise AssertionError("requests did not finish")


def assert_no_leak(sched):
    kv = sched.kv_cache_manager
    assert kv.num_free_blocks == kv.num_blocks
    assert all(b.ref_cnt == 0 for b in kv.block_pool.blocks)
    assert kv.req_to_blocks == {}
    assert sched.requests == {}


# -- admission, budgets, chunking ------------------------------------------


def test_chunked_prefill_splits_a_long_prompt_across_steps():
    sched = make_scheduler(budget=16)
    sched.add_request(make_request("a", range(40), max_tokens=1))
    run = run_all(sched)
    assert [s.num_scheduled_tokens for s in run.steps] == [{"a": 16}, {"a": 16}, {"a": 8}]
    assert run.outputs["a"] == expected_output(range(40), 1)


def test_a_request_mid_prefill_is_sent_as_cached_with_its_new_blocks():
    sched = make_scheduler(budget=16)
    sched.add_request(make_request("a", range(40), max_tokens=1))
    first = sched.schedule()
    assert len(first.scheduled_new_reqs[0].block_ids) == 4
    sched.update_from_output(first, ModelRunnerOutput({}))
    second = sched.schedule()
    assert second.scheduled_new_reqs == []
    assert second.scheduled_cached_reqs.req_ids == ["a"]
    assert second.scheduled_cached_reqs.num_computed_tokens == [16]
    assert len(second.scheduled_cached_reqs.new_block_ids[0]) == 4


def test_decodes_are_scheduled_before_waiting_prefills():
    sched = make_scheduler(budget=8)
    runner = FakeRunner(64)
    run = Run()
    sched.add_request(make_request("a", range(5), max_tokens=10))
    step(sched, runner, run)
    sched.add_request(make_request("b", range(100, 130)))
    out, _ = step(sched, runner, run)
    assert out.num_scheduled_tokens == {"a": 1, "b": 7}


def test_a_running_prefill_continues_before_new_requests_start():
    sched = make_scheduler(budget=10)
    runner = FakeRunner(64)
    run = Run()
    sched.add_request(make_request("a", range(25)))
    step(sched, runner, run)
    sched.add_request(make_request("b", range(100, 110)))
    out, _ = step(sched, runner, run)
    assert out.num_scheduled_tokens == {"a": 10}


def test_max_num_seqs_caps_the_running_batch():
    sched = make_scheduler(max_num_seqs=2)
    for i in range(4):
        sched.add_request(make_request(f"r{i}", [i] * 3))
    out = sched.schedule()
    assert set(out.num_scheduled_tokens) == {"r0", "r1"}
    assert len(sched.waiting) == 2


def test_budget_and_max_num_seqs_hold_every_step():
    rng = random.Random(0)
    sched = make_scheduler(num_blocks=48, max_num_seqs=5, budget=20)
    for i in range(30):
        prompt = [rng.randrange(VOCAB) for _ in range(rng.randint(1, 50))]
        sched.add_request(make_request(f"r{i}", prompt, max_tokens=rng.randint(1, 20)))
    run = run_all(sched)  # check_step asserts the limits at every step
    assert len(run.finish) == 30
    assert max(len(s.num_scheduled_tokens) for s in run.steps) == 5
    assert max(s.total_num_scheduled_tokens for s in run.steps) == 20


def test_a_waiting_request_that_does_not_fit_blocks_those_behind_it():
    sched = make_scheduler(num_blocks=10, budget=64, max_model_len=40)
    runner = FakeRunner(10)
    run = Run()
    sched.add_request(make_request("a", range(20), max_tokens=8))
    step(sched, runner, run)
    sched.add_request(make_request("big", range(100, 130)))
    sched.add_request(make_request("small", [7]))
    out, _ = step(sched, runner, run)
    assert out.num_scheduled_tokens == {"a": 1}
    assert [r.request_id for r in sched.waiting] == ["big", "small"]


def test_first_scheduling_records_time_and_cached_tokens():
    sched = make_scheduler()
    sched.add_request(make_request("a", range(9)))
    run_all(sched)
    sched.add_request(b := make_request("b", range(9)))
    assert b.first_scheduled_time is None
    sched.schedule()
    assert b.num_cached_tokens == 8
    assert b.first_scheduled_time is not None


def test_outputs_carry_num_cached_tokens():
    sched = make_scheduler()
    sched.add_request(make_request("a", range(9), max_tokens=1))
    run_all(sched)
    sched.add_request(make_request("b", range(9), max_tokens=1))
    out = sched.schedule()
    result = sched.update_from_output(out, ModelRunnerOutput({"b": [3]}))
    assert result.outputs[0].num_cached_tokens == 8


# -- prefix sharing --------------------------------------------------------


def test_n2_siblings_scheduled_in_one_step_share_the_prompt_blocks():
    sched = make_scheduler()
    sched.add_request(make_request("s0", range(10)))
    sched.add_request(make_request("s1", range(10)))
    out = sched.schedule()
    ids0, ids1 = (new.block_ids for new in out.scheduled_new_reqs)
    assert ids1[:2] == ids0[:2] and ids1[2] != ids0[2]
    assert out.num_scheduled_tokens == {"s0": 10, "s1": 2}
    pool = sched.kv_cache_manager.block_pool
    assert [pool.blocks[i].ref_cnt for i in ids0] == [2, 2, 1]


def test_n2_siblings_produce_the_right_outputs_and_free_everything():
    sched = make_scheduler()
    for i in range(2):
        sched.add_request(make_request(f"s{i}", range(10), max_tokens=12))
    run = run_all(sched)
    assert run.outputs["s0"] == run.outputs["s1"] == expected_output(range(10), 12)
    assert_no_leak(sched)


def test_a_later_request_reuses_a_finished_requests_prefix():
    sched = make_scheduler()
    sched.add_request(make_request("a", range(13)))
    run_all(sched)
    sched.add_request(make_request("b", [*range(12), 55]))
    out = sched.schedule()
    assert out.scheduled_new_reqs[0].num_computed_tokens == 12
    assert out.num_scheduled_tokens == {"b": 1}


# -- preemption ------------------------------------------------------------


def fill_three_decoders(sched, runner, run):
    for i in range(3):
        sched.add_request(make_request(f"r{i}", [i] * 8, max_tokens=20, max_model_len=32))
    step(sched, runner, run)  # each holds 2 full blocks; the next token needs a third


def test_preemption_picks_the_newest_running_request():
    sched = make_scheduler(num_blocks=8, max_model_len=32)
    runner = FakeRunner(8)
    run = Run()
    fill_three_decoders(sched, runner, run)
    out, _ = step(sched, runner, run)
    assert set(out.num_scheduled_tokens) == {"r0", "r1"}
    assert [r.request_id for r in sched.running] == ["r0", "r1"]
    victim = sched.waiting[0]
    assert victim.request_id == "r2"
    assert victim.status == RequestStatus.PREEMPTED
    assert victim.num_computed_tokens == 0 and victim.num_preemptions == 1
    assert victim.output_token_ids == run.outputs["r2"]


def test_a_request_preempts_itself_when_it_is_the_newest():
    sched = make_scheduler(num_blocks=8, max_model_len=32)
    runner = FakeRunner(8)
    run = Run()
    fill_three_decoders(sched, runner, run)
    sched.abort_requests(["r0"])
    sched.add_request(make_request("hog", range(200, 208), max_tokens=20, max_model_len=32))
    step(sched, runner, run)  # hog is admitted; 8 of 8 blocks in use
    out, _ = step(sched, runner, run)
    assert sched.waiting[0].request_id == "hog"
    assert "hog" not in out.num_scheduled_tokens


def test_a_preempted_request_is_dropped_from_the_runner_in_the_same_step():
    sched = make_scheduler(num_blocks=8, max_model_len=32)
    runner = FakeRunner(8)
    run = Run()
    fill_three_decoders(sched, runner, run)
    out, _ = step(sched, runner, run)
    assert "r2" in out.finished_req_ids


def test_no_waiting_request_is_admitted_in_a_step_that_preempted():
    sched = make_scheduler(num_blocks=8, max_model_len=32)
    runner = FakeRunner(8)
    run = Run()
    fill_three_decoders(sched, runner, run)
    out, _ = step(sched, runner, run)
    assert out.scheduled_new_reqs == []


def test_a_resumed_request_is_sent_again_with_prompt_and_output():
    sched = make_scheduler(num_blocks=8, max_model_len=32)
    runner = FakeRunner(8)
    run = Run()
    fill_three_decoders(sched, runner, run)
    step(sched, runner, run)
    sched.abort_requests(["r0"])
    output_so_far = list(run.outputs["r2"])
    out, _ = step(sched, runner, run)
    [resumed] = out.scheduled_new_reqs
    assert resumed.req_id == "r2"
    assert resumed.prompt_token_ids == [2] * 8
    assert resumed.output_token_ids == output_so_far == [next_token([2] * 8)]
    assert resumed.num_computed_tokens == 8  # its full prompt blocks were still cached


def test_a_preempted_request_ends_with_its_unpreempted_output():
    def workload(sched):
        for i in range(6):
            sched.add_request(
                make_request(f"r{i}", [i, i + 1] * 5, max_tokens=22, max_model_len=32)
            )

    roomy = make_scheduler(num_blocks=64, max_model_len=32)
    workload(roomy)
    reference = run_all(roomy)
    tight = make_scheduler(num_blocks=10, max_model_len=32)
    workload(tight)
    run = run_all(tight)
    assert tight.num_preemptions > 0
    assert dict(run.outputs) == dict(reference.outputs)
    assert run.outputs["r5"] == expected_output([5, 6] * 5, 22)
    assert_no_leak(tight)


def test_preemptions_are_counted_in_stats():
    sched = make_scheduler(num_blocks=8, max_model_len=32)
    runner = FakeRunner(8)
    run = Run()
    fill_three_decoders(sched, runner, run)
    _, result = step(sched, runner, run)
    assert result.scheduler_stats.num_preemptions == 1


# -- stop conditions -------------------------------------------------------


def finish_of(sched, request, tokens):
    """Feed `tokens` as the model's samples, one per step; return the output."""
    sched.add_request(request)
    new_tokens = []
    for token in tokens:
        out = sched.schedule()
        result = sched.update_from_output(out, ModelRunnerOutput({request.request_id: [token]}))
        [o] = result.outputs
        new_tokens += o.new_token_ids
        if o.finished:
            return new_tokens, o.finish_reason, o.stop_reason
    return new_tokens, None, None


def test_max_tokens_finishes_with_length():
    sched = make_scheduler()
    got = finish_of(sched, make_request("a", [1, 2], max_tokens=3), [5, 6, 7, 8])
    assert got == ([5, 6, 7], FinishReason.LENGTH, None)


def test_max_model_len_finishes_with_length():
    sched = make_scheduler(max_model_len=16)
    request = make_request("a", range(13), max_tokens=None, max_model_len=16)
    assert finish_of(sched, request, [5] * 10) == ([5, 5, 5], FinishReason.LENGTH, None)


def test_eos_finishes_with_stop_and_is_returned():
    sched = make_scheduler()
    got = finish_of(sched, make_request("a", [1], max_tokens=10, eos=2), [5, 2, 7])
    assert got == ([5, 2], FinishReason.STOP, None)


def test_eos_is_ignored_with_ignore_eos():
    sched = make_scheduler()
    request = make_request("a", [1], max_tokens=3, eos=2, ignore_eos=True)
    assert finish_of(sched, request, [2, 2, 2]) == ([2, 2, 2], FinishReason.LENGTH, None)


def test_eos_before_min_tokens_does_not_stop():
    sched = make_scheduler()
    request = make_request("a", [1], max_tokens=10, eos=2, min_tokens=3)
    assert finish_of(sched, request, [2, 2, 2, 2]) == ([2, 2, 2], FinishReason.STOP, None)


def test_stop_token_id_finishes_with_stop_and_names_the_token():
    sched = make_scheduler()
    request = make_request("a", [1], max_tokens=10, stop_token_ids=[9, 8])
    assert finish_of(sched, request, [5, 8, 1]) == ([5, 8], FinishReason.STOP, 8)


def test_stop_token_id_before_min_tokens_does_not_stop():
    sched = make_scheduler()
    request = make_request("a", [1], max_tokens=10, stop_token_ids=[8], min_tokens=2)
    assert finish_of(sched, request, [8, 5, 8]) == ([8, 5, 8], FinishReason.STOP, 8)


def test_max_tokens_wins_over_eos_on_the_same_token():
    sched = make_scheduler()
    request = make_request("a", [1], max_tokens=2, eos=2)
    assert finish_of(sched, request, [5, 2]) == ([5, 2], FinishReason.LENGTH, None)


def test_a_finished_request_frees_its_blocks_and_leaves_the_runner_next_step():
    sched = make_scheduler()
    finish_of(sched, make_request("a", range(9), max_tokens=1), [5])
    assert sched.kv_cache_manager.num_free_blocks == 64
    assert not sched.has_unfinished_requests()
    assert "a" in sched.schedule().finished_req_ids


def test_a_request_mid_prefill_produces_no_tokens_only_its_events():
    sched = make_scheduler(budget=4)
    sched.add_request(make_request("a", range(9)))
    out = sched.schedule()
    (only,) = sched.update_from_output(out, ModelRunnerOutput({})).outputs
    assert only.new_token_ids == [] and not only.finished
    assert [e.type for e in only.events] == [
        EngineCoreEventType.QUEUED,
        EngineCoreEventType.SCHEDULED,
    ]
    out = sched.schedule()
    assert sched.update_from_output(out, ModelRunnerOutput({})).outputs == []


# -- events ------------------------------------------------------------------


def test_events_report_queueing_admission_and_preemption_once_each():
    sched = make_scheduler(num_blocks=8, max_model_len=32)
    runner = FakeRunner(8)
    run = Run()
    events: dict[str, list] = defaultdict(list)

    def record(result):
        for o in result.outputs:
            events[o.request_id] += [e.type for e in o.events or ()]

    for i in range(3):
        sched.add_request(make_request(f"r{i}", [i] * 8, max_tokens=20, max_model_len=32))
    while sched.has_unfinished_requests():
        record(step(sched, runner, run)[1])
    q, s, p = (
        EngineCoreEventType.QUEUED,
        EngineCoreEventType.SCHEDULED,
        EngineCoreEventType.PREEMPTED,
    )
    assert events["r0"] == [q, s]
    # r2, the newest, is preempted when blocks run out, then admitted again.
    assert events["r2"][:3] == [q, s, p] and events["r2"].count(s) == events["r2"].count(p) + 1


def test_event_timestamps_are_in_order_and_on_the_monotonic_clock():
    import time

    sched = make_scheduler()
    before = time.monotonic()
    sched.add_request(make_request("a", range(9)))
    out = sched.schedule()
    (only,) = sched.update_from_output(out, FakeRunner(64).execute(out)).outputs
    times = [e.timestamp for e in only.events]
    assert before <= times[0] <= times[1] <= time.monotonic()


# -- aborts ----------------------------------------------------------------


def test_abort_frees_blocks_and_tells_the_runner_next_step():
    sched = make_scheduler()
    sched.add_request(make_request("a", range(9)))
    sched.add_request(make_request("w", range(9)))
    sched.schedule()
    sched.abort_requests(["a", "w"])
    assert sched.kv_cache_manager.num_free_blocks == 64
    assert not sched.has_unfinished_requests()
    assert sched.schedule().finished_req_ids == {"a", "w"}


def test_abort_sets_the_aborted_status():
    sched = make_scheduler()
    sched.add_request(request := make_request("a", range(9)))
    sched.abort_requests(["a"])
    assert request.status == RequestStatus.FINISHED_ABORTED
    assert request.get_finish_reason() == FinishReason.ABORT


def test_abort_of_unknown_ids_is_ignored():
    sched = make_scheduler()
    sched.add_request(make_request("a", range(3)))
    sched.abort_requests(["nope"])
    assert sched.get_num_unfinished_requests() == 1


def test_tokens_for_a_request_aborted_after_scheduling_are_dropped():
    sched = make_scheduler()
    sched.add_request(make_request("a", range(3)))
    out = sched.schedule()
    sched.abort_requests(["a"])
    assert sched.update_from_output(out, ModelRunnerOutput({"a": [1]})).outputs == []


def random_workload_run(seed, overlap):
    """80 requests on a tiny pool (preemptions), chunked prefills, shared
    prefixes (hits), some stopping on EOS, 5% aborted at random: every
    request that finishes has exactly its expected output, nothing leaks."""
    rng = random.Random(seed)
    sched = make_scheduler(
        num_blocks=12, max_num_seqs=6, budget=12, max_model_len=40, overlap=overlap
    )
    prefixes = [[rng.randrange(VOCAB) for _ in range(rng.randint(0, 12))] for _ in range(4)]
    specs = {}
    for i in range(80):
        prompt = rng.choice(prefixes) + [rng.randrange(VOCAB) for _ in range(rng.randint(1, 14))]
        max_tokens = rng.randint(1, 40 - len(prompt))
        # Some requests stop on a token they will produce.
        eos = rng.choice(expected_output(prompt, max_tokens)) if rng.random() < 0.3 else None
        specs[f"r{i}"] = (prompt, max_tokens, eos)
        sched.add_request(
            make_request(f"r{i}", prompt, max_tokens=max_tokens, eos=eos, max_model_len=40)
        )
    aborted = set()

    def maybe_abort(_):
        if rng.random() < 0.05 and sched.requests:
            victim = rng.choice(sorted(sched.requests))
            aborted.add(victim)
            sched.abort_requests([victim])

    loop = run_all_overlapped if overlap else run_all
    run = loop(sched, before_step=maybe_abort)
    assert sched.num_preemptions > 0 and aborted
    assert sched.kv_cache_manager.prefix_cache_hits > 0
    assert set(run.finish) == set(specs) - aborted
    for req_id in run.finish:
        assert run.outputs[req_id] == expected_until_stop(*specs[req_id]), req_id
    assert_no_leak(sched)


def expected_until_stop(prompt, max_tokens, eos):
    tokens = []
    for token in expected_output(prompt, max_tokens):
        tokens.append(token)
        if token == eos:
            break
    return tokens


def test_random_workload_with_aborts_and_a_tiny_pool_leaks_nothing():
    random_workload_run(1, overlap=False)


# -- stats, config, bad input ---------------------------------------------


def test_stats_report_queues_usage_and_prefix_counters():
    sched = make_scheduler(max_num_seqs=1)
    sched.add_request(make_request("a", range(9)))
    sched.add_request(make_request("b", range(9)))
    out = sched.schedule()
    stats = sched.update_from_output(out, ModelRunnerOutput({"a": [1]})).scheduler_stats
    assert stats == SchedulerStats(
        num_running_reqs=1,
        num_waiting_reqs=1,
        kv_cache_usage=3 / 64,
        prefix_cache_queries=9,
        prefix_cache_hits=0,
        num_preemptions=0,
    )


def test_with_caching_off_outputs_are_right_and_nothing_is_hit():
    sched = make_scheduler(caching=False)
    for i in range(3):
        sched.add_request(make_request(f"r{i}", range(10), max_tokens=6))
    run = run_all(sched)
    assert all(out == expected_output(range(10), 6) for out in run.outputs.values())
    assert sched.make_stats().prefix_cache_hits == 0
    assert_no_leak(sched)


def test_a_cache_smaller_than_max_model_len_is_rejected():
    with pytest.raises(ValueError, match="max_model_len"):
        make_scheduler(num_blocks=3, max_model_len=16)


def test_an_empty_prompt_is_rejected():
    with pytest.raises(InvalidRequestError) as err:
        make_scheduler().add_request(make_request("a", []))
    assert err.value.param == "prompt"


def test_a_prompt_longer_than_max_model_len_is_rejected():
    with pytest.raises(InvalidRequestError):
        make_scheduler(max_model_len=16).add_request(make_request("a", range(17)))


# -- LoRA: at most max_loras adapters a step, FCFS across adapters ------------


def lora_scheduler(max_loras, **kwargs):
    sched = make_scheduler(**kwargs)
    sched.scheduler_config.max_loras = max_loras
    return sched


def lora_request(req_id, prompt, lora_id, **kwargs):
    from pagoda.runtime.lora.request import LoRARequest

    request = make_request(req_id, prompt, **kwargs)
    if lora_id:
        request.lora_request = LoRARequest(f"adapter-{lora_id}", lora_id, "/unused")
    return request


def test_a_lora_request_is_refused_by_an_engine_without_lora():
    sched = make_scheduler()
    with pytest.raises(InvalidRequestError, match="enable-lora"):
        sched.add_request(lora_request("a", range(4), 1))


@pytest.mark.parametrize("max_loras", [1, 2, 3])
def test_no_step_holds_more_than_max_loras_adapters_and_all_finish(max_loras):
    rng = random.Random(max_loras)
    sched = lora_scheduler(max_loras, num_blocks=128, budget=32)
    prompts = {}
    for i in range(40):
        prompt = [rng.randrange(VOCAB) for _ in range(rng.randint(3, 20))]
        prompts[str(i)] = (prompt, max_tokens := rng.randint(1, 8))
        sched.add_request(
            lora_request(str(i), prompt, rng.choice([0, 1, 2, 3, 4]), max_tokens=max_tokens)
        )
    lora_of = {rid: r.lora_int_id for rid, r in sched.requests.items()}
    run = run_all(sched)
    for out in run.steps:
        adapters = {lora_of[rid] for rid in out.num_scheduled_tokens} - {0}
        assert len(adapters) <= max_loras
    assert all(run.outputs[rid] == expected_output(p, n) for rid, (p, n) in prompts.items())
    assert_no_leak(sched)


def test_adapters_are_served_first_come_first_served():
    # max_loras 1: "b" (adapter 2) waits for "a" (adapter 1) to finish; "c"
    # (adapter 1, whose slot is busy) must not overtake "b", or a stream of
    # adapter-1 requests would starve adapter 2. Base "d" needs no slot.
    sched = lora_scheduler(1)
    sched.add_request(lora_request("a", range(4), 1, max_tokens=3))
    sched.add_request(lora_request("b", range(10, 14), 2, max_tokens=3))
    sched.add_request(lora_request("c", range(20, 24), 1, max_tokens=3))
    sched.add_request(lora_request("d", range(30, 34), 0, max_tokens=3))
    run = run_all(sched)
    first_step = {}
    for i, out in enumerate(run.steps):
        for rid in out.num_scheduled_tokens:
            first_step.setdefault(rid, i)
    assert first_step["a"] == first_step["d"] == 0
    assert first_step["a"] < first_step["b"] < first_step["c"]
    # The waiting requests keep their arrival order in the queue.
    assert_no_leak(sched)


def test_stats_count_requests_per_adapter_only_with_lora_on():
    sched = lora_scheduler(1)
    for rid, lora in (("a", 1), ("b", 2), ("c", 1), ("d", 0)):
        sched.add_request(lora_request(rid, range(4), lora, max_tokens=3))
    out = sched.schedule()
    sched.update_from_output(out, FakeRunner(64).execute(out))
    stats = sched.make_stats()
    assert stats.running_loras == {1: 1}
    assert stats.waiting_loras == {2: 1, 1: 1}
    plain = make_scheduler()
    plain.add_request(make_request("a", range(4)))
    plain.schedule()
    assert plain.make_stats().running_loras == {} == plain.make_stats().waiting_loras


# -- async scheduling --------------------------------------------------------


def test_overlapped_decodes_follow_their_prefill_without_waiting_for_its_token():
    sched = make_scheduler(overlap=True)
    sched.add_request(make_request("a", range(6), max_tokens=4))
    runner = FakeRunner(64)
    first = sched.schedule()
    runner.execute(first)
    # The prefill's token is not back, yet the next step computes it.
    second = sched.schedule()
    assert second.num_scheduled_tokens == {"a": 1}
    assert second.scheduled_cached_reqs.num_computed_tokens == [6]
    assert sched.requests["a"].num_output_placeholders == 2


def test_overlapped_runs_no_step_past_max_tokens():
    sched = make_scheduler(overlap=True)
    sched.add_request(make_request("a", range(6), max_tokens=3))
    run = run_all_overlapped(sched)
    assert run.outputs["a"] == expected_output(range(6), 3)
    assert run.finish["a"] == FinishReason.LENGTH
    # A prefill, then one decode per further token: none is wasted (the last
    # step is empty: it only carries the finished id to the runner).
    assert [s.num_scheduled_tokens for s in run.steps] == [{"a": 6}, {"a": 1}, {"a": 1}, {}]
    assert_no_leak(sched)


def test_overlapped_max_model_len_caps_scheduling_too():
    sched = make_scheduler(max_model_len=16, overlap=True)
    sched.add_request(make_request("a", range(13), max_tokens=None, max_model_len=16))
    run = run_all_overlapped(sched)
    assert run.outputs["a"] == expected_output(range(13), 3)
    assert len([s for s in run.steps if not s.is_empty]) == 3
    assert_no_leak(sched)


def test_overlapped_stop_on_eos_drops_the_token_already_in_flight():
    prompt = list(range(6))
    eos = expected_output(prompt, 3)[1]
    sched = make_scheduler(overlap=True)
    sched.add_request(make_request("a", prompt, max_tokens=10, eos=eos))
    run = run_all_overlapped(sched)
    assert run.outputs["a"] == expected_output(prompt, 2)
    assert run.finish["a"] == FinishReason.STOP
    # The step after the EOS was scheduled before the EOS was seen; its token
    # went nowhere.
    assert len([s for s in run.steps if not s.is_empty]) == 3
    assert_no_leak(sched)


def test_overlapped_abort_with_a_step_in_flight_drops_its_token():
    sched = make_scheduler(overlap=True)
    sched.add_request(make_request("a", range(6), max_tokens=10))
    runner = FakeRunner(64)
    out = sched.schedule()
    result = runner.execute(out)
    sched.abort_requests(["a"])
    assert sched.update_from_output(out, result).outputs == []
    assert "a" in sched.schedule().finished_req_ids
    assert_no_leak(sched)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_overlapped_random_workload_gives_the_sync_outputs_and_leaks_nothing(seed):
    """The overlapped loop through preemptions with a token in flight, stops
    that land a step late and aborts: every request's output is the one the
    synchronous loop gives."""
    random_workload_run(seed, overlap=True)
