"""A KV tier beside the card's pool, for the simulator: host DRAM or an NVMe SSD that keeps the blocks the card
computes and gives them back when a prompt misses the pool, as the engine's disk tier does on the CPU
(ms_atb/worker/disk_tier.py) and MindIE's KV cache pooling does on an Atlas 800I A2 (DRAM, then SSD).

SimTier is a PrefixTier (ms_atb/core/kv_tier.py) holding block hashes in least-recently-used order up to its
capacity. A block read back costs its bytes / the tier's read bandwidth, on the step that loads it (not
overlapped with the step's compute: the step needs the block before its graph runs). Blocks written to the
tier are copied out after their step, overlapped with later steps: not charged.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

GB = 1e9


@dataclass(frozen=True)
class TierDevice:
    name: str
    read_bandwidth: float        # bytes/s from the tier into the card's memory
    capacity_bytes: float
    source: str = ""


# PCIe 5.0 x16: 32 GT/s x 16 lanes x 128/130 = 63 GB/s a direction (the PCIe 5.0 base specification's line rate);
# Ascend's mxRec tuning guide (hiascend.com, "PCIe") gives ~80% of the theoretical rate as reachable.
HOST_DRAM = TierDevice(
    "host DRAM over PCIe 5.0 x16", read_bandwidth=0.8 * 63 * GB, capacity_bytes=256 * GB,
    source="PCIe 5.0 x16 per card (the link width of the Atlas 800I A2's NPU modules is assumed, not found in a "
           "source here): 63 GB/s a direction, 80% reachable (hiascend mxRec performance tuning, PCIe) = 50 GB/s; "
           "256 GB of host DRAM for one card's blocks is an assumption. MindIE's KV cache pooling (hiascend "
           "MindIE LLM guide, 'KV Cache Pooling') pools DRAM on the Atlas 800I A2")
NVME_SSD = TierDevice(
    "NVMe SSD (PCIe 4.0 x4)", read_bandwidth=6.5 * GB, capacity_bytes=3.2e12,
    source="a PCIe 4.0 x4 NVMe SSD's sequential read, 6.5-7 GB/s in enterprise drives' datasheets (assumed, not "
           "measured); 3.2 TB for one card's blocks; the SSD is read into host memory, then over PCIe to the card, "
           "so the slower link binds")


class SimTier:
    """A PrefixTier of `device` for blocks of block_bytes: LRU, capacity_bytes // block_bytes blocks."""
    hash_key = b"simulated tier key".ljust(32, b"\0")
    hash_root = b"simulated identity"

    def __init__(self, device: TierDevice, block_bytes: int, block_size: int):
        self.device, self.block_bytes, self.block_size = device, block_bytes, block_size
        self.capacity_blocks = int(device.capacity_bytes // block_bytes)
        self._blocks: OrderedDict[bytes, None] = OrderedDict()
        self.read_blocks = 0

    def fetch(self, token_ids, extra_key, first: int, hashes: list[bytes]) -> int:
        num = 0
        for h in hashes:
            if h not in self._blocks:
                break
            self._blocks.move_to_end(h)
            num += 1
        self.read_blocks += num
        return num

    def after_step(self, step) -> float:
        """Keeps the blocks step computed, marks its pool hits used; returns the seconds its loads cost."""
        for h, _ in step.kv_used:
            if h in self._blocks:
                self._blocks.move_to_end(h)
        for store in step.kv_stores:
            self._blocks[store.hash] = None
            self._blocks.move_to_end(store.hash)
        while len(self._blocks) > self.capacity_blocks:
            self._blocks.popitem(last=False)
        return self.load_seconds(len(step.kv_loads))

    def load_seconds(self, num_blocks: int) -> float:
        return num_blocks * self.block_bytes / self.device.read_bandwidth
