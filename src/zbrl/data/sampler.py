"""Deterministic, seeded, sharded index sampler with resumable state.

Each epoch draws a fresh permutation of ``range(num_items)`` from ``(seed, epoch)`` and deals it
round-robin to the shards: shard ``k`` takes positions ``k, k + num_shards, ...``. The shards of
an epoch are therefore disjoint and together cover it.

- ``drop_last=False`` (default): every item is used once per epoch; shard lengths differ by at
  most one. No duplicates are added to even them out (producers run independently and need not
  take equal numbers of prompts).
- ``drop_last=True``: the last ``num_items % num_shards`` positions of the permutation (different
  items each epoch when shuffling) are dropped, so every shard has ``num_items // num_shards``.

The permutation uses a small self-contained PRNG (splitmix64 + Fisher-Yates), so the order is
the same on every machine and Python version; a resumed run sees exactly the order it would have.
State (``epoch``, ``position``) is per shard: ``position`` counts the indices of the current
epoch this shard has already handed out.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

_MASK64 = (1 << 64) - 1


def _splitmix64(state: int) -> tuple[int, int]:
    """One splitmix64 step: returns ``(new_state, output)``."""
    state = (state + 0x9E3779B97F4A7C15) & _MASK64
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return state, z ^ (z >> 31)


def permutation(num_items: int, seed: int, epoch: int) -> list[int]:
    """A deterministic permutation of ``range(num_items)`` for ``(seed, epoch)``."""
    state = (seed * 0x9E3779B97F4A7C15) & _MASK64
    state, _ = _splitmix64(state ^ (epoch & _MASK64))
    state, _ = _splitmix64(state)
    order = list(range(num_items))
    for i in range(num_items - 1, 0, -1):
        state, r = _splitmix64(state)
        j = r % (i + 1)
        order[i], order[j] = order[j], order[i]
    return order


class ShardedSampler:
    """Indices of one shard of a dataset, epoch after epoch (see the module docstring)."""

    def __init__(
        self,
        num_items: int,
        *,
        num_shards: int,
        shard_index: int,
        seed: int,
        shuffle: bool = True,
        drop_last: bool = False,
    ) -> None:
        if num_items < 1:
            raise ValueError(f"num_items must be >= 1 (the dataset is empty), got {num_items}")
        if num_shards < 1:
            raise ValueError(f"num_shards must be >= 1, got {num_shards}")
        if not 0 <= shard_index < num_shards:
            raise ValueError(
                f"shard_index must be in [0, {num_shards - 1}] for num_shards={num_shards}, "
                f"got {shard_index}"
            )
        if drop_last and num_items < num_shards:
            raise ValueError(
                f"drop_last=True with num_items={num_items} < num_shards={num_shards} would leave "
                f"every shard empty; use fewer shards, more data, or drop_last=False"
            )
        self.num_items = num_items
        self.num_shards = num_shards
        self.shard_index = shard_index
        self.seed = seed
        self.shuffle = shuffle
        self.drop_last = drop_last
        self._epoch = 0
        self._position = 0

    def __len__(self) -> int:
        """Indices this shard yields per epoch."""
        if self.drop_last:
            return self.num_items // self.num_shards
        return len(range(self.shard_index, self.num_items, self.num_shards))

    def epoch_indices(self, epoch: int) -> list[int]:
        """This shard's indices for ``epoch``, in order (independent of the current state)."""
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0, got {epoch}")
        if self.shuffle:
            order = permutation(self.num_items, self.seed, epoch)
        else:
            order = list(range(self.num_items))
        used = len(self) * self.num_shards if self.drop_last else self.num_items
        return order[self.shard_index : used : self.num_shards]

    def iter_epochs(self, num_epochs: int | None = None) -> Iterator[tuple[int, int]]:
        """Yield ``(epoch, index)`` from the current state until ``num_epochs`` epochs are done.

        ``num_epochs`` is the total number of epochs (counted from epoch 0), not a number of
        further epochs; None runs forever. The state advances as indices are yielded: after an
        index is yielded, :meth:`state` already counts it, so saving state then resuming never
        repeats or skips an index.
        """
        if num_epochs is not None and num_epochs < 0:
            raise ValueError(f"num_epochs must be >= 0 or None, got {num_epochs}")
        if len(self) == 0:
            # This shard is empty (num_items < num_shards); there is nothing to yield.
            if num_epochs is not None:
                self._epoch, self._position = max(self._epoch, num_epochs), 0
            return
        while num_epochs is None or self._epoch < num_epochs:
            epoch = self._epoch
            indices = self.epoch_indices(epoch)
            while self._epoch == epoch and self._position < len(indices):
                index = indices[self._position]
                self._position += 1
                if self._position == len(indices):
                    self._epoch, self._position = epoch + 1, 0
                yield epoch, index

    def state(self) -> dict[str, int]:
        """Resume point of this shard: ``{"epoch": e, "position": p}``."""
        return {"epoch": self._epoch, "position": self._position}

    def load_state(self, state: dict[str, Any]) -> None:
        """Resume from :meth:`state` saved by a sampler with the same arguments."""
        missing = [k for k in ("epoch", "position") if k not in state]
        if missing:
            raise ValueError(f"sampler state is missing {', '.join(missing)}; got {state!r}")
        epoch, position = state["epoch"], state["position"]
        if not isinstance(epoch, int) or epoch < 0:
            raise ValueError(f"sampler state epoch must be an int >= 0, got {epoch!r}")
        if not isinstance(position, int) or not 0 <= position <= len(self):
            raise ValueError(
                f"sampler state position must be an int in [0, {len(self)}] (this shard's "
                f"length), got {position!r}; was the state saved with other sampler arguments?"
            )
        if position == len(self) and position > 0:
            epoch, position = epoch + 1, 0
        self._epoch, self._position = epoch, position
