"""BlockPool and its free queue: O(1) list operations, ref counts, LRU order."""

import pytest
from pagoda.runtime.core.block_pool import BlockPool, FreeKVCacheBlockQueue, KVCacheBlock


def ids(blocks):
    return [b.block_id for b in blocks]


def make_queue(n):
    blocks = [KVCacheBlock(i) for i in range(n)]
    return blocks, FreeKVCacheBlockQueue(blocks)


def test_free_queue_pops_blocks_in_initial_order():
    _, queue = make_queue(3)
    assert [queue.popleft().block_id for _ in range(3)] == [0, 1, 2]
    assert queue.num_free_blocks == 0


def test_free_queue_popleft_on_empty_raises():
    _, queue = make_queue(0)
    with pytest.raises(ValueError):
        queue.popleft()


def test_free_queue_remove_from_middle_relinks_neighbours():
    blocks, queue = make_queue(4)
    queue.remove(blocks[2])
    assert ids(queue.get_all_free_blocks()) == [0, 1, 3]
    assert queue.num_free_blocks == 3
    assert blocks[2].prev_free_block is None and blocks[2].next_free_block is None


def test_free_queue_remove_of_block_not_in_queue_raises():
    blocks, queue = make_queue(2)
    queue.remove(blocks[0])
    with pytest.raises(ValueError):
        queue.remove(blocks[0])


def test_free_queue_append_goes_to_tail():
    blocks, queue = make_queue(3)
    queue.remove(blocks[0])
    queue.append(blocks[0])
    assert ids(queue.get_all_free_blocks()) == [1, 2, 0]


def test_free_queue_popleft_n_takes_the_first_n_in_order():
    _, queue = make_queue(5)
    assert ids(queue.popleft_n(3)) == [0, 1, 2]
    assert ids(queue.get_all_free_blocks()) == [3, 4]
    assert queue.num_free_blocks == 2


def test_free_queue_popleft_n_of_everything_leaves_it_empty_and_usable():
    blocks, queue = make_queue(3)
    assert ids(queue.popleft_n(3)) == [0, 1, 2]
    assert queue.get_all_free_blocks() == []
    queue.append(blocks[1])
    assert ids(queue.get_all_free_blocks()) == [1]


def test_free_queue_popleft_n_beyond_free_count_raises():
    _, queue = make_queue(2)
    with pytest.raises(ValueError):
        queue.popleft_n(3)


def test_every_block_is_allocatable_no_null_block():
    pool = BlockPool(4)
    assert pool.num_free_blocks == 4
    assert ids(pool.get_new_blocks(4)) == [0, 1, 2, 3]
    assert pool.num_free_blocks == 0


def test_get_new_blocks_gives_ref_count_one():
    pool = BlockPool(4)
    assert [b.ref_cnt for b in pool.get_new_blocks(2)] == [1, 1]


def test_get_new_blocks_evicts_a_cached_block_from_the_cache():
    pool = BlockPool(1)
    [block] = pool.get_new_blocks(1)
    pool.cache_full_blocks([block], [111], 0, 1)
    pool.free_blocks([block])
    assert pool.get_cached_block(111) is block
    [again] = pool.get_new_blocks(1)
    assert again is block
    assert again.block_hash is None
    assert pool.get_cached_block(111) is None


def test_touch_takes_a_free_cached_block_out_of_the_free_queue():
    pool = BlockPool(3)
    blocks = pool.get_new_blocks(3)
    pool.cache_full_blocks(blocks, [10, 11, 12], 0, 3)
    pool.free_blocks(blocks)
    pool.touch([blocks[1]])
    assert blocks[1].ref_cnt == 1
    assert ids(pool.free_block_queue.get_all_free_blocks()) == [0, 2]


def test_touch_of_an_owned_block_only_adds_a_reference():
    pool = BlockPool(2)
    [block] = pool.get_new_blocks(1)
    pool.touch([block])
    assert block.ref_cnt == 2
    assert pool.num_free_blocks == 1


def test_free_blocks_returns_only_unreferenced_blocks_in_the_given_order():
    pool = BlockPool(3)
    blocks = pool.get_new_blocks(3)
    pool.touch([blocks[1]])
    pool.free_blocks(reversed(blocks))
    assert ids(pool.free_block_queue.get_all_free_blocks()) == [2, 0]
    assert blocks[1].ref_cnt == 1


def test_least_recently_freed_block_is_evicted_first():
    pool = BlockPool(3)
    blocks = pool.get_new_blocks(3)
    pool.cache_full_blocks(blocks, [10, 11, 12], 0, 3)
    pool.free_blocks([blocks[2]])
    pool.free_blocks([blocks[0]])
    pool.free_blocks([blocks[1]])
    assert ids(pool.get_new_blocks(1)) == [2]
    assert pool.get_cached_block(12) is None
    assert pool.get_cached_block(10) is blocks[0]


def test_cache_full_blocks_registers_only_the_new_range():
    pool = BlockPool(3)
    blocks = pool.get_new_blocks(3)
    pool.cache_full_blocks(blocks, [10, 11, 12], 1, 2)
    assert blocks[0].block_hash is None
    assert pool.get_cached_block(11) is blocks[1]
    assert blocks[2].block_hash is None


def test_cache_full_blocks_keeps_the_first_block_for_a_duplicate_hash():
    pool = BlockPool(2)
    first, second = pool.get_new_blocks(2)
    pool.cache_full_blocks([first], [7], 0, 1)
    pool.cache_full_blocks([second], [7], 0, 1)
    assert pool.get_cached_block(7) is first
    assert second.block_hash is None


def test_usage_is_the_fraction_of_owned_blocks():
    pool = BlockPool(4)
    assert pool.usage == 0.0
    blocks = pool.get_new_blocks(1)
    assert pool.usage == 0.25
    pool.free_blocks(blocks)
    assert pool.usage == 0.0


def test_reset_prefix_cache_is_refused_while_a_block_is_owned():
    pool = BlockPool(2)
    blocks = pool.get_new_blocks(1)
    pool.cache_full_blocks(blocks, [5], 0, 1)
    assert pool.reset_prefix_cache() is False
    assert pool.get_cached_block(5) is blocks[0]


def test_reset_prefix_cache_forgets_every_cached_block():
    pool = BlockPool(2)
    blocks = pool.get_new_blocks(2)
    pool.cache_full_blocks(blocks, [5, 6], 0, 2)
    pool.free_blocks(blocks)
    assert pool.reset_prefix_cache() is True
    assert pool.cached_block_hash_to_block == {}
    assert all(b.block_hash is None for b in blocks)
    assert pool.num_free_blocks == 2
