"""progress_bar: a tqdm bar for a long call, or None when disabled (tqdm is imported only then)."""
from __future__ import annotations


def progress_bar(total: int, enabled: bool, unit: str, desc: str):
    if not enabled:
        return None
    from tqdm import tqdm
    return tqdm(total=total, unit=unit, desc=desc, dynamic_ncols=True)
