"""Quiet by default: the command-line tools hide MindSpore's own WARNING lines (compile-cache notices,
deprecations) and the Python warnings its packages raise; its ERROR lines, ms_atb's messages and every
exception still show. `--verbose` or MS_ATB_VERBOSE=1 shows everything, and a GLOG_v the user set is kept.

MindSpore reads GLOG_v (0 debug, 1 info, 2 warning, 3 error) once, when it is imported, for its C++ and
Python loggers alike: set_up() must run before anything imports mindspore.
"""
from __future__ import annotations

import os
import sys
import warnings

ENV = "MS_ATB_VERBOSE"
_ERRORS_ONLY = "3"


def verbose_requested(flag: bool = False) -> bool:
    return flag or os.environ.get(ENV, "") not in ("", "0")


def set_up(verbose: bool = False) -> bool:
    """Applies the default (quiet) or verbose logging; returns whether verbose. With verbose, MS_ATB_VERBOSE=1
    is exported so that child processes (msrun ranks, workers) show everything too."""
    if verbose_requested(verbose):
        os.environ[ENV] = "1"
        return True
    if "mindspore" not in sys.modules:     # once imported, MindSpore keeps the level it read (a test's run)
        os.environ.setdefault("GLOG_v", _ERRORS_ONLY)
    warnings.filterwarnings("ignore", module=r"mindspore(\..*)?$")
    return False
