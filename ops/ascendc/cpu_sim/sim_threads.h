// The threads the programs of a launch run on: one per program, kept between launches. A model step launches
// each kernel once a layer, and starting and ending a thread for each of its 8-60 programs costs more than the
// programs' work (a float16 SmolLM2 run on the ascendc backend: 13.1 s with a thread started per program, 9.3 s
// with these; 5.5 s on the C++ backend). A program finds its thread as a fresh one would: the runner sets every
// field of Sim() before the program starts (sim_runner.h).
#ifndef MS_ATB_ASCENDC_SIM_THREADS_H_
#define MS_ATB_ASCENDC_SIM_THREADS_H_

#include <unistd.h>

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>

namespace AscendC {

class ProgramThreads {
 public:
  // The set of this process: a forked child starts a set of its own (the parent's threads are not in it).
  // Never destroyed: its threads wait for work until the process ends.
  static ProgramThreads &Get() {
    static std::mutex mu;
    static ProgramThreads *threads = nullptr;
    std::lock_guard<std::mutex> lock(mu);
    if (threads == nullptr || threads->pid_ != getpid()) threads = new ProgramThreads();
    return *threads;
  }

  // Calls body(p) for every p in [0, n), each on a thread of its own, all started at once; returns when every
  // call has returned. body must not throw. One launch at a time: a second caller waits.
  void Run(size_t n, const std::function<void(size_t)> &body) {
    std::lock_guard<std::mutex> launch(launch_mu_);
    std::unique_lock<std::mutex> lock(mu_);
    for (; started_ < n; ++started_) {
      const size_t p = started_;
      std::thread([this, p] { Loop(p); }).detach();
    }
    body_ = &body;
    n_ = n;
    remaining_ = n;
    ++generation_;
    work_.notify_all();
    done_.wait(lock, [&] { return remaining_ == 0; });
    body_ = nullptr;
  }

 private:
  ProgramThreads() : pid_(getpid()) {}

  void Loop(size_t p) {
    uint64_t seen = 0;
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      work_.wait(lock, [&] { return generation_ != seen && p < n_; });
      seen = generation_;
      const std::function<void(size_t)> *body = body_;
      lock.unlock();
      (*body)(p);
      lock.lock();
      if (--remaining_ == 0) done_.notify_one();
    }
  }

  const pid_t pid_;
  std::mutex launch_mu_;
  std::mutex mu_;
  std::condition_variable work_, done_;
  const std::function<void(size_t)> *body_ = nullptr;
  size_t started_ = 0, n_ = 0, remaining_ = 0;
  uint64_t generation_ = 0;
};

}  // namespace AscendC

#endif  // MS_ATB_ASCENDC_SIM_THREADS_H_
