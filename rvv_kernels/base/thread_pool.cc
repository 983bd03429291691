#include "rvv_kernels/base/thread_pool.h"

#include <chrono>
#include <cstdlib>
#include <cstring>

#if defined(__x86_64__)
#include <dlfcn.h>
#endif

namespace rvascend {
namespace {

// On x86 hosts, a process that has loaded libgomp (torch has, before any op of
// ours runs) gets our parallel sections run by its OpenMP team instead of
// this pool's threads. Two teams on the same cores fight: after a torch op,
// its OpenMP workers spin for a while, and our workers then share their cores
// with them (on a two-core host a SmolLM2 decode step spent 14 % of its
// samples in libgomp's spin, and the measured shape gate timed that
// contention instead of the kernels). The team is found at run time
// (dlopen with RTLD_NOLOAD: never loads a libgomp of its own), so builds
// without torch keep this pool. RVASCEND_THREAD_POOL=own keeps it too (A/B
// measurements). riscv64 keeps this pool: its step profiles count
// instructions by library, and the board's figures were measured with it.
using GompParallelFn = void (*)(void (*)(void*), void*, unsigned, unsigned);

GompParallelFn OpenMpTeam() {
#if defined(__x86_64__)
  static const GompParallelFn fn = []() -> GompParallelFn {
    const char* choice = std::getenv("RVASCEND_THREAD_POOL");
    if (choice != nullptr && std::strcmp(choice, "own") == 0) return nullptr;
    void* gomp = dlopen("libgomp.so.1", RTLD_NOW | RTLD_NOLOAD);
    return gomp == nullptr ? nullptr : reinterpret_cast<GompParallelFn>(dlsym(gomp, "GOMP_parallel"));
  }();
  return fn;
#else
  return nullptr;
#endif
}

// How long a thread polls before it sleeps on a condition variable. A fused
// decode step runs about five parallel sections per layer with microseconds
// between them; a futex sleep and wake costs tens of microseconds each time,
// which summed to a third of a Qwen3-0.6B decode step on a two-core host.
constexpr auto kSpin = std::chrono::microseconds(200);

template <typename Done>
bool SpinUntil(Done done) {
  const auto until = std::chrono::steady_clock::now() + kSpin;
  for (unsigned i = 1;; ++i) {
    if (done()) return true;
    if ((i & 63) == 0 && std::chrono::steady_clock::now() >= until) return false;
  }
}

}  // namespace

const char* ThreadPool::Team() { return OpenMpTeam() != nullptr ? "openmp" : "own"; }

ThreadPool& ThreadPool::Global() {
  // Leaked on purpose: joining threads from a static destructor at process
  // exit races with interpreter teardown.
  static ThreadPool* pool = new ThreadPool();
  return *pool;
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::EnsureWorkers(size_t count) {
  while (workers_.size() < count) {
    const size_t index = workers_.size();
    workers_.emplace_back([this, index] { WorkerLoop(index); });
  }
}

void ThreadPool::Tasks::Run() {
  for (size_t task = next.fetch_add(1); task < count; task = next.fetch_add(1)) {
    try {
      (*fn)(task);
    } catch (...) {
      // The first failure is kept and rethrown by the caller once every thread
      // has left fn; no task is handed out after it.
      std::lock_guard<std::mutex> lock(error_mutex);
      if (!error) error = std::current_exception();
      next.store(count);
    }
  }
}

void ThreadPool::WorkerLoop(size_t index) {
  size_t seen = 0;
  for (;;) {
    SpinUntil([&] { return generation_.load(std::memory_order_acquire) != seen; });
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return stop_ || (generation_ != seen && index < participants_); });
      if (stop_) return;
      seen = generation_;
    }
    tasks_.Run();
    if (active_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      // Under the lock, so the caller cannot miss it between its check and its wait.
      std::lock_guard<std::mutex> lock(mutex_);
      done_.notify_one();
    }
  }
}

void ThreadPool::ParallelFor(size_t num_tasks, size_t num_threads,
                             const std::function<void(size_t)>& fn) {
  if (num_tasks == 0) return;
  const size_t helpers = (num_threads < num_tasks ? num_threads : num_tasks) - 1;
  if (num_threads <= 1 || helpers == 0) {
    for (size_t t = 0; t < num_tasks; ++t) fn(t);
    return;
  }
  if (const GompParallelFn team = OpenMpTeam()) {
    Tasks tasks;
    tasks.fn = &fn;
    tasks.count = num_tasks;
    team([](void* t) { static_cast<Tasks*>(t)->Run(); }, &tasks, static_cast<unsigned>(helpers + 1), 0);
    if (tasks.error) std::rethrow_exception(tasks.error);
    return;
  }
  std::lock_guard<std::mutex> call(call_mutex_);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    EnsureWorkers(helpers);
    tasks_.fn = &fn;
    tasks_.count = num_tasks;
    tasks_.next.store(0);
    participants_ = helpers;
    active_ = helpers;
    ++generation_;
  }
  wake_.notify_all();
  tasks_.Run();
  if (!SpinUntil([&] { return active_.load(std::memory_order_acquire) == 0; })) {
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [&] { return active_.load(std::memory_order_acquire) == 0; });
  }
  std::exception_ptr error;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    tasks_.fn = nullptr;
    std::lock_guard<std::mutex> error_lock(tasks_.error_mutex);
    std::swap(error, tasks_.error);
  }
  if (error) std::rethrow_exception(error);
}

}  // namespace rvascend
