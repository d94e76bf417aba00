"""The register tile of ops/gemm_tile.h reads nothing outside its operands, on every instruction-set path this CPU
can run: each operand ends where the process may not read (a page mapped without access), in both of A's layouts
the kernels use (rows of K, and PagedAttention's transposed scores of row stride RP), and the product is checked
against numpy. A read past an operand's end kills the probe with SIGSEGV, so each path runs in a child process."""
import ctypes
import io
import mmap
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ms_atb.ops import build

HERE = Path(__file__).resolve().parent
PATHS = {"native": (), "avx2": ("-mno-avx512f",), "portable": ("-mno-avx512f", "-mno-avx2", "-mno-fma")}
N = 48                                # columns of B and C: three tiles of 16
CASES = [(layout, m, k) for layout in ("rows", "scores") for m in range(1, 15) for k in (1, 3, 48)]


def guarded(n: int) -> np.ndarray:
    """n float32 values whose last one ends where a page without read access begins."""
    page = mmap.PAGESIZE
    pages = -(-4 * n // page)
    area = mmap.mmap(-1, (pages + 1) * page)
    libc = ctypes.CDLL(None, use_errno=True)
    guard = ctypes.addressof(ctypes.c_char.from_buffer(area)) + pages * page
    if libc.mprotect(ctypes.c_void_p(guard), ctypes.c_size_t(page), 0) != 0:   # PROT_NONE
        raise OSError(ctypes.get_errno(), "mprotect")
    return np.frombuffer(area, np.float32, count=n, offset=pages * page - 4 * n)


def operands(layout: str, m: int, k: int):
    """A's values as the kernels lay them out, A's row stride ka, and A as an [m, k] matrix."""
    rng = np.random.default_rng(m * 100 + k)
    if layout == "rows":              # PackedMatMul: row r of A at r * K
        lda, ka, n = k, 1, m * k
    else:                             # PagedAttention: S^T [K, RP], row r of A is column r
        rp = -(-m // 16) * 16
        lda, ka, n = 1, rp, (k - 1) * rp + m
    a = rng.standard_normal(n, dtype=np.float32)
    return a, ka, a[np.arange(m)[:, None] * lda + np.arange(k)[None, :] * ka]


def weights(k: int) -> np.ndarray:
    """B [K, N] as a dense matrix."""
    return np.random.default_rng(k).standard_normal((k, N), dtype=np.float32)


def probe(library: str) -> None:
    """The child: every case with guarded operands; writes the products to stdout as .npy (C = A @ B for rows,
    C = 1 + A @ B for scores)."""
    lib = ctypes.CDLL(library)
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    lib.ProbeRows.argtypes = [i64, i64, ptr, ptr, ptr, i64]
    lib.ProbeScores.argtypes = [i64, i64, ptr, i64, ptr, ptr, i64]
    outs = []
    for layout, m, k in CASES:
        values, ka, _ = operands(layout, m, k)
        a, b, c, dense_b = guarded(len(values)), guarded(k * N), guarded(m * N), weights(k)
        a[:] = values
        c[:] = 1.0
        if layout == "rows":          # B as PackedMatMul's panels [N / 16, K, 16]
            b[:] = dense_b.reshape(k, N // 16, 16).transpose(1, 0, 2).ravel()
            lib.ProbeRows(m, N, a.ctypes.data, b.ctypes.data, c.ctypes.data, k)
        else:
            b[:] = dense_b.ravel()
            lib.ProbeScores(m, N, a.ctypes.data, ka, b.ctypes.data, c.ctypes.data, k)
        outs.append(np.array(c))
    np.save(sys.stdout.buffer, np.concatenate(outs))


@pytest.fixture(scope="module", params=sorted(PATHS))
def probe_library(request, tmp_path_factory):
    flags = set(build.cpu_signature().rsplit("|", 1)[-1].split())
    if request.param == "native" and "avx512f" not in flags:
        pytest.skip("without AVX-512 the native build is the AVX2 path")
    if request.param == "avx2" and not {"avx2", "fma"} <= flags:
        pytest.skip("the CPU has no AVX2/FMA")
    target = tmp_path_factory.mktemp(request.param) / "probe.so"
    subprocess.run([build.find_compiler(), *build.FLAGS, *PATHS[request.param], f"-I{build.SOURCE_DIR}", "-o",
                    str(target), str(HERE / "gemm_tile_probe.cc")], check=True)
    return str(target)


def test_tile_reads_only_its_operands(probe_library):
    child = subprocess.run([sys.executable, __file__, probe_library], capture_output=True)
    assert child.returncode == 0, f"the probe died (status {child.returncode}): {child.stderr.decode()[-2000:]}"
    got = np.load(io.BytesIO(child.stdout))
    at = 0
    for layout, m, k in CASES:
        _, _, dense = operands(layout, m, k)
        want = (layout == "scores") + dense.astype(np.float64) @ weights(k).astype(np.float64)
        np.testing.assert_allclose(got[at:at + m * N].reshape(m, N), want, rtol=1e-4, atol=1e-4,
                                   err_msg=f"{layout} m={m} K={k}")
        at += m * N
    assert at == len(got)


if __name__ == "__main__":
    probe(sys.argv[1])
