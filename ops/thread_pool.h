// A persistent pool of worker threads shared by the kernels of this library.
// Items are handed out dynamically; each item is computed by one thread, so results do not
// depend on the thread count. MS_ATB_NUM_THREADS overrides the number of threads (default:
// the cores this process may run on). Between parallel regions a worker spins for kSpin before it
// sleeps: a model step calls ~300 kernels a few tens of microseconds apart, and waking a sleeping
// thread costs about as much as a small kernel.
#ifndef MS_ATB_OPS_THREAD_POOL_H_
#define MS_ATB_OPS_THREAD_POOL_H_

#include <sched.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace ms_atb {

class ThreadPool {
 public:
  static ThreadPool &Get() {
    static ThreadPool pool(DefaultThreads());
    return pool;
  }

  int num_threads() const { return static_cast<int>(workers_.size()) + 1; }

  // Calls fn(i) for every i in [0, n), the calling thread included.
  void Run(int64_t n, const std::function<void(int64_t)> &fn) {
    if (n <= 0) return;
    if (workers_.empty() || n == 1) {
      for (int64_t i = 0; i < n; ++i) fn(i);
      return;
    }
    std::lock_guard<std::mutex> run_lock(run_mu_);  // one parallel region at a time
    bool wake;
    {
      std::lock_guard<std::mutex> lock(mu_);
      fn_ = &fn;
      n_ = n;
      next_.store(0);
      busy_.store(static_cast<int>(workers_.size()));
      generation_.fetch_add(1, std::memory_order_release);
      wake = sleeping_ > 0;
    }
    if (wake) cv_.notify_all();
    Drain();
    for (int spins = 0; busy_.load(std::memory_order_acquire) != 0; ++spins) {
      if (spins < 4096) {
        Pause();
      } else {
        std::this_thread::yield();  // a worker was descheduled: let it run
      }
    }
    fn_ = nullptr;
  }

  ~ThreadPool() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_.store(true);
      generation_.fetch_add(1);
    }
    cv_.notify_all();
    for (auto &t : workers_) t.join();
  }

 private:
  explicit ThreadPool(int threads) {
    for (int i = 1; i < threads; ++i) workers_.emplace_back([this] { Loop(); });
  }

  static int DefaultThreads() {
    if (const char *env = std::getenv("MS_ATB_NUM_THREADS")) {
      int n = std::atoi(env);
      if (n >= 1) return n;
    }
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof(set), &set) == 0) {
      int n = CPU_COUNT(&set);
      if (n >= 1) return n;
    }
    unsigned n = std::thread::hardware_concurrency();
    return n == 0 ? 1 : static_cast<int>(n);
  }

  void Drain() {
    for (;;) {
      int64_t i = next_.fetch_add(1);
      if (i >= n_) return;
      (*fn_)(i);
    }
  }

  static void Pause() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
  }

  // Waits for a generation other than `seen`: spinning for kSpin, then asleep on cv_.
  uint64_t WaitForWork(uint64_t seen) {
    const auto deadline = std::chrono::steady_clock::now() + kSpin;
    for (int i = 0;; ++i) {
      uint64_t g = generation_.load(std::memory_order_acquire);
      if (g != seen) return g;
      Pause();
      if ((i & 63) == 63 && std::chrono::steady_clock::now() > deadline) break;
    }
    std::unique_lock<std::mutex> lock(mu_);
    ++sleeping_;
    cv_.wait(lock, [&] { return generation_.load() != seen; });
    --sleeping_;
    return generation_.load();
  }

  void Loop() {
    uint64_t seen = 0;
    for (;;) {
      seen = WaitForWork(seen);
      if (stop_.load()) return;
      Drain();
      busy_.fetch_sub(1, std::memory_order_release);
    }
  }

  static constexpr std::chrono::microseconds kSpin{200};

  std::vector<std::thread> workers_;
  std::mutex run_mu_;
  std::mutex mu_;
  std::condition_variable cv_;
  const std::function<void(int64_t)> *fn_ = nullptr;
  int64_t n_ = 0;
  std::atomic<int64_t> next_{0};
  std::atomic<int> busy_{0};
  std::atomic<uint64_t> generation_{0};
  int sleeping_ = 0;  // guarded by mu_
  std::atomic<bool> stop_{false};
};

}  // namespace ms_atb

#endif  // MS_ATB_OPS_THREAD_POOL_H_
