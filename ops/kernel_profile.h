// Per-kernel wall time, for finding where a model step goes: with MS_ATB_KERNEL_PROFILE=1 every kernel
// entry adds its duration to a per-name total, and the totals are printed to stderr at exit.
// Disabled (the default), a scope costs one load of a static flag.
#ifndef MS_ATB_OPS_KERNEL_PROFILE_H_
#define MS_ATB_OPS_KERNEL_PROFILE_H_

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>

namespace ms_atb {

class KernelProfile {
 public:
  static KernelProfile &Get() {
    static KernelProfile profile;
    return profile;
  }
  bool enabled() const { return enabled_; }
  void Add(const char *name, double seconds) {
    std::lock_guard<std::mutex> lock(mu_);
    Entry &e = totals_[name];
    e.seconds += seconds;
    e.calls += 1;
  }
  ~KernelProfile() {
    if (!enabled_) return;
    for (const auto &kv : totals_)
      std::fprintf(stderr, "ms_atb kernel profile: %-16s %8ld calls %10.3f s %8.1f us/call\n", kv.first.c_str(),
                   kv.second.calls, kv.second.seconds, 1e6 * kv.second.seconds / kv.second.calls);
  }

 private:
  struct Entry {
    double seconds = 0.0;
    long calls = 0;
  };
  KernelProfile() {
    const char *env = std::getenv("MS_ATB_KERNEL_PROFILE");
    enabled_ = env != nullptr && env[0] == '1';
  }
  bool enabled_ = false;
  std::mutex mu_;
  std::map<std::string, Entry> totals_;
};

class KernelScope {
 public:
  explicit KernelScope(const char *name) : name_(KernelProfile::Get().enabled() ? name : nullptr) {
    if (name_) start_ = std::chrono::steady_clock::now();
  }
  ~KernelScope() {
    if (name_)
      KernelProfile::Get().Add(
          name_, std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count());
  }

 private:
  const char *name_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace ms_atb

#endif  // MS_ATB_OPS_KERNEL_PROFILE_H_
