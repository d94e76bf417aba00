// What the two llama.cpp benchmark drivers (llamacpp_batched_bench.cpp, llamacpp_serve_batch.cpp) share:
// a monotonic clock, loading the model, and appending one token of one sequence to a llama_batch.
#pragma once

#include <chrono>
#include <cstdio>

#include "llama.h"

static double now_s() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Appends token `id` at position `pos` of sequence `seq`; logits: whether llama_decode returns its logits.
static void add(llama_batch & batch, llama_token id, llama_pos pos, llama_seq_id seq, bool logits) {
    const int i = batch.n_tokens++;
    batch.token[i] = id;
    batch.pos[i] = pos;
    batch.n_seq_id[i] = 1;
    batch.seq_id[i][0] = seq;
    batch.logits[i] = logits;
}

// llama.cpp's backend started, its log silenced, the GGUF at `path` loaded; nullptr (said on stderr) if it cannot be.
static llama_model * load_model(const char * path) {
    llama_backend_init();
    llama_log_set([](ggml_log_level, const char *, void *) {}, nullptr);
    llama_model * model = llama_model_load_from_file(path, llama_model_default_params());
    if (model == nullptr) std::fprintf(stderr, "cannot load %s\n", path);
    return model;
}
