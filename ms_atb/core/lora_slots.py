"""LoraSlots: which LoRA adapters the model holds in its max_loras slots, which running requests use each, and where
an adapter that is not resident goes.

The Scheduler owns one (with LoRA on) and is its only caller: it acquires a request's adapter as it admits the
request and releases it when the request leaves the running set (finished or preempted).

Rules:
  1. An adapter is known by its key (a str naming its content: "lora:" and the sha256 of its files); one adapter is in at most one slot.
  2. A slot is given to another adapter only while no running request uses it: a request whose adapter is not
     resident and finds every slot in use waits, and is admitted once a slot is free. Nothing fails for want of
     a slot.
  3. An adapter that is not resident takes an empty slot first, else the slot whose adapter was used least recently
     (its last user released it first). Each such assignment is a load, handed to the model runner with the step
     (take_loads) and counted in num_loads.
"""
from __future__ import annotations

from collections import OrderedDict


class LoraSlots:
    def __init__(self, num_slots: int):
        if not isinstance(num_slots, int) or num_slots < 1:
            raise ValueError(f"max_loras must be an int >= 1, got {num_slots!r}")
        self.num_slots = num_slots
        self._key_of: list[str | None] = [None] * num_slots     # slot -> the adapter it holds
        self._slot_of: dict[str, int] = {}                       # adapter -> its slot
        self._users = [0] * num_slots                              # running requests of each slot's adapter
        # slots no running request uses, least recently used first (the empty ones, in order, to begin with)
        self._idle: OrderedDict[int, None] = OrderedDict((s, None) for s in range(num_slots))
        self._loads: list[tuple[int, str]] = []
        self.num_loads = 0

    def slot_of(self, key: str) -> int:
        """The slot of a resident adapter."""
        return self._slot_of[key]

    def can_acquire(self, key: str) -> bool:
        """True when the adapter is resident or a slot may take it now (rule 2)."""
        return key in self._slot_of or bool(self._idle)

    def acquire(self, key: str) -> int:
        """One more running request uses the adapter: its slot, assigned now if it is not resident (rule 3)."""
        slot = self._slot_of.get(key)
        if slot is None:
            assert self._idle, "can_acquire() said no slot is free"
            slot, _ = self._idle.popitem(last=False)
            old = self._key_of[slot]
            if old is not None:
                del self._slot_of[old]
            self._key_of[slot], self._slot_of[key] = key, slot
            self._loads.append((slot, key))
            self.num_loads += 1
        elif self._users[slot] == 0:
            del self._idle[slot]
        self._users[slot] += 1
        return slot

    def release(self, key: str) -> None:
        """A running request of the adapter left (finished or preempted)."""
        slot = self._slot_of[key]
        assert self._users[slot] > 0
        self._users[slot] -= 1
        if self._users[slot] == 0:
            self._idle[slot] = None          # most recently used: evicted last

    def take_loads(self) -> list[tuple[int, str]]:
        """The (slot, adapter) assignments made since the last call, in order: what the model must load."""
        loads, self._loads = self._loads, []
        return loads

    @property
    def resident(self) -> dict[int, str]:
        """{slot: adapter} of the slots that hold one."""
        return {s: k for s, k in enumerate(self._key_of) if k is not None}
