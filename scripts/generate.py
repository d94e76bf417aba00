#!/usr/bin/env python3
"""Offline batch generation: a thin wrapper over `ms-atb-generate` (scripts/ is not installed)."""
import sys

from ms_atb.batch.cli import main

if __name__ == "__main__":
    sys.exit(main())
