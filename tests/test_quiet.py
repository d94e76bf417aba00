"""Quiet by default: MindSpore's WARNING lines and its packages' Python warnings are hidden from the
command-line tools, its ERROR lines still show, and --verbose / MS_ATB_VERBOSE=1 brings everything back."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = os.path.join(ROOT, "configs", "tiny_llama.yaml")
_LOGS = """
import warnings
from ms_atb.batch import quiet
quiet.set_up()
from mindspore import log
log.warning("a mindspore warning")
log.error("a mindspore error")
warnings.warn_explicit("a deprecated mindspore api", FutureWarning, "mindspore/api.py", 1, module="mindspore.api")
warnings.warn("a warning of the program's own", UserWarning)
"""


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if k not in ("GLOG_v", "MS_ATB_VERBOSE")}
    return dict(env, **extra)


@pytest.mark.parametrize("verbose", [False, True])
def test_mindspore_warnings_hidden_unless_verbose_and_errors_always_shown(verbose):
    env = _env(MS_ATB_VERBOSE="1") if verbose else _env()
    err = subprocess.run([sys.executable, "-c", _LOGS], capture_output=True, text=True, env=env,
                         timeout=300, check=True).stderr
    assert "a mindspore error" in err and "a warning of the program's own" in err
    assert ("a mindspore warning" in err) == verbose
    assert ("a deprecated mindspore api" in err) == verbose


@pytest.mark.slow                 # a third MindSpore import
def test_a_glog_level_the_user_set_is_kept():
    err = subprocess.run([sys.executable, "-c", _LOGS], capture_output=True, text=True, env=_env(GLOG_v="2"),
                         timeout=300, check=True).stderr
    assert "a mindspore warning" in err


@pytest.mark.slow                 # two processes that build the tiny engine
def test_the_command_shows_no_mindspore_warning_by_default_and_all_with_verbose(tmp_path):
    prompts = tmp_path / "p.txt"
    prompts.write_text("Hello\n")
    cmd = [sys.executable, "-m", "ms_atb.batch.cli", "--config", TINY, "--input", str(prompts), "--output",
           str(tmp_path / "o.jsonl"), "--overwrite", "--max-tokens", "2", "--no-progress",
           "--set", f"compile_cache={tmp_path / 'graphs'}"]
    # a compile cache makes MindSpore warn: a cold one of its dependency hash, a warm one of its risks
    quiet = subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=600)
    assert quiet.returncode == 0, quiet.stderr[-3000:]
    assert "[WARNING]" not in quiet.stderr and "wall time" in quiet.stderr
    loud = subprocess.run(cmd + ["--verbose"], capture_output=True, text=True, env=_env(), timeout=600)
    assert loud.returncode == 0, loud.stderr[-3000:]
    assert "[WARNING] PIPELINE" in loud.stderr
