// llama.cpp's batched decode as a benchmark peer, on llama.h alone (the measurement of llama.cpp's own
// tools/batched-bench without its `common` library, which is most of that tool's build time):
// for each parallel count B, B sequences of PP random prompt tokens are decoded in one unified KV
// cache (prompt processing), then TG steps each decode one new token of every sequence in one
// llama_batch (token generation). One JSON line per B on stdout.
//   llamacpp_batched_bench MODEL.gguf THREADS PP TG B [B ...]
// Built by scripts/build_llamacpp_bench.sh; run by scripts/bench_llamacpp_batched.py.
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "llama.h"
#include "llamacpp_batch.h"

// Decodes `all` in slices of at most n_batch tokens; false on a llama_decode error.
static bool decode(llama_context * ctx, const llama_batch & all, int n_batch) {
    for (int i = 0; i < all.n_tokens; i += n_batch) {
        const int n = std::min(n_batch, all.n_tokens - i);
        llama_batch view = {n, all.token + i, nullptr, all.pos + i, all.n_seq_id + i, all.seq_id + i, all.logits + i};
        if (llama_decode(ctx, view) != 0) {
            return false;
        }
    }
    llama_synchronize(ctx);
    return true;
}

int main(int argc, char ** argv) {
    if (argc < 6) {
        std::fprintf(stderr, "usage: %s MODEL.gguf THREADS PP TG B [B ...]\n", argv[0]);
        return 2;
    }
    const int threads = std::atoi(argv[2]), pp = std::atoi(argv[3]), tg = std::atoi(argv[4]);
    std::vector<int> parallel;
    for (int i = 5; i < argc; ++i) {
        parallel.push_back(std::atoi(argv[i]));
    }
    int max_b = 1;
    for (int b : parallel) {
        max_b = std::max(max_b, b);
    }
    llama_model * model = load_model(argv[1]);
    if (model == nullptr) return 1;
    const int n_batch = 512;
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = max_b * (pp + tg) + 16;
    cp.n_batch = n_batch;
    cp.n_ubatch = n_batch;
    cp.n_seq_max = max_b;
    cp.kv_unified = true;
    cp.n_threads = threads;
    cp.n_threads_batch = threads;
    llama_context * ctx = llama_init_from_model(model, cp);
    if (ctx == nullptr) {
        std::fprintf(stderr, "cannot create a context\n");
        return 1;
    }
    const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
    std::mt19937 rng(0);
    // ids 100..n_vocab-200: clear of the special tokens at the low end of the vocabulary
    std::uniform_int_distribution<int> token(100, n_vocab - 200);
    llama_batch batch = llama_batch_init(max_b * pp + 16, 0, 1);
    llama_memory_t mem = llama_get_memory(ctx);

    batch.n_tokens = 0;                                   // warm up: one short sequence
    for (int i = 0; i < 16; ++i) {
        add(batch, token(rng), i, 0, i == 15);
    }
    if (!decode(ctx, batch, n_batch)) {
        return 1;
    }
    for (int b : parallel) {
        llama_memory_clear(mem, false);
        batch.n_tokens = 0;
        for (int s = 0; s < b; ++s) {
            for (int i = 0; i < pp; ++i) {
                add(batch, token(rng), i, s, i == pp - 1);
            }
        }
        const double t0 = now_s();
        if (!decode(ctx, batch, n_batch)) {
            std::fprintf(stderr, "prompt decode failed at B=%d\n", b);
            return 1;
        }
        const double t1 = now_s();
        for (int step = 0; step < tg; ++step) {
            batch.n_tokens = 0;
            for (int s = 0; s < b; ++s) {
                add(batch, token(rng), pp + step, s, true);
            }
            if (!decode(ctx, batch, n_batch)) {
                std::fprintf(stderr, "decode failed at B=%d step %d\n", b, step);
                return 1;
            }
        }
        const double t2 = now_s();
        std::printf("{\"B\": %d, \"pp\": %d, \"tg\": %d, \"threads\": %d, \"t_pp\": %.6f, \"pp_tok_s\": %.3f, "
                    "\"t_tg\": %.6f, \"tg_tok_s\": %.3f}\n", b, pp, tg, threads, t1 - t0, b * pp / (t1 - t0),
                    t2 - t1, b * tg / (t2 - t1));
        std::fflush(stdout);
    }
    llama_batch_free(batch);
    llama_free(ctx);
    llama_model_free(model);
    return 0;
}
