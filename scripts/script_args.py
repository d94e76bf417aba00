"""Argument checks shared by the benchmark and simulator scripts: argparse errors before any work."""
from __future__ import annotations

import argparse
import os


def require_at_least(parser: argparse.ArgumentParser, args: argparse.Namespace, minimum: int, *names: str,
                     why: str = "") -> None:
    """parser.error (exit 2) for the first of names whose value is below minimum."""
    for name in names:
        value = getattr(args, name)
        if value is not None and value < minimum:
            parser.error(f"--{name.replace('_', '-')} must be >= {minimum}{why}, got {value}")


def seed_range(parser: argparse.ArgumentParser, text: str, flag: str = "--seeds") -> list[int]:
    """'3' or '0-5' -> the seeds, both ends included; parser.error for anything else."""
    lo, dash, hi = text.partition("-")
    if not lo.isdigit() or (dash and not hi.isdigit()) or (hi and int(hi) < int(lo)):
        parser.error(f"{flag} takes a seed or a range LO-HI of seeds >= 0 with LO <= HI, got {text!r}")
    return list(range(int(lo), int(hi or lo) + 1))


def writable_output(parser: argparse.ArgumentParser, path: str, flag: str) -> None:
    """parser.error unless path can be written once the run is over (its folder exists or can be made)."""
    folder = os.path.dirname(os.path.abspath(path)) or "."
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as e:
        parser.error(f"{flag} {path!r}: its folder cannot be made ({e.strerror})")
    if os.path.isdir(path) or not os.access(path if os.path.exists(path) else folder, os.W_OK):
        parser.error(f"{flag} {path!r} cannot be written")
