"""The scheduler with speculative decoding: drafts ride on decodes within the
token budget, rejected drafts' KV slots are taken back (rewritten before they
are read, never in the prefix cache), stops inside an accepted run cut it,
and no block leaks through rejections, aborts and preemptions.

A fake runner stores token ids in KV slots and reads every request's context
back through its block table each step, so a slot holding a rejected draft
where a verified token belongs is caught, in its own request or in another
that hit the block in the prefix cache. Its "model" is a fixed function of
the context; drafts are that function's tokens, corrupted at random.
"""

import random
from dataclasses import dataclass, field

from pagoda.runtime.config import CacheConfig, SchedulerConfig
from pagoda.runtime.core.request import Request
from pagoda.runtime.core.sched_output import ModelRunnerOutput
from pagoda.runtime.core.scheduler import Scheduler
from pagoda.runtime.sampling_params import SamplingParams
from pagoda.runtime.spec_decode.config import SpeculativeConfig

BS = 4
VOCAB = 50


def next_token(tokens):
    return hash(tuple(tokens)) % VOCAB


def expected_output(prompt, n):
    tokens = list(prompt)
    for _ in range(n):
        tokens.append(next_token(tokens))
    return tokens[len(prompt) :]


@dataclass
class _State:
    tokens: list
    blocks: list
    computed: int


@dataclass
class SpecFakeRunner:
    num_blocks: int
    k: int
    accuracy: float
    rng: random.Random = field(default_factory=lambda: random.Random(0))
    reqs: dict = field(default_factory=dict)

    def __post_init__(self):
        self.kv = [None] * (self.num_blocks * BS)

    def slot(self, st, pos):
        return st.blocks[pos // BS] * BS + pos % BS

    def execute(self, out):
        for req_id in out.finished_req_ids:
            self.reqs.pop(req_id, None)
        for new in out.scheduled_new_reqs:
            tokens = list(new.prompt_token_ids) + list(new.output_token_ids)
            self.reqs[new.req_id] = _State(tokens, list(new.block_ids), new.num_computed_tokens)
        cached = out.scheduled_cached_reqs
        for req_id, block_ids, computed in zip(
            cached.req_ids, cached.new_block_ids, cached.num_computed_tokens
        ):
            st = self.reqs[req_id]
            st.computed = computed  # rolled back after a rejection
            st.blocks.extend(block_ids)
        spec = out.scheduled_spec_decode_tokens
        for req_id, n in out.num_scheduled_tokens.items():
            st = self.reqs[req_id]
            drafts = spec.get(req_id, [])
            inputs = st.tokens + drafts
            assert st.computed + n == len(inputs) or not drafts
            for pos in range(st.computed, st.computed + n):
                self.kv[self.slot(st, pos)] = inputs[pos]
        sampled, proposals = {}, {}
        for req_id, n in out.num_scheduled_tokens.items():
            st = self.reqs[req_id]
            st.computed += n
            drafts = spec.get(req_id, [])
            verified = st.computed - len(drafts)
            context = [self.kv[self.slot(st, p)] for p in range(verified)]
            assert context == st.tokens[:verified], f"{req_id} read wrong KV"
            if verified != len(st.tokens):
                continue
            emitted = []
            for d in drafts:
                truth = next_token(st.tokens + emitted)
                emitted.append(truth)
                if d != truth:
                    break
            else:
                emitted.append(next_token(st.tokens + emitted))
            st.tokens += emitted
            st.computed = len(st.tokens) - 1
            sampled[req_id] = emitted
            proposals[req_id] = self.propose(st.tokens)
        return ModelRunnerOutput(sampled_token_ids=sampled, spec_token_ids=proposals)

    def propose(self, tokens):
        drafts = []
        for _ in range(self.k):
            t = next_token(tokens + drafts)
            if self.rng.random() > self.accuracy:
                t = (t + 1) % VOCAB
            drafts.append(t)
        return drafts


def make(num_blocks=64, budget=64, k=3, accuracy=0.7, max_model_len=128, lookahead=False):
    spec = SpeculativeConfig(
        method="draft_model" if lookahead else "ngram", num_speculative_tokens=k
    )
    sched = Scheduler(
        SchedulerConfig(
            max_num_seqs=16, max_num_batched_tokens=budget, max_model_len=max_model_len
        ),
        CacheConfig(block_size=BS),
        num_blocks,
        spec,
    )
    return sched, SpecFakeRunner(num_blocks, k, accuracy)


def request(req_id, prompt, max_tokens=20, **params):
    return Request(
        request_id=req_id,
        prompt_token_ids=list(prompt),
        sampling_params=SamplingParams(max_tokens=max_tokens, **params),
        max_model_len=128,
    )


def run(sched, runner, abort_at=None):
    outputs: dict = {}
    steps = 0
    while sched.has_unfinished_requests():
        out = sched.schedule()
        assert out.total_num_scheduled_tokens <= sched.max_num_batched_tokens
        for req_id, drafts in out.scheduled_spec_decode_tokens.items():
            assert out.num_scheduled_tokens[req_id] == 1 + len(drafts)
        result = sched.update_from_output(out, runner.execute(out))
        for o in result.outputs:
            outputs.setdefault(o.request_id, []).extend(o.new_token_ids)
        steps += 1
        if abort_at and steps in abort_at:
            sched.abort_requests(abort_at[steps])
    return outputs, steps


def test_outputs_equal_the_model_alone_and_fewer_steps_are_needed():
    prompts = {f"r{i}": [i, i + 1, i + 2, 7, 8] for i in range(6)}
    sched, runner = make(accuracy=0.8)
    for req_id, p in prompts.items():
        sched.add_request(request(req_id, p, max_tokens=30))
    outputs, steps = run(sched, runner)
    for req_id, p in prompts.items():
        assert outputs[req_id] == expected_output(p, 30)
    assert steps < 30
    stats = sched.make_stats().spec_decoding
    assert 0 < stats.num_accepted_tokens < stats.num_draft_tokens
    assert sum(stats.num_accepted_tokens_per_pos) == stats.num_accepted_tokens
    assert stats.num_accepted_tokens_per_pos[0] >= stats.num_accepted_tokens_per_pos[-1]
    assert sched.kv_cache_manager.usage == 0.0


def test_drafts_fit_in_the_token_budget():
    sched, runner = make(budget=6, k=5, accuracy=1.0)
    for i in range(3):
        sched.add_request(request(f"r{i}", [i, 1, 2], max_tokens=12))
    outputs, _ = run(sched, runner)
    for i in range(3):
        assert outputs[f"r{i}"] == expected_output([i, 1, 2], 12)


def test_max_tokens_inside_an_accepted_run_stops_exactly_there():
    sched, runner = make(k=5, accuracy=1.0)
    sched.add_request(request("a", [1, 2, 3], max_tokens=7))
    outputs, _ = run(sched, runner)
    assert outputs["a"] == expected_output([1, 2, 3], 7)


def test_a_stop_token_inside_an_accepted_run_drops_what_follows():
    full = expected_output([1, 2, 3], 20)
    stop = full[5]
    cut = full[: full.index(stop) + 1]
    sched, runner = make(k=5, accuracy=1.0)
    sched.add_request(request("a", [1, 2, 3], max_tokens=20, stop_token_ids=[stop]))
    outputs, _ = run(sched, runner)
    assert outputs["a"] == cut


def test_no_block_leaks_through_rejections_aborts_and_preemptions():
    rng = random.Random(3)
    # 24 blocks of 4 cannot hold 8 requests of up to 60 tokens: preemptions.
    sched, runner = make(
        num_blocks=24, budget=32, k=4, accuracy=0.5, max_model_len=64, lookahead=True
    )
    prompts = {
        f"r{i}": [rng.randrange(VOCAB) for _ in range(rng.randrange(3, 12))] for i in range(8)
    }
    for req_id, p in prompts.items():
        sched.add_request(request(req_id, p, max_tokens=40))
    outputs, _ = run(sched, runner, abort_at={5: ["r1"], 9: ["r6"]})
    for req_id, p in prompts.items():
        if req_id not in ("r1", "r6"):
            assert outputs[req_id] == expected_output(p, 40)
    assert sched.num_preemptions > 0
    kv = sched.kv_cache_manager
    assert kv.usage == 0.0 and not kv.req_to_blocks
    assert kv.num_free_blocks == kv.num_blocks


def test_prefix_cache_holds_only_verified_tokens():
    # The same prompt again after a speculative run hits every full block of
    # its prompt; the fake runner's read-back check proves their contents.
    prompt = [5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15]
    hits = []
    for spec_accuracy in (0.5, None):
        if spec_accuracy is None:
            sched = Scheduler(
                SchedulerConfig(max_num_seqs=16, max_num_batched_tokens=64, max_model_len=128),
                CacheConfig(block_size=BS),
                64,
            )
            runner = SpecFakeRunner(64, 0, 1.0)
        else:
            sched, runner = make(accuracy=spec_accuracy)
        sched.add_request(request("first", prompt, max_tokens=25))
        run(sched, runner)
        sched.add_request(request("again", prompt + expected_output(prompt, 25), max_tokens=5))
        outputs, _ = run(sched, runner)
        assert outputs["again"] == expected_output(prompt + expected_output(prompt, 25), 5)
        hits.append(sched.make_stats().prefix_cache_hits)
    assert hits[0] == hits[1] > 0


def test_a_request_is_never_preempted_for_its_drafts():
    # Exactly enough blocks for both requests' verified tokens: drafts that
    # need one more block are dropped, nobody is preempted.
    sched, runner = make(num_blocks=8, budget=64, k=4, accuracy=1.0, max_model_len=16)
    sched.add_request(request("a", [1, 2, 3], max_tokens=12))
    sched.add_request(request("b", [4, 5, 6], max_tokens=12))
    outputs, _ = run(sched, runner)
    assert outputs["a"] == expected_output([1, 2, 3], 12)
    assert outputs["b"] == expected_output([4, 5, 6], 12)
    assert sched.num_preemptions == 0
