// llama.cpp serving an offline workload with continuous batching, as a benchmark peer on llama.h alone
// (what llama.cpp's parallel example and llama-server do, without their `common` library):
// up to PARALLEL sequences share one KV cache (n_seq_max = PARALLEL); every step is one llama_batch of at
// most N_BATCH tokens: first the next token of every generating sequence, then prompt chunks of the
// admitted sequences in arrival order. A sequence's first token is sampled from its last prompt token's
// logits. Greedy (argmax), end-of-sequence ignored: each request yields exactly its number of output tokens.
// A finished sequence's KV cells are freed (llama_memory_seq_rm) and its slot takes the next request
// at the following step.
//   llamacpp_serve_batch MODEL.gguf THREADS PARALLEL N_BATCH KV WORKLOAD [tokens]
// KV: "unified" (one KV buffer that every sequence's attention spans) or "split" (a KV stream per sequence).
// WORKLOAD: one request a line, "N_OUT TOKEN TOKEN ..." (its output token count, then its prompt's ids).
// Prints one JSON line: elapsed_s (first step to last token, after a warm-up), prompt and generated token
// counts, per-request ttft_s (from the start) and tpot_s, and the process's peak RSS; with `tokens`, also
// every request's generated ids (to check that batching leaves each sequence's greedy output as it is alone).
// Built by scripts/build_llamacpp_bench.sh; run by scripts/bench_throughput.py.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "llama.h"
#include "llamacpp_batch.h"

static double peak_rss_mib() {
    std::ifstream f("/proc/self/status");
    std::string line;
    while (std::getline(f, line)) {
        if (line.rfind("VmHWM:", 0) == 0) {
            return std::atof(line.c_str() + 6) / 1024.0;
        }
    }
    return -1.0;
}

struct Request {
    int n_out = 0;
    std::vector<llama_token> prompt;
};

// A slot of the cache: the request it serves (-1: free) and how far that request has come.
struct Slot {
    int req = -1;
    int n_past = 0;          // tokens of this sequence in the KV cache
    int n_gen = 0;           // tokens sampled so far
    int out_idx = -1;        // row of this step's logits that samples its next token, -1: none
    llama_token last = 0;
    double t_first = 0.0;
};

static bool read_workload(const char * path, int n_vocab, std::vector<Request> & reqs) {
    std::ifstream f(path);
    if (!f) {
        std::fprintf(stderr, "cannot read %s\n", path);
        return false;
    }
    std::string line;
    while (std::getline(f, line)) {
        if (line.empty()) {
            continue;
        }
        std::istringstream in(line);
        Request r;
        long tok;
        in >> r.n_out;
        while (in >> tok) {
            if (tok < 0 || tok >= n_vocab) {
                std::fprintf(stderr, "request %zu: token %ld outside the vocabulary [0, %d)\n", reqs.size(), tok, n_vocab);
                return false;
            }
            r.prompt.push_back((llama_token) tok);
        }
        if (r.n_out < 1 || r.prompt.empty()) {
            std::fprintf(stderr, "request %zu: needs N_OUT >= 1 and at least one prompt token\n", reqs.size());
            return false;
        }
        reqs.push_back(std::move(r));
    }
    return !reqs.empty();
}

static llama_token argmax(const float * logits, int n_vocab) {
    return (llama_token) (std::max_element(logits, logits + n_vocab) - logits);
}

int main(int argc, char ** argv) {
    const bool keep_tokens = argc == 8 && std::strcmp(argv[7], "tokens") == 0;
    if (argc != 7 && !keep_tokens) {
        std::fprintf(stderr, "usage: %s MODEL.gguf THREADS PARALLEL N_BATCH unified|split WORKLOAD [tokens]\n",
                     argv[0]);
        return 2;
    }
    const int threads = std::atoi(argv[2]), parallel = std::atoi(argv[3]), n_batch = std::atoi(argv[4]);
    const std::string kv = argv[5];
    if (threads < 1 || parallel < 1 || n_batch < parallel || (kv != "unified" && kv != "split")) {
        std::fprintf(stderr, "need THREADS >= 1, 1 <= PARALLEL <= N_BATCH, KV unified or split\n");
        return 2;
    }
    llama_model * model = load_model(argv[1]);
    if (model == nullptr) return 1;
    const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
    std::vector<Request> reqs;
    if (!read_workload(argv[6], n_vocab, reqs)) {
        return 2;
    }
    int max_len = 0;
    long n_prompt = 0, n_out = 0;
    for (const Request & r : reqs) {
        max_len = std::max(max_len, (int) r.prompt.size() + r.n_out);
        n_prompt += (long) r.prompt.size();
        n_out += r.n_out;
    }
    // room for PARALLEL sequences of the longest request at once: no sequence ever waits for cells
    const int per_seq = (max_len + 255) / 256 * 256;
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = (uint32_t) (parallel * per_seq);
    cp.n_batch = n_batch;
    cp.n_ubatch = n_batch;
    cp.n_seq_max = parallel;
    cp.kv_unified = kv == "unified";
    cp.n_threads = threads;
    cp.n_threads_batch = threads;
    llama_context * ctx = llama_init_from_model(model, cp);
    if (ctx == nullptr) {
        std::fprintf(stderr, "cannot create a context (n_ctx %d, n_seq_max %d)\n", parallel * per_seq, parallel);
        return 1;
    }
    llama_memory_t mem = llama_get_memory(ctx);
    llama_batch batch = llama_batch_init(n_batch, 0, 1);

    batch.n_tokens = 0;                                   // warm up: one short sequence, then an empty cache
    for (int i = 0; i < 16; ++i) {
        add(batch, 100 + i, i, 0, i == 15);
    }
    if (llama_decode(ctx, batch) != 0) {
        std::fprintf(stderr, "warm-up decode failed\n");
        return 1;
    }
    llama_memory_clear(mem, true);

    std::vector<Slot> slots(parallel);
    std::vector<double> ttft(reqs.size()), tpot(reqs.size(), -1.0);
    std::vector<std::vector<llama_token>> out_tokens(keep_tokens ? reqs.size() : 0);
    size_t next = 0;
    long steps = 0, generated = 0;
    const double start = now_s();
    while (true) {
        for (Slot & s : slots) {                          // admit: a free slot takes the next request
            if (s.req < 0 && next < reqs.size()) {
                s = Slot();
                s.req = (int) next++;
            }
        }
        batch.n_tokens = 0;
        std::vector<int> prefilling;
        for (int id = 0; id < parallel; ++id) {           // decode first: one token of every generating sequence
            Slot & s = slots[id];
            s.out_idx = -1;
            if (s.req < 0) {
                continue;
            }
            if (s.n_gen > 0) {
                s.out_idx = batch.n_tokens;
                add(batch, s.last, s.n_past++, id, true);
            } else {
                prefilling.push_back(id);
            }
        }
        std::sort(prefilling.begin(), prefilling.end(), [&](int a, int b) { return slots[a].req < slots[b].req; });
        for (int id : prefilling) {                       // then prompt chunks, in arrival order, to N_BATCH
            Slot & s = slots[id];
            const std::vector<llama_token> & p = reqs[s.req].prompt;
            const int take = std::min((int) p.size() - s.n_past, n_batch - batch.n_tokens);
            for (int k = 0; k < take; ++k) {
                const bool last = s.n_past + 1 == (int) p.size();
                if (last) {
                    s.out_idx = batch.n_tokens;
                }
                add(batch, p[s.n_past], s.n_past, id, last);
                s.n_past++;
            }
        }
        if (batch.n_tokens == 0) {
            break;
        }
        if (llama_decode(ctx, batch) != 0) {
            std::fprintf(stderr, "decode failed at step %ld (%d tokens)\n", steps, batch.n_tokens);
            return 1;
        }
        ++steps;
        const double t = now_s();
        for (int id = 0; id < parallel; ++id) {
            Slot & s = slots[id];
            if (s.out_idx < 0) {
                continue;
            }
            s.last = argmax(llama_get_logits_ith(ctx, s.out_idx), n_vocab);
            if (keep_tokens) {
                out_tokens[s.req].push_back(s.last);
            }
            if (s.n_gen++ == 0) {
                s.t_first = t;
                ttft[s.req] = t - start;
            }
            ++generated;
            if (s.n_gen == reqs[s.req].n_out) {           // done: its cells go back to the cache
                if (s.n_gen > 1) {
                    tpot[s.req] = (t - s.t_first) / (s.n_gen - 1);
                }
                llama_memory_seq_rm(mem, id, -1, -1);
                s.req = -1;
            }
        }
    }
    const double elapsed = now_s() - start;
    std::printf("{\"requests\": %zu, \"parallel\": %d, \"threads\": %d, \"n_batch\": %d, \"kv\": \"%s\", "
                "\"n_ctx\": %d, \"steps\": %ld, \"elapsed_s\": %.6f, \"prompt_tokens\": %ld, "
                "\"generated_tokens\": %ld, \"requested_tokens\": %ld, \"peak_rss_mib\": %.1f, \"ttft_s\": [",
                reqs.size(), parallel, threads, n_batch, kv.c_str(), parallel * per_seq, steps, elapsed, n_prompt,
                generated, n_out, peak_rss_mib());
    for (size_t i = 0; i < reqs.size(); ++i) {
        std::printf("%s%.6f", i ? ", " : "", ttft[i]);
    }
    std::printf("], \"tpot_s\": [");
    bool first = true;
    for (size_t i = 0; i < reqs.size(); ++i) {
        if (tpot[i] >= 0) {
            std::printf("%s%.6f", first ? "" : ", ", tpot[i]);
            first = false;
        }
    }
    std::printf("]");
    if (keep_tokens) {
        std::printf(", \"tokens\": [");
        for (size_t i = 0; i < reqs.size(); ++i) {
            std::printf("%s[", i ? ", " : "");
            for (size_t k = 0; k < out_tokens[i].size(); ++k) {
                std::printf("%s%d", k ? ", " : "", out_tokens[i][k]);
            }
            std::printf("]");
        }
        std::printf("]");
    }
    std::printf("}\n");
    llama_batch_free(batch);
    llama_free(ctx);
    llama_model_free(model);
    return 0;
}
