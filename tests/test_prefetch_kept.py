"""The kernels that wait on memory keep their software prefetches in the built code (ops/prefetch.h): a compiler
that drops them builds kernels whose results are the same and whose passes over DRAM run at up to half the speed,
which no other test sees. Read from the disassembly (binutils' objdump) of the installed library on x86 and
AArch64 hosts. Wherever a cross compiler (aarch64-linux-gnu-g++) is installed, both kernel libraries are also
built for AArch64, without a warning, and read the same way."""
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
        r"RunItem<signed char>": "L2",
        **{rf"dot::Panel(Range|Rows)<\(ms_atb::QuantFormat\){f}[,>]": "L1" for f in range(4)}}


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


def build_for_aarch64(out, march: str, extra: tuple, sources) -> None:
    """Builds a shared library for AArch64 as build.compile_library does for this host, -march=native aside."""
    flags = [f for f in build.FLAGS if f != "-march=native"]
    cmd = ["aarch64-linux-gnu-g++", *flags, f"-march={march}", "-Werror", *extra,
           f"-Wl,--version-script={build.SOURCE_DIR / build.EXPORTS}", "-o", str(out), *map(str, sources)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, f"the AArch64 build failed:\n{' '.join(cmd)}\n{proc.stderr[-4000:]}"


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("aarch64-linux-gnu-g++") is None or shutil.which("aarch64-linux-gnu-objdump") is None,
                    reason="no AArch64 cross compiler (apt-get install g++-aarch64-linux-gnu)")
@pytest.mark.parametrize("march", ["armv8-a", "armv8.2-a+fp16+dotprod"])
def test_kernels_build_for_aarch64_and_keep_their_prefetches(tmp_path, march):
    """The CPUs of Ascend servers are AArch64: both libraries build there without a warning (GCC 12's AArch64
    vectoriser fails on an fmax reduction, an x86 register constraint is wrong there) and keep their prefetches."""
    from ms_atb.ops import ascendc_build
    build_for_aarch64(tmp_path / "kernels.so", march, (), [build.SOURCE_DIR / s for s in build.SOURCES])
    build_for_aarch64(tmp_path / "ascendc.so", march, ascendc_build.INCLUDE_FLAGS, ascendc_build.SOURCES)
    check_kept(functions("aarch64-linux-gnu-objdump", str(tmp_path / "kernels.so")), "aarch64")
