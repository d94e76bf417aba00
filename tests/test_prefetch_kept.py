"""The kernels that wait on memory keep their software prefetches in the built code (ops/prefetch.h): a compiler
that drops them builds kernels whose results are the same and whose passes over DRAM run at up to half the speed,
which no other test sees. Read from the disassembly (binutils' objdump) of the installed library on x86 and
AArch64 hosts, and of the same sources built for AArch64 wherever a cross compiler (aarch64-linux-gnu-g++) is
installed."""
import platform
import re
import shutil
import subprocess

import pytest

from ms_atb.ops import build

# The prefetch instructions (mnemonic and first operand) of each architecture: into L1 and into L2.
PREFETCH = {"x86": {"L1": "prefetcht0", "L2": "prefetcht1"},
            "aarch64": {"L1": "prfm pldl1keep", "L2": "prfm pldl2keep"}}

# Function name fragments (demangled) -> the level each one's prefetches ask for: PagedAttention's decode pass asks
# for the blocks ahead into L2 for every cache dtype, and QuantDot's GEMV streams each weight format's panels into L1.
# A format's panel pass counts with the row tiles it calls (dot::PanelRows), which a compiler may keep apart.
KEPT = {r"RunItem<float>": "L2", r"RunItem<ms_atb::Half>": "L2", r"RunItem<ms_atb::BFloat16>": "L2",
        r"RunItem<signed char>": "L2", **{rf"dot::Panel(Range|Rows)<\(ms_atb::QuantFormat\){f}[,>]": "L1" for f in range(4)}}

# The sources those functions are built from, for the cross build.
SOURCES = ("paged_attention.cc", "quant_matmul.cc")


def host_arch() -> str | None:
    machine = platform.machine().lower()
    return "x86" if machine in ("x86_64", "amd64", "i686") else "aarch64" if machine in ("aarch64", "arm64") else None


def functions(objdump: str, path: str) -> dict:
    """Demangled function name -> its instructions, each as "mnemonic first-operand"."""
    text = subprocess.run([objdump, "-d", "-C", "--no-show-raw-insn", path], capture_output=True, text=True,
                          check=True).stdout
    out, name = {}, None
    for line in text.splitlines():
        head = re.match(r"^[0-9a-f]+ <(.*)>:$", line)
        if head:
            name = head.group(1)
            out[name] = []
        elif name is not None and "\t" in line:
            fields = line.split("\t", 1)[1].replace(",", " ").split()
            if fields:
                out[name].append(" ".join(fields[:2]))
    return out


def check_kept(fns: dict, arch: str) -> None:
    for pattern, level in KEPT.items():
        wanted = PREFETCH[arch][level]
        matched = {name: ops for name, ops in fns.items() if re.search(pattern, name)}
        assert matched, f"no function matches {pattern!r}"
        counts = {name: sum(op == wanted or op.startswith(wanted + " ") for op in ops) for name, ops in matched.items()}
        assert sum(counts.values()) > 0, f"{pattern}: no {wanted} left in {sorted(counts)}"


@pytest.mark.skipif(host_arch() is None, reason="the prefetch instructions named here are x86's and AArch64's")
def test_memory_bound_kernels_keep_their_prefetches():
    objdump = shutil.which("objdump")
    if objdump is None:
        pytest.fail("objdump (binutils, which g++ needs too) is not on PATH")
    check_kept(functions(objdump, build.kernel_library()), host_arch())


@pytest.mark.skipif(shutil.which("aarch64-linux-gnu-g++") is None or shutil.which("aarch64-linux-gnu-objdump") is None,
                    reason="no AArch64 cross compiler (apt-get install g++-aarch64-linux-gnu)")
@pytest.mark.parametrize("march", ["armv8-a", "armv8.2-a+fp16+dotprod"])
def test_prefetches_kept_when_built_for_aarch64(tmp_path, march):
    flags = [f for f in build.FLAGS if f not in ("-shared", "-march=native")]
    fns = {}
    for source in SOURCES:
        obj = tmp_path / (source + ".o")
        subprocess.run(["aarch64-linux-gnu-g++", *flags, f"-march={march}", "-c", str(build.SOURCE_DIR / source),
                        "-o", str(obj)], check=True, capture_output=True)
        fns.update(functions("aarch64-linux-gnu-objdump", str(obj)))
    check_kept(fns, "aarch64")
