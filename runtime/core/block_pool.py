"""The pool of KV cache blocks: reference counts, the free list, the prefix cache.

No torch here: a block is an id into the model runner's KV tensors, and this
module only decides which ids a request owns.

Every one of the `num_blocks` blocks is allocatable; no block is reserved as a
"null" block. After all requests finish, `num_free_blocks == num_blocks`.

A block whose reference count drops to 0 goes to the tail of the free queue but
keeps its hash and its entry in the prefix cache: until it is handed out
again, a later request with the same prefix can take it back (`touch`). New
blocks are taken from the head, so the least recently freed cached block is
evicted first (LRU), in O(1), as in vLLM V1.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

# A block's prefix-cache key: a sha256 digest by default, an int from the
# builtin hash (see kv_cache_manager).
BlockHash = bytes | int


@dataclass(slots=True, eq=False, repr=False)
class KVCacheBlock:
    """One block of `block_size` token slots in every layer's KV cache.

    `prev_free_block`/`next_free_block` link the block into the free queue
    (both None while it is not in the queue); keeping the links in the block
    itself is what makes removal from the middle O(1).
    """

    block_id: int
    ref_cnt: int = 0
    # The prefix-cache key of the block's contents; None while it is not cached.
    block_hash: BlockHash | None = None
    prev_free_block: KVCacheBlock | None = None
    next_free_block: KVCacheBlock | None = None

    def __repr__(self) -> str:
        return f"KVCacheBlock(id={self.block_id}, ref={self.ref_cnt}, hash={self.block_hash})"


class FreeKVCacheBlockQueue:
    """Intrusive doubly linked list of free blocks, in eviction order.

    Sentinel head and tail nodes remove every "is the list empty / is this the
    first node" branch from the hot operations. The head is the next block
    handed out (evicted if cached); freed blocks are appended at the tail.
    """

    def __init__(self, blocks: list[KVCacheBlock]) -> None:
        self.num_free_blocks = len(blocks)
        self._head = KVCacheBlock(-1)
        self._tail = KVCacheBlock(-1)
        prev = self._head
        for block in blocks:
            prev.next_free_block = block
            block.prev_free_block = prev
            prev = block
        prev.next_free_block = self._tail
        self._tail.prev_free_block = prev

    def popleft(self) -> KVCacheBlock:
        """Take the block at the head (the next one to evict)."""
        block = self._head.next_free_block
        if block is self._tail:
            raise ValueError("no free blocks")
        self.remove(block)
        return block

    def popleft_n(self, n: int) -> list[KVCacheBlock]:
        """Take the first `n` blocks, in order, with one relink of the head."""
        if n > self.num_free_blocks:
            raise ValueError(f"asked for {n} blocks, {self.num_free_blocks} free")
        if n == 0:
            return []
        out = []
        block = self._head.next_free_block
        for _ in range(n):
            out.append(block)
            nxt = block.next_free_block
            block.prev_free_block = block.next_free_block = None
            block = nxt
        self._head.next_free_block = block
        block.prev_free_block = self._head
        self.num_free_blocks -= n
        return out

    def remove(self, block: KVCacheBlock) -> None:
        """Unlink `block` from wherever it is in the queue, in O(1)."""
        prev, nxt = block.prev_free_block, block.next_free_block
        if prev is None or nxt is None:
            raise ValueError(f"{block} is not in the free queue")
        prev.next_free_block = nxt
        nxt.prev_free_block = prev
        block.prev_free_block = block.next_free_block = None
        self.num_free_blocks -= 1

    def append(self, block: KVCacheBlock) -> None:
        """Put `block` at the tail: it will be evicted last."""
        last = self._tail.prev_free_block
        last.next_free_block = block
        block.prev_free_block = last
        block.next_free_block = self._tail
        self._tail.prev_free_block = block
        self.num_free_blocks += 1

    def get_all_free_blocks(self) -> list[KVCacheBlock]:
        """All free blocks from head to tail (O(n): for tests and debugging)."""
        out = []
        block = self._head.next_free_block
        while block is not self._tail:
            out.append(block)
            block = block.next_free_block
        return out


class BlockPool:
    """Owns every block: hands them out, takes them back, indexes cached ones.

    The prefix cache maps a block hash to one block. When two requests fill
    blocks with the same contents independently (say, two greedy samples that
    generate the same tokens), the first block registered wins and the other
    stays uncached; it is freed like any private block.
    """

    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be at least 1, got {num_blocks}")
        self.num_blocks = num_blocks
        self.blocks = [KVCacheBlock(i) for i in range(num_blocks)]
        self.free_block_queue = FreeKVCacheBlockQueue(self.blocks)
        self.cached_block_hash_to_block: dict[BlockHash, KVCacheBlock] = {}

    @property
    def num_free_blocks(self) -> int:
        """Blocks with no owner, cached ones included (they are evictable)."""
        return self.free_block_queue.num_free_blocks

    @property
    def usage(self) -> float:
        """Fraction of blocks owned by at least one request, in [0, 1]."""
        return 1.0 - self.free_block_queue.num_free_blocks / self.num_blocks

    def get_cached_block(self, block_hash: BlockHash) -> KVCacheBlock | None:
        """The cached block with this hash, owned or free, if any."""
        return self.cached_block_hash_to_block.get(block_hash)

    def get_new_blocks(self, n: int) -> list[KVCacheBlock]:
        """Take `n` blocks from the head of the free queue, with ref_cnt 1.

        A cached block taken here is evicted from the prefix cache, since its
        contents are about to be overwritten.
        """
        blocks = self.free_block_queue.popleft_n(n)
        cache = self.cached_block_hash_to_block
        for block in blocks:
            if block.block_hash is not None:
                del cache[block.block_hash]
                block.block_hash = None
            block.ref_cnt = 1
        return blocks

    def touch(self, blocks: Iterable[KVCacheBlock]) -> None:
        """Take a reference on prefix-cache hits, pulling free ones out of the
        free queue so they cannot be evicted while in use."""
        queue = self.free_block_queue
        for block in blocks:
            if block.ref_cnt == 0:
                queue.remove(block)
            block.ref_cnt += 1

    def free_blocks(self, ordered_blocks: Iterable[KVCacheBlock]) -> None:
        """Drop one reference on each block; blocks nobody owns any more go to
        the tail of the free queue in the given order (first evicted first)."""
        queue = self.free_block_queue
        for block in ordered_blocks:
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                queue.append(block)

    def cache_full_blocks(
        self,
        blocks: list[KVCacheBlock],
        block_hashes: list[BlockHash],
        num_cached_blocks: int,
        num_full_blocks: int,
    ) -> None:
        """Register `blocks[num_cached_blocks:num_full_blocks]` under the
        matching `block_hashes`, so later requests can reuse them.

        Blocks already cached (prefix hits) and hashes already held by another
        block are left as they are.
        """
        cache = self.cached_block_hash_to_block
        for i in range(num_cached_blocks, num_full_blocks):
            block = blocks[i]
            if block.block_hash is not None:
                continue
            block_hash = block_hashes[i]
            if block_hash not in cache:
                block.block_hash = block_hash
                cache[block_hash] = block

    def reset_prefix_cache(self) -> bool:
        """Forget every cached block (e.g. after the weights change).

        Refused (returns False) while any block is owned, as in vLLM: the
        manager's record of which of a running request's blocks are cached
        would no longer be true.
        """
        if self.num_free_blocks != self.num_blocks:
            return False
        for block in self.cached_block_hash_to_block.values():
            block.block_hash = None
        self.cached_block_hash_to_block.clear()
        return True
