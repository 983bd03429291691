// A persistent pool for the packed-linear driver. The caller says how many
// threads a call may use (torch's intra-op thread count): torch's own OpenMP
// workers are idle while our op runs, so that many threads never oversubscribe.
#ifndef RVV_KERNELS_BASE_THREAD_POOL_H_
#define RVV_KERNELS_BASE_THREAD_POOL_H_

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace rvascend {

class ThreadPool {
 public:
  static ThreadPool& Global();

  // Which threads run parallel sections: "openmp" (the process's OpenMP team,
  // on x86 once torch has loaded libgomp) or "own" (this pool's).
  static const char* Team();

  // Runs fn(task) for task in [0, num_tasks) on up to num_threads threads
  // (the caller is one of them); returns when all tasks are done. If a task
  // throws (on any thread), no further task starts, every thread leaves fn,
  // and the first exception is rethrown here, once.
  void ParallelFor(size_t num_tasks, size_t num_threads, const std::function<void(size_t)>& fn);

  ~ThreadPool();

 private:
  // One job's tasks, handed out one at a time to whichever thread asks (this
  // pool's or an OpenMP team's). If a task throws, no further task starts and
  // the first exception is kept for the caller.
  struct Tasks {
    const std::function<void(size_t)>* fn = nullptr;
    size_t count = 0;
    std::atomic<size_t> next{0};
    std::mutex error_mutex;
    std::exception_ptr error;

    void Run();
  };

  void EnsureWorkers(size_t count);
  void WorkerLoop(size_t index);

  std::mutex call_mutex_;  // one ParallelFor at a time
  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable done_;
  std::vector<std::thread> workers_;
  bool stop_ = false;
  std::atomic<size_t> generation_{0};  // written under mutex_, polled without it
  size_t participants_ = 0;            // workers taking part in the current job
  std::atomic<size_t> active_{0};      // workers still running the current job
  Tasks tasks_;  // the current job
};

}  // namespace rvascend

#endif  // RVV_KERNELS_BASE_THREAD_POOL_H_
