"""PNG plots of the benchmark results (out/bench_kv.json, out/bench_throughput*.json) into docs/img/.

    .venv-bench/bin/python scripts/plot_benchmarks.py [--kv out/bench_kv.json] [--throughput out/bench_throughput*.json]
(matplotlib lives in the bench venv, not in the engine's.)
"""
import argparse
import json
import os
import sys

try:
    import matplotlib
except ModuleNotFoundError:
    raise SystemExit("plot_benchmarks.py needs matplotlib, which lives in the bench venv: "
                     "python -m venv .venv-bench && .venv-bench/bin/pip install -r requirements-bench.txt") from None

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
COLORS = {"static": "tab:red", "paged": "tab:blue", "paged+prefix": "tab:green"}


def plot_kv(data: dict, out_dir: str) -> list[str]:
    """KV slots reserved and tokens held (share of the pool) per mode and workload; running requests over time."""
    pool = data["config"]["num_blocks"] * 16
    budget = pool * data["kv_bytes_per_token"] / 2 ** 20
    title = (f"SmolLM2-135M, KV budget {data['config']['num_blocks']} blocks ({budget:.0f} MiB), "
             f"max_model_len 2048, {data['config']['requests']} requests submitted at once")
    wls = list(data["batch"])
    modes = list(data["batch"][wls[0]])
    fig, axes = plt.subplots(len(modes), len(wls), figsize=(6.5 * len(wls), 2.6 * len(modes)), squeeze=False,
                             sharey=True)
    for j, wname in enumerate(wls):
        for i, mode in enumerate(modes):
            r, ax = data["batch"][wname][mode], axes[i][j]
            tl = np.array(r["timeline"])          # [steps, 6]: t, running, waiting, held, reserved, blocks
            ax.fill_between(tl[:, 0], tl[:, 4] / pool, step="post", color=COLORS[mode], alpha=0.25,
                            label="slots reserved")
            ax.step(tl[:, 0], tl[:, 3] / pool, where="post", color=COLORS[mode],
                    label=f"tokens held ({r['kv_utilisation']:.0%} of reserved, time-weighted)")
            ax.set_title(f"{mode} - {wname}", fontsize=9)
            ax.set_ylim(0, 1.05)
            ax.legend(fontsize=7, loc="upper right")
            ax.grid(alpha=0.3)
            if j == 0:
                ax.set_ylabel("share of KV pool")
            if i == len(modes) - 1:
                ax.set_xlabel("seconds since the batch was submitted")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    written = [os.path.join(out_dir, "kv_usage_over_time.png")]
    fig.savefig(written[-1], dpi=110)
    plt.close(fig)

    fig, axes = plt.subplots(1, len(wls), figsize=(6.5 * len(wls), 3.6), squeeze=False)
    for ax, wname in zip(axes[0], wls):
        for mode, r in data["batch"][wname].items():
            tl = np.array(r["timeline"])
            ax.step(tl[:, 0], tl[:, 1], where="post", color=COLORS[mode], label=f"{mode} (peak {r['peak_running']})")
        ax.axhline(data["static_capacity"], color="grey", ls=":", lw=1,
                   label=f"static capacity {data['static_capacity']}")
        ax.set_title(wname, fontsize=9)
        ax.set_xlabel("seconds since the batch was submitted")
        ax.set_ylabel("requests running")
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    written.append(os.path.join(out_dir, "running_over_time.png"))
    fig.savefig(written[-1], dpi=110)
    plt.close(fig)
    return written


def plot_throughput(data: dict, out_dir: str) -> list[str]:
    wls = list(data["results"])
    engines = list(dict.fromkeys(e for w in wls for e in data["results"][w]))
    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.8 / len(engines)
    for i, e in enumerate(engines):
        xs, ys = [], []
        for j, w in enumerate(wls):
            if e in data["results"][w]:
                xs.append(j + i * width)
                ys.append(float(np.median([r["output_tok_s"] for r in data["results"][w][e]])))
        label = {"llama.cpp batched": "llama.cpp batched (Q4_1 weights, continuous batching)",
                 "hf": "HF transformers (fp32, batches of 16)", "ms_atb": "ms_atb"}.get(e, e)
        bars = ax.bar(xs, ys, width, label=label)
        ax.bar_label(bars, fmt="%.0f", fontsize=8)
    ax.set_xticks([j + width * (len(engines) - 1) / 2 for j in range(len(wls))],
                  [{"mixed": "mixed (48 requests)", "large": "large (128 requests)"}.get(w, w) for w in wls])
    ax.set_ylim(0, ax.get_ylim()[1] * 1.35)     # room for the legend
    ax.set_ylabel("output tokens/s (median of repeats)")
    ax.set_title("Offline throughput, SmolLM2-135M on this CPU (same run)")
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    path = os.path.join(out_dir, "throughput_vs_peers.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [path]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kv", default=os.path.join(ROOT, "out", "bench_kv.json"))
    ap.add_argument("--throughput", nargs="+", default=[os.path.join(ROOT, "out", "bench_throughput.json")],
                    help="one or more results of bench_throughput.py (their workloads are merged)")
    ap.add_argument("--out-dir", default=os.path.join(ROOT, "docs", "img"))
    args = ap.parse_args()
    present = [p for p in [args.kv, *args.throughput] if os.path.exists(p)]
    if not present:
        ap.error(f"none of the inputs exists: {[args.kv, *args.throughput]} (run scripts/bench_kv.py and "
                 f"scripts/bench_throughput.py first, or name their --json files)")
    for path in [args.kv, *args.throughput]:
        if path not in present:
            print(f"skipped {path}: not found", file=sys.stderr)
    os.makedirs(args.out_dir, exist_ok=True)
    written: list[str] = []
    if args.kv in present:
        with open(args.kv) as f:
            written += plot_kv(json.load(f), args.out_dir)
    merged = {"results": {}}
    for path in args.throughput:
        if path in present:
            with open(path) as f:
                data = json.load(f)
            if not isinstance(data, dict) or not isinstance(data.get("results"), dict):
                ap.error(f"{path} has no 'results' object: not a bench_throughput.py --json file")
            merged["results"].update(data["results"])
    written += plot_throughput(merged, args.out_dir) if merged["results"] else []
    print("\n".join(written))


if __name__ == "__main__":
    main()
