"""KVCacheManager: prefix hits, LRU eviction, reference counts, no leaks."""

import hashlib

import pytest
from pagoda.runtime.core.kv_cache_manager import HASH_ALGOS, KVCacheManager, sha256_block_hash
from pagoda.runtime.core.request import Request
from pagoda.runtime.sampling_params import SamplingParams

BS = 4


def make_request(req_id, tokens, extra=(), salt=None):
    return Request(
        request_id=req_id,
        prompt_token_ids=list(tokens),
        sampling_params=SamplingParams(max_tokens=8),
        max_model_len=1024,
        cache_extra_keys=extra,
        cache_salt=salt,
    )


def admit(kv, request):
    """What the scheduler does for a waiting request: look up, allocate all."""
    hits, num_hit = kv.get_computed_blocks(request)
    block_ids = kv.allocate_slots(request, request.num_tokens - num_hit, hits, num_hit)
    if block_ids is not None:
        request.num_computed_tokens = request.num_tokens
    return block_ids, num_hit


def decode(kv, request, token):
    """The model sampled `token`; the next step computes its KV."""
    request.append_output_token_ids([token])
    block_ids = kv.allocate_slots(request, 1)
    request.num_computed_tokens += 1
    return block_ids


def test_second_request_hits_the_shared_prefix():
    kv = KVCacheManager(16, BS)
    a = make_request("a", range(10))
    admit(kv, a)
    b = make_request("b", [*range(8), 99, 98, 97])
    block_ids, num_hit = admit(kv, b)
    assert num_hit == 8
    assert block_ids[:2] == kv.get_block_ids("a")[:2]
    assert block_ids[2] not in kv.get_block_ids("a")


def test_hit_is_capped_so_the_last_token_is_computed():
    kv = KVCacheManager(16, BS)
    admit(kv, make_request("a", range(8)))
    _, num_hit = admit(kv, make_request("b", range(8)))
    assert num_hit == 4


def test_partial_block_is_never_a_hit():
    kv = KVCacheManager(16, BS)
    admit(kv, make_request("a", range(7)))
    _, num_hit = admit(kv, make_request("b", [*range(7), 50, 51]))
    assert num_hit == 4


def test_different_extra_keys_do_not_share_blocks():
    kv = KVCacheManager(16, BS)
    admit(kv, make_request("a", range(9), extra=("lora-a",)))
    _, num_hit = admit(kv, make_request("b", range(9), extra=("lora-b",)))
    assert num_hit == 0


def test_a_mismatch_in_an_early_block_stops_the_hit_there():
    kv = KVCacheManager(16, BS)
    admit(kv, make_request("a", range(12)))
    _, num_hit = admit(kv, make_request("b", [0, 1, 2, 3, 0, 0, 0, 0, 8, 9, 10, 11, 12]))
    assert num_hit == 4


def test_get_computed_blocks_takes_no_reference():
    kv = KVCacheManager(4, BS)
    a = make_request("a", range(8))
    admit(kv, a)
    kv.free(a)
    hits, _ = kv.get_computed_blocks(make_request("b", range(9)))
    assert [h.ref_cnt for h in hits] == [0, 0]
    assert kv.num_free_blocks == 4


def test_allocate_returns_hit_ids_then_new_ids_for_a_new_request():
    kv = KVCacheManager(16, BS)
    a = make_request("a", range(8))
    admit(kv, a)
    b = make_request("b", range(13))
    block_ids, _ = admit(kv, b)
    assert len(block_ids) == 4
    assert block_ids == kv.get_block_ids("b")
    assert block_ids[:2] == kv.get_block_ids("a")


def test_allocate_returns_only_the_blocks_gained_this_step():
    kv = KVCacheManager(16, BS)
    a = make_request("a", range(3))
    admit(kv, a)
    assert decode(kv, a, 100) == []
    assert decode(kv, a, 101) == [kv.get_block_ids("a")[1]]


def test_allocate_without_room_returns_none_and_changes_nothing():
    kv = KVCacheManager(3, BS)
    a = make_request("a", range(8))
    admit(kv, a)
    kv.free(a)
    b = make_request("b", [*range(8), *range(20, 30)])
    hits, num_hit = kv.get_computed_blocks(b)
    assert num_hit == 8
    assert kv.allocate_slots(b, b.num_tokens - num_hit, hits, num_hit) is None
    assert kv.num_free_blocks == 3
    assert [h.ref_cnt for h in hits] == [0, 0]
    assert kv.get_block_ids("b") == []
    assert kv.prefix_cache_queries == 8


def test_free_cached_blocks_count_as_free_and_are_evicted_on_demand():
    kv = KVCacheManager(4, BS)
    a = make_request("a", range(16))
    admit(kv, a)
    kv.free(a)
    assert kv.num_free_blocks == 4
    block_ids, num_hit = admit(kv, make_request("b", range(100, 116)))
    assert num_hit == 0 and len(block_ids) == 4
    _, num_hit = kv.get_computed_blocks(make_request("c", range(16)))
    assert num_hit == 0


def test_least_recently_freed_prompt_is_evicted_first():
    kv = KVCacheManager(4, BS)
    old = make_request("old", range(8))
    new = make_request("new", range(50, 58))
    admit(kv, old)
    admit(kv, new)
    kv.free(old)
    kv.free(new)
    admit(kv, make_request("x", range(200, 208)))
    _, hit_new = kv.get_computed_blocks(make_request("n2", range(50, 59)))
    _, hit_old = kv.get_computed_blocks(make_request("o2", range(9)))
    assert (hit_new, hit_old) == (8, 0)


def test_a_prompts_tail_is_evicted_before_its_head():
    kv = KVCacheManager(4, BS)
    a = make_request("a", range(16))
    admit(kv, a)
    kv.free(a)
    admit(kv, make_request("x", range(100, 104)))
    _, num_hit = kv.get_computed_blocks(make_request("b", range(17)))
    assert num_hit == 12


def test_a_hit_refreshes_the_block_in_lru_order():
    kv = KVCacheManager(4, BS)
    a = make_request("a", range(4))
    b = make_request("b", range(10, 14))
    admit(kv, a)
    admit(kv, b)
    kv.free(a)
    kv.free(b)
    a2 = make_request("a2", range(5))
    admit(kv, a2)
    kv.free(a2)
    admit(kv, make_request("x", range(100, 108)))
    assert kv.get_computed_blocks(make_request("a3", range(5)))[1] == 4
    assert kv.get_computed_blocks(make_request("b3", range(10, 15)))[1] == 0


def test_shared_prefix_blocks_count_one_reference_per_owner():
    kv = KVCacheManager(16, BS)
    reqs = [make_request(f"r{i}", [*range(8), 100 + i]) for i in range(3)]
    for r in reqs:
        admit(kv, r)
    pool = kv.block_pool
    shared = kv.get_block_ids("r0")[:2]
    assert [pool.blocks[i].ref_cnt for i in shared] == [3, 3]
    kv.free(reqs[0])
    assert [pool.blocks[i].ref_cnt for i in shared] == [2, 2]
    assert kv.num_free_blocks == 16 - 2 - 2


def test_siblings_allocated_in_the_same_step_share_the_prompt_blocks():
    # n=2: sample 2 is admitted right after sample 1, before any KV is written.
    kv = KVCacheManager(16, BS)
    s1 = make_request("s1", range(10))
    s2 = make_request("s2", range(10))
    ids1, _ = admit(kv, s1)
    ids2, num_hit = admit(kv, s2)
    assert num_hit == 8
    assert ids2[:2] == ids1[:2] and ids2[2] != ids1[2]
    assert [kv.block_pool.blocks[i].ref_cnt for i in ids1] == [2, 2, 1]


def test_chunked_prefill_caches_each_block_as_its_chunk_is_allocated():
    kv = KVCacheManager(16, BS)
    a = make_request("a", range(12))
    kv.allocate_slots(a, 5)
    a.num_computed_tokens = 5
    _, num_hit = kv.get_computed_blocks(make_request("b", range(12)))
    assert num_hit == 4


def test_blocks_filled_by_decoding_are_cached():
    kv = KVCacheManager(16, BS)
    a = make_request("a", range(3))
    admit(kv, a)
    decode(kv, a, 70)
    _, num_hit = kv.get_computed_blocks(make_request("b", [0, 1, 2, 70, 5]))
    assert num_hit == 4


def test_block_hashes_are_extended_without_rehashing_earlier_blocks():
    kv = KVCacheManager(64, BS)
    calls = []
    inner = kv.hash_fn
    kv.hash_fn = lambda *key: calls.append(key) or inner(*key)
    a = make_request("a", range(8))
    admit(kv, a)
    assert len(calls) == 2
    for token in range(100, 140):
        decode(kv, a, token)
    assert len(a.block_hashes) == 12
    assert len(calls) == 12


def test_free_count_returns_to_the_total_after_all_requests_finish():
    kv = KVCacheManager(32, BS)
    reqs = [make_request(f"r{i}", [*range(6), i, i, i]) for i in range(5)]
    for r in reqs:
        admit(kv, r)
        for t in range(6):
            decode(kv, r, t)
    for r in reqs:
        kv.free(r)
    assert kv.num_free_blocks == 32
    assert kv.usage == 0.0
    assert all(b.ref_cnt == 0 for b in kv.block_pool.blocks)


def test_free_of_an_unknown_request_is_a_no_op():
    kv = KVCacheManager(4, BS)
    kv.free(make_request("ghost", range(3)))
    assert kv.num_free_blocks == 4


def test_prefix_counters_are_in_tokens_and_count_each_admission():
    kv = KVCacheManager(16, BS)
    admit(kv, make_request("a", range(9)))
    admit(kv, make_request("b", range(9)))
    assert (kv.prefix_cache_queries, kv.prefix_cache_hits) == (18, 8)
    kv.allocate_slots(make_request("a", range(9)), 0)  # a running request: not a query
    assert kv.prefix_cache_queries == 18


def test_usage_reflects_owned_blocks():
    kv = KVCacheManager(8, BS)
    admit(kv, make_request("a", range(8)))
    assert kv.usage == pytest.approx(0.25)


def test_caching_off_hashes_nothing_and_never_hits():
    kv = KVCacheManager(8, BS, enable_caching=False)
    a = make_request("a", range(9))
    admit(kv, a)
    b = make_request("b", range(9))
    block_ids, num_hit = admit(kv, b)
    assert num_hit == 0 and len(block_ids) == 3
    assert a.block_hashes == [] and kv.block_pool.cached_block_hash_to_block == {}
    assert kv.prefix_cache_queries == 0
    kv.free(a)
    kv.free(b)
    assert kv.num_free_blocks == 8


@pytest.mark.parametrize("algo", HASH_ALGOS)
def test_every_hash_algo_gives_the_same_hits(algo):
    kv = KVCacheManager(16, BS, hash_algo=algo)
    admit(kv, make_request("a", range(10)))
    _, num_hit = admit(kv, make_request("b", range(10)))
    assert num_hit == 8


def test_the_default_block_key_is_a_sha256_digest():
    kv = KVCacheManager(16, BS)
    a = make_request("a", range(8))
    admit(kv, a)
    assert all(isinstance(h, bytes) and len(h) == 32 for h in a.block_hashes)


def test_sha256_keys_chain_on_the_parent_and_the_exact_token_ids():
    root = hashlib.sha256(b"x").digest()
    key = sha256_block_hash(root, [1, 2, 3, 4], ())
    assert key == sha256_block_hash(root, [1, 2, 3, 4], ())
    assert key != sha256_block_hash(root, [1, 2, 3, 5], ())
    assert key != sha256_block_hash(key, [1, 2, 3, 4], ())
    assert key != sha256_block_hash(root, [1, 2, 3, 4], ("lora-a",))
    # Ids are encoded at a fixed width: 256 is not "1, 0" in some other base.
    assert sha256_block_hash(root, [256, 1], ()) != sha256_block_hash(root, [1, 256], ())


def test_cache_salt_isolates_prefixes_and_equal_salts_share():
    kv = KVCacheManager(32, BS)
    admit(kv, make_request("a", range(12), salt="tenant-1"))
    _, unsalted = admit(kv, make_request("b", range(12)))
    _, other = admit(kv, make_request("c", range(12), salt="tenant-2"))
    _, same = admit(kv, make_request("d", range(12), salt="tenant-1"))
    assert (unsalted, other, same) == (0, 0, 8)


def test_salt_enters_only_the_first_key_yet_changes_every_key():
    kv = KVCacheManager(32, BS)
    a, b = make_request("a", range(12)), make_request("b", range(12), salt="s")
    admit(kv, a)
    admit(kv, b)
    assert all(x != y for x, y in zip(a.block_hashes, b.block_hashes))


def test_unknown_hash_algo_is_rejected():
    with pytest.raises(ValueError, match="hash_algo"):
        KVCacheManager(4, BS, hash_algo="md5")


def test_reset_prefix_cache_drops_hits_once_everything_is_free():
    kv = KVCacheManager(8, BS)
    a = make_request("a", range(9))
    admit(kv, a)
    assert kv.reset_prefix_cache() is False
    kv.free(a)
    assert kv.reset_prefix_cache() is True
    _, num_hit = admit(kv, make_request("b", range(9)))
    assert num_hit == 0
