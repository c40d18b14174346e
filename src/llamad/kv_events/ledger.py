"""The publisher's reference counts: when a block is new, and when it is gone.

Rows share prefixes, so one block is held by many rows; a row can also sit in
several tiers at once, and a worker can keep the same prompt live. A block is
announced (``BlockStored``) the first time anything holds it in a medium and
withdrawn (``BlockRemoved``) only when nothing holds it there any more.

Blocks a holder holds in one medium are always a prefix of one chain, and a
block's prefix is held wherever the block is (every holder of block *i* holds
blocks *0..i-1*), so the blocks a new holder brings are a suffix of its chain:
one ``BlockStored`` names them with the parent of the first.

Pure and synchronous: cache-meta calls it from its loop and sends the events.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Sequence

from llamad.kv_events.blocks import DEFAULT_BLOCK_SIZE, Block, chain
from llamad.kv_events.wire import AllBlocksCleared, BlockRemoved, BlockStored

__all__ = ["BlockLedger"]


class BlockLedger:
    """Which holders hold which blocks in which medium, counted per block."""

    def __init__(self, block_size: int = DEFAULT_BLOCK_SIZE) -> None:
        if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
            raise ValueError(f"block_size must be a positive int, got {block_size!r}")
        self.block_size = block_size
        # holder -> its chain, computed once however many media hold it.
        self._chains: dict[Hashable, list[Block]] = {}
        # holder -> the media it is held in.
        self._media: dict[Hashable, set[str]] = {}
        self._refs: Counter[tuple[str, int]] = Counter()

    def __len__(self) -> int:
        """Blocks held, counted once per medium."""
        return len(self._refs)

    def held(self, medium: str, block_hash: int) -> int:
        """How many holders hold ``block_hash`` in ``medium``."""
        return self._refs.get((medium, block_hash), 0)

    def holders(self) -> int:
        """Holders known (in any medium)."""
        return len(self._chains)

    def store(
        self,
        holder: Hashable,
        medium: str,
        namespace: bytes,
        tokens: Sequence[int] | bytes | bytearray | memoryview,
    ) -> BlockStored | None:
        """``holder`` (a row key, a live entry's id) now holds ``tokens`` in ``medium``.

        The event names the blocks no other holder held there before, or is
        ``None`` when there are none (a repeat, a prefix already announced,
        fewer tokens than one block).
        """
        media = self._media.setdefault(holder, set())
        if medium in media:
            return None
        blocks = self._chains.get(holder)
        if blocks is None:
            blocks = chain(namespace, tokens, self.block_size)
            self._chains[holder] = blocks
        media.add(medium)
        first_new = len(blocks)
        for i, block in enumerate(blocks):
            key = (medium, block.hash)
            if not self._refs[key] and i < first_new:
                first_new = i
            self._refs[key] += 1
        fresh = blocks[first_new:]
        if not fresh:
            return None
        return BlockStored(
            block_hashes=[b.hash for b in fresh],
            parent_block_hash=fresh[0].parent,
            token_ids=[t for b in fresh for t in b.tokens],
            block_size=self.block_size,
            lora_id=None,
            medium=medium,
            lora_name=None,
            extra_keys=[b.extra for b in fresh],
        )

    def remove(self, holder: Hashable, medium: str) -> BlockRemoved | None:
        """``holder`` no longer holds its tokens in ``medium``.

        The event names the blocks nothing holds there any more, or is
        ``None`` when every block is still held (or the holder was unknown).
        """
        media = self._media.get(holder)
        if media is None or medium not in media:
            return None
        media.discard(medium)
        blocks = self._chains[holder]
        if not media:
            del self._media[holder], self._chains[holder]
        gone: list[int] = []
        for block in blocks:
            key = (medium, block.hash)
            self._refs[key] -= 1
            if self._refs[key] <= 0:
                del self._refs[key]
                gone.append(block.hash)
        if not gone:
            return None
        return BlockRemoved(block_hashes=gone, medium=medium)

    def remove_medium(self, medium: str) -> BlockRemoved | None:
        """Every holder left ``medium`` at once (a tier cleared)."""
        events = [self.remove(h, medium) for h, m in list(self._media.items()) if medium in m]
        gone = [h for e in events if e is not None for h in e.block_hashes]
        return BlockRemoved(block_hashes=gone, medium=medium) if gone else None

    def clear(self) -> AllBlocksCleared:
        """Nothing is held anywhere any more (a start, a whole cache cleared)."""
        self._chains.clear()
        self._media.clear()
        self._refs.clear()
        return AllBlocksCleared()
