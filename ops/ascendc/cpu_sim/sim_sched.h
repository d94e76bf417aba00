// The order in which the programs of a launch run on the CPU: each program (one per vector core of a
// vector-only launch; one AIC and two AIVs per group of a mixed launch) is a thread, and exactly one holds the
// turn at a time. A program gives the turn away only where the hardware could make it wait: at its end, at a
// SyncAll, and at a CrossCoreWaitFlag whose counter is 0. The next program is the first one after it (in
// program order, cyclically) that can run, so a launch runs the same way every time.
//   SyncAll: released once every participant (the AIVs, or all programs) waits there; a participant that ends
//            instead breaks the rule "cross-core sync".
//   Flags:   when no program can run and one waits at a CrossCoreWaitFlag, no set can ever come: the launch
//            stops with the rule "cross-core flag", naming the program and the flag (on the hardware it hangs).
#ifndef MS_ATB_ASCENDC_SIM_SCHED_H_
#define MS_ATB_ASCENDC_SIM_SCHED_H_

#include <array>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "sim_mix.h"

namespace AscendC {

// How a launch starts its programs: block_dim vector cores, block_dim Cube cores, or block_dim groups of one
// AIC and two AIVs.
enum class LaunchForm { kAivOnly, kAicOnly, kMix12 };

class CoreScheduler {
 public:
  struct Aborted {};
  struct Program {
    uint32_t group;
    CoreType type;
    uint32_t sub;
  };

  CoreScheduler(uint32_t block_dim, LaunchForm form) : form_(form) {
    for (uint32_t g = 0; g < block_dim; ++g) {
      if (form != LaunchForm::kAivOnly) programs_.push_back({g, CoreType::kAic, 0});
      if (form == LaunchForm::kAivOnly) programs_.push_back({g, CoreType::kAiv, 0});
      if (form == LaunchForm::kMix12) {
        programs_.push_back({g, CoreType::kAiv, 0});
        programs_.push_back({g, CoreType::kAiv, 1});
      }
    }
    state_.assign(programs_.size(), kReady);
    waiting_flag_.assign(programs_.size(), -1);
    counter_.assign(programs_.size(), {});
    pending_.assign(programs_.size(), {});
    turn_cv_.reset(new std::condition_variable[programs_.size()]);
  }
  const std::vector<Program> &Programs() const { return programs_; }
  bool Mixed() const { return form_ == LaunchForm::kMix12; }

  void WaitTurn(size_t p) {
    std::unique_lock<std::mutex> lock(mu_);
    turn_cv_[p].wait(lock, [&] { return abort_ || turn_ == p; });
    if (abort_) throw Aborted{};
  }
  // The program ends (done) or waits at a SyncAll.
  void Yield(size_t p, bool done, bool aiv_only = true) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      state_[p] = done ? kDone : kSync;
      sync_aiv_only_ = aiv_only;
      PassTurn(p);
    }
    if (!done) WaitTurn(p);
  }
  void SetFlag(size_t p, int mode, int flag) {
    std::lock_guard<std::mutex> lock(mu_);
    const Program &me = programs_[p];
    SIM_REQUIRE(mode == 0 || Mixed(), "cross-core flag",
                "CrossCoreSetFlag mode " + std::to_string(mode) + " pairs the cores of a group: the launch is not mixed "
                "(KERNEL_TYPE_MIX_AIC_1_2)");
    std::vector<size_t> setters, targets;
    for (size_t q = 0; q < programs_.size(); ++q) {
      const Program &o = programs_[q];
      const bool same_group = o.group == me.group;
      if (mode == 0 && o.type == me.type) setters.push_back(q), targets.push_back(q);
      if (mode == 1 && same_group && o.type == CoreType::kAiv) setters.push_back(q), targets.push_back(q);
      if (mode == 2 && same_group && o.type == me.type) setters.push_back(q);
      if (mode == 2 && same_group && o.type != me.type) targets.push_back(q);
    }
    ++pending_[p][mode * kCrossCoreFlags + flag];
    for (size_t q : setters)
      if (pending_[q][mode * kCrossCoreFlags + flag] == 0) return;  // the others have not set it yet
    for (size_t q : setters) --pending_[q][mode * kCrossCoreFlags + flag];
    for (size_t q : targets) {
      SIM_REQUIRE(++counter_[q][flag] <= kCrossCoreMaxPending, "cross-core flag",
                  "flag " + std::to_string(flag) + " set " + std::to_string(counter_[q][flag]) + " times for the " +
                      Name(q) + " without a wait: a counter holds at most 15");
    }
  }
  void WaitFlag(size_t p, int flag) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (counter_[p][flag] > 0) {
        --counter_[p][flag];
        return;
      }
      state_[p] = kFlag;
      waiting_flag_[p] = flag;
      PassTurn(p);
    }
    WaitTurn(p);
  }
  void Fail(const std::string &message) {
    std::lock_guard<std::mutex> lock(mu_);
    if (error_.empty()) error_ = message;
    abort_ = true;
    NotifyAll();
  }
  // After every program ended: counters and half-done mode 1 / 2 sets left over break the rule.
  void CheckLeftovers() {
    if (!error_.empty()) return;
    for (size_t p = 0; p < programs_.size() && error_.empty(); ++p)
      for (int f = 0; f < kCrossCoreFlags && error_.empty(); ++f) {
        if (counter_[p][f] > 0)
          error_ = RuleViolation("cross-core flag", "flag " + std::to_string(f) + " was set for the " + Name(p) +
                                                        " and never waited (its counter outlives the launch)").what();
        for (int mode = 0; mode <= 2 && error_.empty(); ++mode)
          if (pending_[p][mode * kCrossCoreFlags + f] > 0)
            error_ = RuleViolation("cross-core flag", "the " + Name(p) + " set flag " + std::to_string(f) + " (mode " +
                                                          std::to_string(mode) + ") and its partner core never did")
                         .what();
      }
  }
  const std::string &Error() const { return error_; }
  std::string Name(size_t p) const {
    const Program &o = programs_[p];
    std::string name = CoreTypeName(o.type);
    if (Mixed() && o.type == CoreType::kAiv) name += " " + std::to_string(o.sub);
    return name + " of core " + std::to_string(o.group);
  }

 private:
  enum State { kReady, kSync, kFlag, kDone };

  // Gives the turn to the next program that can run (mu_ held); decides SyncAll rounds and deadlocks.
  void PassTurn(size_t p) {
    const size_t n = programs_.size();
    for (size_t i = 1; i <= n; ++i) {
      const size_t q = (p + i) % n;
      if (state_[q] == kFlag && counter_[q][waiting_flag_[q]] > 0) {
        --counter_[q][waiting_flag_[q]];
        state_[q] = kReady;
      }
      if (state_[q] == kReady) return Give(q);
    }
    for (size_t q = 0; q < n; ++q)
      if (state_[q] == kFlag)
        return Stop(RuleViolation("cross-core flag", "deadlock: the " + Name(q) + " waits at CrossCoreWaitFlag(" +
                                                         std::to_string(waiting_flag_[q]) + ") and no program can "
                                                         "set flag " + std::to_string(waiting_flag_[q]) +
                                                         " any more (each has ended or waits)").what());
    uint32_t at_sync = 0, ended = 0;
    for (size_t q = 0; q < n; ++q) {
      if (sync_aiv_only_ && programs_[q].type != CoreType::kAiv) continue;
      (state_[q] == kSync ? at_sync : ended) += 1;
    }
    if (at_sync == 0) return Give(n);  // every program has ended
    if (ended > 0)
      return Stop(RuleViolation("cross-core sync", std::to_string(ended) + " of " + std::to_string(at_sync + ended) +
                                                       " cores ended without reaching the SyncAll the others wait at")
                      .what());
    for (size_t q = 0; q < n; ++q)
      if (state_[q] == kSync) state_[q] = kReady;
    for (size_t q = 0; q < n; ++q)
      if (state_[q] == kReady) return Give(q);
  }
  // Wakes only the program whose turn it is (q == the program count: every program has ended).
  void Give(size_t q) {
    turn_ = q;
    if (q < programs_.size()) turn_cv_[q].notify_one();
  }
  void NotifyAll() {
    for (size_t q = 0; q < programs_.size(); ++q) turn_cv_[q].notify_all();
  }
  void Stop(const std::string &message) {
    if (error_.empty()) error_ = message;
    abort_ = true;
    NotifyAll();
  }

  LaunchForm form_;
  std::vector<Program> programs_;
  std::vector<State> state_;
  std::vector<int> waiting_flag_;
  std::vector<std::array<int, kCrossCoreFlags>> counter_;
  std::vector<std::array<int, 3 * kCrossCoreFlags>> pending_;  // sets of (mode, flag) not yet matched
  std::mutex mu_;
  std::unique_ptr<std::condition_variable[]> turn_cv_;  // one per program: a handover wakes one thread
  size_t turn_ = 0;
  bool abort_ = false, sync_aiv_only_ = true;
  std::string error_;
};

}  // namespace AscendC

#endif  // MS_ATB_ASCENDC_SIM_SCHED_H_
