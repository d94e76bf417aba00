"""Argument checks shared by the benchmark and simulator scripts: argparse errors before any work."""
from __future__ import annotations

import argparse


def require_at_least(parser: argparse.ArgumentParser, args: argparse.Namespace, minimum: int, *names: str,
                     why: str = "") -> None:
    """parser.error (exit 2) for the first of names whose value is below minimum."""
    for name in names:
        value = getattr(args, name)
        if value is not None and value < minimum:
            parser.error(f"--{name.replace('_', '-')} must be >= {minimum}{why}, got {value}")
