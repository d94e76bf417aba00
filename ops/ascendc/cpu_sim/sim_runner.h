// Runs an Ascend C kernel on the CPU: every core index in a thread of its own, one at a time (see
// CoreTurns), over the global tensors the caller registers, with the per-core capacities of the
// hardware figures. A broken rule ends the launch; its message is kept for MsAtbAscendcLastError() and printed to stderr.
#ifndef MS_ATB_ASCENDC_SIM_RUNNER_H_
#define MS_ATB_ASCENDC_SIM_RUNNER_H_

#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "kernel_operator.h"

namespace AscendC {

std::string &LastError();  // sim_runner.cc

struct GmTensor { void *data; uint64_t bytes; };

// The cores of a launch take turns: one runs at a time, in index order, from the start (or one SyncAll)
// to its next SyncAll (or its end); when the last core of a round has arrived, the next round starts.
// So every core's work before a SyncAll is done before any core's work after it, as on the hardware, and a
// launch runs the same way every time. A core that ends while others wait at a SyncAll breaks the rule
// "cross-core sync" (on the hardware the waiting cores would hang).
class CoreTurns {
 public:
  explicit CoreTurns(uint32_t n) : n_(n), done_(n, 0) {}
  struct Aborted {};
  void WaitTurn(uint32_t core) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return abort_ || turn_ == core; });
    if (abort_) throw Aborted{};
  }
  void Arrive(uint32_t core, bool done) {  // core yields at a SyncAll (done false) or at its end
    std::lock_guard<std::mutex> lock(mu_);
    if (done) done_[core] = 1; else ++waiting_;
    ++arrived_;
    uint32_t next = core + 1;
    while (next < n_ && done_[next]) ++next;
    if (next == n_) {  // the round is complete
      if (waiting_ > 0 && waiting_ != arrived_ && error_.empty()) {
        error_ = RuleViolation("cross-core sync", std::to_string(arrived_ - waiting_) + " of " + std::to_string(arrived_) +
                                                      " cores ended without reaching the SyncAll the others wait at").what();
        abort_ = true;
      }
      next = 0;
      while (next < n_ && done_[next]) ++next;
      waiting_ = arrived_ = 0;
    }
    turn_ = next;
    cv_.notify_all();
  }
  void Fail(const std::string &message) {
    std::lock_guard<std::mutex> lock(mu_);
    if (error_.empty()) error_ = message;
    abort_ = true;
    cv_.notify_all();
  }
  const std::string &Error() const { return error_; }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  uint32_t n_, turn_ = 0, waiting_ = 0, arrived_ = 0;
  std::vector<char> done_;
  bool abort_ = false;
  std::string error_;
};

// launch() runs the kernel once for the core Sim().block_idx. Returns 0, or 1 with LastError() set.
template <class Launch>
int RunCores(const char *op, uint32_t block_dim, uint64_t tiling_key, const CoreCapacity &capacity,
             const std::vector<GmTensor> &gm, Launch launch) {
  CoreTurns turns(block_dim);
  std::vector<std::thread> threads;
  for (uint32_t i = 0; i < block_dim; ++i)
    threads.emplace_back([&, i] {
      SimState &sim = Sim();
      sim.gm.clear();
      for (const auto &t : gm) sim.gm.push_back({static_cast<const uint8_t *>(t.data), t.bytes});
      sim.capacity = capacity;
      sim.block_num = block_dim;
      sim.block_idx = i;
      sim.tiling_key = tiling_key;
      sim.deferred_error.clear();
      sim.sync_all = [&turns, i] {
        turns.Arrive(i, false);
        turns.WaitTurn(i);
      };
      try {
        turns.WaitTurn(i);
        launch();
        if (!sim.deferred_error.empty()) throw std::runtime_error(sim.deferred_error + " (core " + std::to_string(i) + ")");
        turns.Arrive(i, true);
      } catch (const CoreTurns::Aborted &) {
      } catch (const std::exception &e) {
        turns.Fail(e.what());
      }
      sim.gm.clear();
      sim.deferred_error.clear();
      sim.sync_all = nullptr;
    });
  for (auto &t : threads) t.join();
  if (turns.Error().empty()) return 0;
  LastError() = std::string(op) + ": " + turns.Error();
  std::fprintf(stderr, "ms_atb ascendc %s\n", LastError().c_str());
  return 1;
}

}  // namespace AscendC

#endif  // MS_ATB_ASCENDC_SIM_RUNNER_H_
