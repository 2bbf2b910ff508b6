"""Continuous batching: which requests compute how many tokens each step.

The whole decision is `{request_id: num_new_tokens}` under one token budget,
so prefill chunks and decodes are the same thing (vLLM V1's design). Running
requests go first, in admission order: a decode takes one token, a request in
the middle of a chunked prefill takes what remains of its prompt or what
remains of the budget. Waiting requests are then admitted first come, first
served, their prefill chunked to fit the budget that is left.

Speculative decoding adds a running request's draft tokens to its decode
(`scheduled_spec_decode_tokens`), within the same budget. After the forward,
the drafts the target rejected are taken back by rolling
`num_computed_tokens` back: their KV slots are rewritten by the next step
before anything reads them, and since only verified tokens key a cached
block, the prefix cache never holds a rejected draft. Drafts are optional:
a request is never preempted to make room for them.

With async scheduling (`SchedulerConfig.async_scheduling`) step N+1 is
scheduled while step N runs, before N's tokens are known: a request that
samples in a step gains an output placeholder, which the next step already
computes (the runner takes its input id from N's sampled tokens on the
device) and `update_from_output` resolves. A request whose placeholders
would take it to max_tokens or max_model_len is not scheduled again; one that
stops on EOS or a stop token after its next step was scheduled has that
step's token discarded. Only known tokens key a cached block, as with drafts.

When blocks run out for a running request, the newest running request is
preempted by recompute: its blocks are freed and it goes back to the front of
the waiting queue with its output so far, to be prefilled again later (much
of it usually straight from the prefix cache).
"""

from __future__ import annotations

import dataclasses
import time
from collections import deque
from collections.abc import Iterable

from pagoda.runtime.config import CacheConfig, SchedulerConfig
from pagoda.runtime.core.events import EngineCoreEvent, EngineCoreEventType
from pagoda.runtime.core.kv_cache_manager import KVCacheManager
from pagoda.runtime.core.outputs import (
    EngineCoreOutput,
    EngineCoreOutputs,
    SchedulerStats,
    SpecDecodingStats,
)
from pagoda.runtime.core.request import Request, RequestStatus
from pagoda.runtime.core.sched_output import (
    CachedRequestData,
    ModelRunnerOutput,
    NewRequestData,
    SchedulerOutput,
)
from pagoda.runtime.sampling_params import InvalidRequestError
from pagoda.runtime.spec_decode.config import SpeculativeConfig


class Scheduler:
    """Decides each step's batch and applies the model's sampled tokens."""

    def __init__(
        self,
        scheduler_config: SchedulerConfig,
        cache_config: CacheConfig,
        num_blocks: int,
        speculative_config: SpeculativeConfig | None = None,
    ) -> None:
        self.scheduler_config = scheduler_config
        self.cache_config = cache_config
        self.max_num_seqs = scheduler_config.max_num_seqs
        self.max_num_batched_tokens = scheduler_config.max_num_batched_tokens
        self.max_model_len = scheduler_config.max_model_len
        capacity = num_blocks * cache_config.block_size
        # A request alone must always fit, or preempting everything else could
        # still leave it stuck: it would preempt itself forever.
        if capacity < self.max_model_len:
            raise ValueError(
                f"max_model_len ({self.max_model_len}) is larger than the KV cache "
                f"holds ({num_blocks} blocks x {cache_config.block_size} = {capacity} "
                "tokens); lower max_model_len or give the cache more memory"
            )
        self.kv_cache_manager = KVCacheManager(
            num_blocks,
            cache_config.block_size,
            cache_config.enable_prefix_caching,
            cache_config.prefix_caching_hash_algo,
        )
        self.requests: dict[str, Request] = {}
        self.waiting: deque[Request] = deque()
        # Admission order, oldest first: the tail is the preemption victim.
        self.running: list[Request] = []
        # Finished or aborted since the last schedule(); the runner drops them.
        self.finished_req_ids: set[str] = set()
        self.num_preemptions = 0
        # Requests with events not yet reported in an output.
        self._with_events: set[str] = set()
        self.speculative_config = speculative_config
        self.num_lookahead_tokens = (
            speculative_config.num_lookahead_tokens if speculative_config else 0
        )
        self.spec_stats = SpecDecodingStats() if speculative_config else None
        self.async_scheduling = scheduler_config.async_scheduling
        assert not (self.async_scheduling and speculative_config), "refused by the config"

    # -- requests in and out -------------------------------------------------

    def add_request(self, request: Request) -> None:
        """Queue a new request (FCFS)."""
        n = request.num_prompt_tokens
        if n == 0:
            raise InvalidRequestError("prompt must not be empty", param="prompt")
        if n > self.max_model_len:
            raise InvalidRequestError(
                f"prompt has {n} tokens, more than max_model_len ({self.max_model_len})",
                param="prompt",
            )
        if request.request_id in self.requests:
            raise ValueError(f"duplicate request id {request.request_id!r}")
        if request.lora_int_id and not self.scheduler_config.max_loras:
            raise InvalidRequestError(
                "this engine serves no LoRA adapters (start it with --enable-lora)",
                param="model",
            )
        self.requests[request.request_id] = request
        self.waiting.append(request)
        self._record(request, EngineCoreEventType.QUEUED)

    def _record(self, request: Request, kind: EngineCoreEventType) -> None:
        request.events.append(EngineCoreEvent(kind, time.monotonic()))
        self._with_events.add(request.request_id)

    def abort_requests(self, request_ids: Iterable[str]) -> None:
        """Finish these requests as aborted and free their blocks; unknown or
        already finished ids are ignored."""
        aborted = set()
        for req_id in request_ids:
            request = self.requests.pop(req_id, None)
            if request is None:
                continue
            request.status = RequestStatus.FINISHED_ABORTED
            self.kv_cache_manager.free(request)
            self.finished_req_ids.add(req_id)
            aborted.add(req_id)
        if aborted:
            # One rebuild per call rather than an O(n) remove per id.
            self.running = [r for r in self.running if r.request_id not in aborted]
            self.waiting = deque(r for r in self.waiting if r.request_id not in aborted)

    def has_unfinished_requests(self) -> bool:
        return bool(self.waiting or self.running)

    def get_num_unfinished_requests(self) -> int:
        return len(self.waiting) + len(self.running)

    # -- one step ------------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        """Pick this step's batch and advance `num_computed_tokens` for it."""
        budget = self.max_num_batched_tokens
        num_scheduled: dict[str, int] = {}
        cached = CachedRequestData()
        preempted: list[Request] = []
        spec: dict[str, list[int]] = {}
        budget = self._schedule_running(budget, num_scheduled, cached, preempted, spec)
        new_reqs: list[NewRequestData] = []
        # As in vLLM: a step that had to preempt is out of blocks, so admitting
        # new work would only thrash (and a preempted request must not be
        # dropped and re-added in one SchedulerOutput).
        if not preempted:
            budget = self._schedule_waiting(budget, num_scheduled, new_reqs)

        finished = self.finished_req_ids
        finished.update(r.request_id for r in preempted)
        self.finished_req_ids = set()
        total = self.max_num_batched_tokens - budget
        assert 0 <= total <= self.max_num_batched_tokens
        assert len(num_scheduled) <= self.max_num_seqs
        return SchedulerOutput(
            scheduled_new_reqs=new_reqs,
            scheduled_cached_reqs=cached,
            num_scheduled_tokens=num_scheduled,
            total_num_scheduled_tokens=total,
            finished_req_ids=finished,
            scheduled_spec_decode_tokens=spec,
        )

    def _schedule_running(
        self,
        budget: int,
        num_scheduled: dict[str, int],
        cached: CachedRequestData,
        preempted: list[Request],
        scheduled_spec: dict[str, list[int]],
    ) -> int:
        allocate = self.kv_cache_manager.allocate_slots
        running = self.running
        req_ids, new_block_ids, computed = (
            cached.req_ids,
            cached.new_block_ids,
            cached.num_computed_tokens,
        )
        overlap = self.async_scheduling
        i = 0
        while i < len(running) and budget > 0:
            request = running[i]
            pending = request.num_output_placeholders
            if pending and (
                len(request.output_token_ids) + pending >= request.max_tokens
                or len(request.all_token_ids) + pending >= self.max_model_len
            ):
                # The token in flight is its last: nothing more to compute.
                i += 1
                continue
            num_known = len(request.all_token_ids) + pending
            num_new = num_known - request.num_computed_tokens
            if num_new > budget:
                num_new = budget
            if num_new <= 0:
                # Finished its prompt but the runner sampled nothing: nothing
                # to compute until it does.
                i += 1
                continue
            drafts = self._drafts_to_verify(request, num_new, budget)
            lookahead = self._lookahead(request, num_new + len(drafts))
            block_ids = allocate(request, num_new + len(drafts), num_lookahead_tokens=lookahead)
            if block_ids is None and (drafts or lookahead):
                # Drafts are a bet: never preempt anyone to place one.
                drafts = []
                block_ids = allocate(request, num_new)
            while block_ids is None:
                victim = running.pop()
                # The tail is scheduled last, so a victim never holds tokens
                # already promised to the runner this step.
                assert victim.request_id not in num_scheduled
                self._preempt(victim)
                preempted.append(victim)
                if victim is request:
                    return budget
                block_ids = allocate(request, num_new)
            req_id = request.request_id
            if drafts:
                scheduled_spec[req_id] = drafts
                num_new += len(drafts)
            num_scheduled[req_id] = num_new
            req_ids.append(req_id)
            new_block_ids.append(block_ids)
            computed.append(request.num_computed_tokens)
            request.num_computed_tokens += num_new
            if overlap and request.num_computed_tokens == num_known:
                request.num_output_placeholders += 1  # it samples in this step
            budget -= num_new
            i += 1
        return budget

    def _schedule_waiting(
        self, budget: int, num_scheduled: dict[str, int], new_reqs: list[NewRequestData]
    ) -> int:
        kv = self.kv_cache_manager
        waiting = self.waiting
        max_loras = self.scheduler_config.max_loras
        active_loras = (
            {r.lora_int_id for r in self.running if r.lora_int_id} if max_loras else set()
        )
        # Requests passed over this step for want of a LoRA slot, in order.
        passed: list[Request] = []
        while waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            request = waiting[0]
            lora_id = request.lora_int_id
            if lora_id and (
                passed or (lora_id not in active_loras and len(active_loras) >= max_loras)
            ):
                # A step holds at most max_loras adapters. FCFS across
                # adapters: once an older request waits for a slot, later
                # adapter requests wait behind it (they would keep the slots
                # busy forever); base-model requests, which need no slot, go on.
                passed.append(waiting.popleft())
                continue
            hit_blocks, num_hit = kv.get_computed_blocks(request)
            num_new = min(request.num_tokens - num_hit, budget)
            lookahead = self._lookahead(request, num_hit + num_new)
            block_ids = kv.allocate_slots(request, num_new, hit_blocks, num_hit, lookahead)
            if block_ids is None and lookahead:
                block_ids = kv.allocate_slots(request, num_new, hit_blocks, num_hit)
            if block_ids is None:
                break  # FCFS: nobody overtakes the head of the queue
            waiting.popleft()
            if lora_id:
                active_loras.add(lora_id)
            self.running.append(request)
            request.status = RequestStatus.RUNNING
            self._record(request, EngineCoreEventType.SCHEDULED)
            if request.num_cached_tokens < 0:
                request.num_cached_tokens = num_hit
                request.first_scheduled_time = request.events[-1].timestamp
            new_reqs.append(
                NewRequestData(
                    req_id=request.request_id,
                    prompt_token_ids=request.prompt_token_ids,
                    output_token_ids=list(request.output_token_ids),
                    sampling_params=request.sampling_params,
                    eos_token_ids=request.eos_token_ids,
                    block_ids=block_ids,
                    num_computed_tokens=num_hit,
                    lora_request=request.lora_request,
                )
            )
            num_scheduled[request.request_id] = num_new
            request.num_computed_tokens = num_hit + num_new
            if self.async_scheduling and request.num_computed_tokens == request.num_tokens:
                request.num_output_placeholders = 1  # its prefill ends this step
            budget -= num_new
        waiting.extendleft(reversed(passed))
        return budget

    def _drafts_to_verify(self, request: Request, num_new: int, budget: int) -> list[int]:
        """The draft tokens to verify with this step's decode: none unless the
        request decodes (one new token), no more than the budget leaves, and
        none that could not be emitted (past max_tokens, with the target's
        own token after them, or past max_model_len)."""
        drafts = request.spec_token_ids
        if not drafts or num_new != 1:
            return []
        room = min(
            budget - 1,
            request.max_tokens - len(request.output_token_ids) - 1,
            self.max_model_len - len(request.all_token_ids),
        )
        return drafts[:room] if room > 0 else []

    def _lookahead(self, request: Request, num_tokens_after: int) -> int:
        """KV slots past this step's tokens for a draft model's proposals,
        but none past max_model_len (the block table ends there)."""
        if not self.num_lookahead_tokens:
            return 0
        end = request.num_computed_tokens + num_tokens_after
        return max(0, min(self.num_lookahead_tokens, self.max_model_len - end))

    def _preempt(self, request: Request) -> None:
        """Preempt by recompute; the output so far is kept."""
        self.kv_cache_manager.free(request)
        # The runner forgets the row and its drafts' probabilities with it.
        request.spec_token_ids = []
        # A token still in flight is discarded when it lands (the request is
        # no longer running); the recompute samples it again.
        request.num_output_placeholders = 0
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(request)
        self._record(request, EngineCoreEventType.PREEMPTED)

    # -- after the forward ---------------------------------------------------

    def update_from_output(
        self, scheduler_output: SchedulerOutput, model_runner_output: ModelRunnerOutput
    ) -> EngineCoreOutputs:
        """Append sampled tokens, finish requests that hit a stop condition,
        and report what each request produced."""
        outputs: list[EngineCoreOutput] = []
        all_logprobs = model_runner_output.logprobs
        requests = self.requests
        num_finished = 0
        spec_on = self.speculative_config is not None
        scheduled_spec = scheduler_output.scheduled_spec_decode_tokens
        new_drafts = model_runner_output.spec_token_ids
        for req_id, token_ids in model_runner_output.sampled_token_ids.items():
            request = requests.get(req_id)
            if request is None or request.status != RequestStatus.RUNNING or not token_ids:
                continue  # aborted (or preempted) since it was scheduled
            if request.num_output_placeholders:
                request.num_output_placeholders -= 1
            if spec_on:
                self._settle_drafts(request, scheduled_spec.get(req_id), len(token_ids))
                # The drafts just verified are spent; the next ones (if any)
                # continue from the tokens just sampled.
                request.spec_token_ids = new_drafts.get(req_id) or []
            if len(token_ids) == 1:  # the usual case, inlined: this runs per request per step
                request.output_token_ids.append(token_ids[0])
                request.all_token_ids.append(token_ids[0])
                stopped = self._check_stop(request)
            else:
                token_ids, stopped = self._append_until_stop(request, token_ids)
            logprobs = all_logprobs.get(req_id) if all_logprobs else None
            if logprobs is not None:
                logprobs = logprobs[: len(token_ids)]
            finish_reason = None
            if stopped:
                finish_reason = request.get_finish_reason()
                self._finish(request)
                num_finished += 1
            outputs.append(
                EngineCoreOutput(
                    req_id,
                    token_ids,
                    logprobs,
                    finish_reason,
                    request.stop_reason,
                    request.num_cached_tokens,
                    self._take_events(request),
                )
            )
        if num_finished:
            self.running = [r for r in self.running if r.status <= RequestStatus.PREEMPTED]
        if self._with_events:
            # Queued, admitted or preempted this step but nothing sampled yet
            # (mid chunked prefill, or waiting): the events travel alone.
            for req_id in list(self._with_events):
                request = requests.get(req_id)
                if request is not None:
                    outputs.append(
                        EngineCoreOutput(
                            req_id,
                            [],
                            num_cached_tokens=max(0, request.num_cached_tokens),
                            events=self._take_events(request),
                        )
                    )
            self._with_events.clear()
        return EngineCoreOutputs(outputs=outputs, scheduler_stats=self.make_stats())

    def _settle_drafts(self, request: Request, drafts: list[int] | None, num_sampled: int) -> None:
        """Count a verified draft and take back the KV slots of its rejected
        tokens: the runner emits the accepted drafts then one token of its
        own, so `num_sampled - 1` were accepted."""
        if not drafts:
            return
        num_accepted = num_sampled - 1
        assert 0 <= num_accepted <= len(drafts)
        # Everything after the last accepted draft is recomputed next step
        # (the runner's own token, then whatever comes after it).
        request.num_computed_tokens -= len(drafts) - num_accepted
        self.spec_stats.observe(len(drafts), num_accepted)

    def _take_events(self, request: Request) -> list[EngineCoreEvent] | None:
        if not request.events:
            return None
        events, request.events = request.events, []
        self._with_events.discard(request.request_id)
        return events

    def _append_until_stop(self, request: Request, token_ids: list[int]) -> tuple[list[int], bool]:
        """Append several tokens (speculative decoding) one at a time, up to
        the first that ends the request; returns those kept and whether it
        stopped."""
        for n, token_id in enumerate(token_ids, 1):
            request.output_token_ids.append(token_id)
            request.all_token_ids.append(token_id)
            if self._check_stop(request):
                return token_ids[:n], True
        return token_ids, False

    def _check_stop(self, request: Request) -> bool:
        """Set the finished status if the last token ends the request.

        Order: max_tokens, max_model_len, then (once min_tokens are out) EOS
        and stop_token_ids.
        """
        num_output = len(request.output_token_ids)
        if num_output >= request.max_tokens or len(request.all_token_ids) >= self.max_model_len:
            request.status = RequestStatus.FINISHED_LENGTH_CAPPED
            return True
        params = request.sampling_params
        if num_output < params.min_tokens:
            return False
        last = request.output_token_ids[-1]
        if last in request.eos_token_ids and not params.ignore_eos:
            request.status = RequestStatus.FINISHED_STOPPED
            return True
        if params.stop_token_ids and last in params.stop_token_ids:
            request.status = RequestStatus.FINISHED_STOPPED
            request.stop_reason = last
            return True
        return False

    def _finish(self, request: Request) -> None:
        self.kv_cache_manager.free(request)
        del self.requests[request.request_id]
        self.finished_req_ids.add(request.request_id)

    def make_stats(self) -> SchedulerStats:
        """Engine state now; the counters are cumulative."""
        kv = self.kv_cache_manager
        stats = SchedulerStats(
            num_running_reqs=len(self.running),
            num_waiting_reqs=len(self.waiting),
            kv_cache_usage=kv.usage,
            prefix_cache_queries=kv.prefix_cache_queries,
            prefix_cache_hits=kv.prefix_cache_hits,
            num_preemptions=self.num_preemptions,
            spec_decoding=None
            if self.spec_stats is None
            else dataclasses.replace(
                self.spec_stats,
                num_accepted_tokens_per_pos=list(self.spec_stats.num_accepted_tokens_per_pos),
            ),
        )
        if self.scheduler_config.max_loras:  # a pass over the requests: only with LoRA on
            for requests, counts in (
                (self.running, stats.running_loras),
                (self.waiting, stats.waiting_loras),
            ):
                for request in requests:
                    if request.lora_int_id:
                        counts[request.lora_int_id] = counts.get(request.lora_int_id, 0) + 1
        return stats

    def reset_prefix_cache(self) -> bool:
        """Forget the prefix cache; refused (False) while requests hold blocks."""
        return self.kv_cache_manager.reset_prefix_cache()
