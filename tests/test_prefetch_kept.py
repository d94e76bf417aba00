"""The kernels that wait on memory keep their software prefetches in the built library (ops/prefetch.h): a
compiler that drops them builds kernels whose results are the same and whose passes over DRAM run at up to half
the speed, which no other test sees. Read from the installed library's disassembly (x86: binutils' objdump)."""
import platform
import re
import shutil
import subprocess

import pytest

from ms_atb.ops import build

pytestmark = pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64", "i686"),
                                reason="the prefetch instructions named here are x86's")

# Function name fragments (demangled) -> the prefetch each must contain: PagedAttention's decode pass asks for the
# blocks ahead into L2 for every cache dtype, and QuantDot's GEMV streams each weight format's panels into L1.
KEPT = {r"RunItem<float>": "prefetcht1", r"RunItem<ms_atb::Half>": "prefetcht1",
        r"RunItem<ms_atb::BFloat16>": "prefetcht1", r"RunItem<signed char>": "prefetcht1",
        r"dot::PanelRange<\(ms_atb::QuantFormat\)0>": "prefetcht0", r"dot::PanelRange<\(ms_atb::QuantFormat\)1>": "prefetcht0",
        r"dot::PanelRange<\(ms_atb::QuantFormat\)2>": "prefetcht0", r"dot::PanelRange<\(ms_atb::QuantFormat\)3>": "prefetcht0"}


def functions(library: str) -> dict:
    """Demangled function name -> its instructions' mnemonics."""
    objdump = shutil.which("objdump")
    if objdump is None:
        pytest.fail("objdump (binutils, which g++ needs too) is not on PATH")
    text = subprocess.run([objdump, "-d", "-C", "--no-show-raw-insn", library], capture_output=True, text=True,
                          check=True).stdout
    out, name = {}, None
    for line in text.splitlines():
        head = re.match(r"^[0-9a-f]+ <(.*)>:$", line)
        if head:
            name = head.group(1)
            out[name] = []
        elif name is not None and "\t" in line:
            fields = line.split("\t", 1)[1].split()
            if fields:
                out[name].append(fields[0])
    return out


def test_memory_bound_kernels_keep_their_prefetches():
    fns = functions(build.kernel_library())
    for pattern, instruction in KEPT.items():
        matched = {name: ops for name, ops in fns.items() if re.search(pattern, name)}
        assert matched, f"no function matches {pattern!r} in the kernel library"
        counts = {name: ops.count(instruction) for name, ops in matched.items()}
        assert sum(counts.values()) > 0, f"{pattern}: no {instruction} left in {sorted(counts)}"
