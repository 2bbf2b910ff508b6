"""Which KV cache blocks each request owns, and the prefix cache over them.

The scheduler asks two questions per request and step: how much of this
prompt is already cached (`get_computed_blocks`, once, when a request is
admitted) and can it have room for N more tokens (`allocate_slots`). Blocks
are shared by reference count, so `n>1` samples and requests with a common
prefix (system prompts, multi-turn chats) store that prefix once.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Callable, Sequence

from pagoda.runtime.core.block_pool import BlockHash, BlockPool, KVCacheBlock
from pagoda.runtime.core.request import Request

# (parent key, the block's token ids, extra keys) -> the block's key.
BlockHashFn = Callable[[BlockHash, Sequence[int], tuple], BlockHash]


def sha256_block_hash(parent: BlockHash, token_ids: Sequence[int], extra: tuple) -> bytes:
    """SHA-256 over the parent's digest, the token ids as 32-bit integers and
    the extra keys: the default, because a prefix-cache key that an attacker
    can collide lets one prompt read another's KV (CVE-2025-25183 in vLLM,
    whose fix was this). The fields cannot run into each other: the digest
    and a full block's ids have fixed widths. About 0.6 µs per 16-token block
    on the build machine (benchmarks/bench_prefix_hash.py).
    """
    data = parent + array("I", token_ids).tobytes()
    if extra:
        data += repr(extra).encode()
    return hashlib.sha256(data).digest()


def builtin_block_hash(parent: BlockHash, token_ids: Sequence[int], extra: tuple) -> int:
    """Python's tuple hash, about 5x cheaper than sha256: 64-bit and not
    collision-resistant, so only for trusted traffic. String extra keys hash
    differently in each process (PYTHONHASHSEED); harmless, the cache lives in
    one process."""
    return hash((parent, tuple(token_ids), extra))


# Each algorithm's hash function and the parent key of a request's first block
# (any fixed value of the algorithm's type).
_HASHES: dict[str, tuple[BlockHashFn, BlockHash]] = {
    "sha256": (sha256_block_hash, hashlib.sha256(b"pagoda prefix cache").digest()),
    "builtin": (builtin_block_hash, 0x5EED),
}
HASH_ALGOS = tuple(_HASHES)


class KVCacheManager:
    """Allocates blocks to requests and reuses cached prefix blocks.

    A block is hashed and registered in the prefix cache as soon as it is
    allocated for the step that fills it, before its KV is written (as vLLM V1
    does). That lets a second request scheduled in the same step, such as
    sample 2 of `n=2`, hit the blocks of sample 1: the attention layer writes
    every request's K/V of a step before any request reads.

    Counters: `prefix_cache_queries` and `prefix_cache_hits` are in tokens,
    like vLLM's. They are counted when a request is admitted, i.e. on the
    first successful `allocate_slots` after it was waiting (so once at its
    first scheduling and again after each preemption, but not again for each
    step a blocked request retries).
    """

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        enable_caching: bool = True,
        hash_algo: str = "sha256",
    ) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be at least 1, got {block_size}")
        if hash_algo not in _HASHES:
            raise ValueError(f"hash_algo must be one of {HASH_ALGOS}, got {hash_algo!r}")
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.hash_fn, self.root_hash = _HASHES[hash_algo]
        self.block_pool = BlockPool(num_blocks)
        self.req_to_blocks: dict[str, list[KVCacheBlock]] = {}
        # How many leading blocks of each request are registered in the cache,
        # so each step only looks at blocks that became full since.
        self.num_cached_blocks: dict[str, int] = {}
        self.prefix_cache_queries = 0
        self.prefix_cache_hits = 0

    @property
    def num_blocks(self) -> int:
        return self.block_pool.num_blocks

    @property
    def num_free_blocks(self) -> int:
        """Blocks no request owns, including evictable cached ones."""
        return self.block_pool.free_block_queue.num_free_blocks

    @property
    def usage(self) -> float:
        """Fraction of blocks owned by some request, in [0, 1]."""
        return self.block_pool.usage

    def get_computed_blocks(self, request: Request) -> tuple[list[KVCacheBlock], int]:
        """The longest cached prefix of `request`, in whole blocks.

        Returns the hit blocks and the number of tokens they hold. At most
        `num_tokens - 1` tokens are reported as hits, so the last token is
        always computed and the model produces logits to sample from. The
        blocks are not referenced yet: pass them to `allocate_slots`.
        """
        if not self.enable_caching:
            return [], 0
        self._update_block_hashes(request)
        max_hit_blocks = (request.num_tokens - 1) // self.block_size
        cache = self.block_pool.cached_block_hash_to_block
        hits: list[KVCacheBlock] = []
        for block_hash in request.block_hashes[:max_hit_blocks]:
            block = cache.get(block_hash)
            if block is None:
                break
            hits.append(block)
        return hits, len(hits) * self.block_size

    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        new_computed_blocks: list[KVCacheBlock] | None = None,
        num_new_computed_tokens: int = 0,
        num_lookahead_tokens: int = 0,
    ) -> list[int] | None:
        """Make room for `num_new_tokens` more tokens of `request`.

        `new_computed_blocks`/`num_new_computed_tokens` are a newly admitted
        request's prefix hits from `get_computed_blocks`. With speculative
        decoding `num_new_tokens` includes the step's draft tokens; only the
        request's known (verified) tokens ever key a cached block, so a
        rejected draft never enters the prefix cache. Returns the ids of
        the blocks the request gained (hits first, then fresh blocks): what the
        model runner appends to its block table. Returns None, changing
        nothing, when there are not enough free blocks; cached blocks nobody
        owns count as free, since they can be evicted.
        """
        # This runs for every scheduled request every step: the common case
        # (a running request, no hits, no new block) touches no block.
        computed = new_computed_blocks or ()
        req_id = request.request_id
        req_blocks = self.req_to_blocks.get(req_id)
        num_owned = 0 if req_blocks is None else len(req_blocks)
        bs = self.block_size
        num_tokens = request.num_computed_tokens + num_new_computed_tokens + num_new_tokens
        # Lookahead slots (a draft model's KV for its own proposals) are
        # allocated but never cached: they hold no verified token.
        num_slots = num_tokens + num_lookahead_tokens
        num_new_blocks = (num_slots + bs - 1) // bs - num_owned - len(computed)
        # Free hits sit in the free queue: touching them uses up free blocks.
        num_free_hits = sum(1 for block in computed if block.ref_cnt == 0) if computed else 0
        if num_new_blocks + num_free_hits > self.block_pool.free_block_queue.num_free_blocks:
            return None

        if req_blocks is None:
            req_blocks = self.req_to_blocks[req_id] = []
            self.num_cached_blocks[req_id] = len(computed)
            if self.enable_caching:
                self.prefix_cache_queries += len(request.all_token_ids)
                self.prefix_cache_hits += num_new_computed_tokens
        pool = self.block_pool
        if computed:
            pool.touch(computed)
            req_blocks.extend(computed)
        block_ids = [block.block_id for block in computed]
        if num_new_blocks > 0:
            new_blocks = pool.get_new_blocks(num_new_blocks)
            req_blocks.extend(new_blocks)
            block_ids += [block.block_id for block in new_blocks]
        if self.enable_caching:
            # Only blocks whose every token id is known can be keyed.
            num_known = len(request.all_token_ids)
            num_full = (num_tokens if num_tokens < num_known else num_known) // bs
            if num_full > self.num_cached_blocks[req_id]:
                self._cache_full_blocks(request, req_blocks, num_full)
        return block_ids

    def free(self, request: Request) -> None:
        """Give back every block of `request` (a no-op if it has none).

        Tail first: the free queue then evicts a prompt's last blocks before
        its first ones, which are the ones other requests are likeliest to
        share (system prompts).
        """
        blocks = self.req_to_blocks.pop(request.request_id, None)
        self.num_cached_blocks.pop(request.request_id, None)
        if blocks:
            self.block_pool.free_blocks(reversed(blocks))

    def get_block_ids(self, request_id: str) -> list[int]:
        """The request's block table, in order."""
        return [block.block_id for block in self.req_to_blocks.get(request_id, ())]

    def reset_prefix_cache(self) -> bool:
        """Forget all cached blocks; refused (False) while any block is owned."""
        return self.block_pool.reset_prefix_cache()

    def _cache_full_blocks(
        self, request: Request, req_blocks: list[KVCacheBlock], num_full_blocks: int
    ) -> None:
        req_id = request.request_id
        num_cached = self.num_cached_blocks[req_id]
        self._update_block_hashes(request)
        self.block_pool.cache_full_blocks(
            req_blocks, request.block_hashes, num_cached, num_full_blocks
        )
        self.num_cached_blocks[req_id] = num_full_blocks

    def _update_block_hashes(self, request: Request) -> None:
        """Extend `request.block_hashes` to cover every full block of its
        tokens. Only new blocks are hashed: each key chains on its parent's,
        so the salt, which only the first block's key takes, changes them all."""
        hashes = request.block_hashes
        start = len(hashes)
        bs = self.block_size
        num_full = request.num_tokens // bs
        if start >= num_full:
            return
        tokens = request.all_token_ids
        extra = request.cache_extra_keys
        hash_fn = self.hash_fn
        if start == 0:
            first = extra if request.cache_salt is None else (*extra, ("salt", request.cache_salt))
            hashes.append(hash_fn(self.root_hash, tokens[:bs], first))
            start = 1
        parent = hashes[-1]
        for i in range(start, num_full):
            parent = hash_fn(parent, tokens[i * bs : (i + 1) * bs], extra)
            hashes.append(parent)
