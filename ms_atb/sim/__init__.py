"""Capacity simulation: the real scheduler and block manager driven by a roofline cost model."""
