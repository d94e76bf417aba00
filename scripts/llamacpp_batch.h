// What the two llama.cpp benchmark drivers (llamacpp_batched_bench.cpp, llamacpp_serve_batch.cpp) share:
// a monotonic clock and appending one token of one sequence to a llama_batch.
#pragma once

#include <chrono>

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
