// The thread pool is exception-safe: a task that throws on a worker or on the
// caller ends the job (no task starts after it), every thread leaves the
// function before ParallelFor returns, the first exception reaches the caller
// once, and the pool serves the next job. Every task runs once, on more than
// one thread. Built twice: without libgomp (the pool's own threads) and, on
// x86, linked with libgomp (the OpenMP team runs the sections); the test is
// told which to expect by RVASCEND_EXPECT_THREAD_TEAM.
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>
#include <stdexcept>
#include <cstdio>
#include <thread>
#include <vector>

#include "rvv_kernels/base/kernel_testing.h"
#include "rvv_kernels/base/thread_pool.h"

namespace rvascend {
namespace {

void ThrowingTask(size_t threads, size_t bad_task) {
  ThreadPool& pool = ThreadPool::Global();
  std::atomic<int> inside{0}, started{0};
  std::atomic<bool> overlapped_return{false};
  bool caught = false;
  try {
    pool.ParallelFor(64, threads, [&](size_t task) {
      ++inside;
      ++started;
      std::this_thread::sleep_for(std::chrono::microseconds(200));
      --inside;
      if (task == bad_task) throw std::runtime_error("task failed");
    });
  } catch (const std::runtime_error& e) {
    caught = std::string(e.what()) == "task failed";
    overlapped_return = inside.load() != 0;
  }
  EXPECT(caught, "threads %zu, bad task %zu: the task's exception reaches the caller", threads, bad_task);
  EXPECT(!overlapped_return.load(), "threads %zu: a thread was still inside fn when ParallelFor returned", threads);
  EXPECT(started.load() < 64 || bad_task == 63, "threads %zu: tasks kept starting after the failure (%d)", threads,
         started.load());
  // The pool serves the next job whole.
  std::vector<int> hit(100, 0);
  pool.ParallelFor(100, threads, [&](size_t t) { hit[t] += 1; });
  int sum = 0;
  for (int h : hit) sum += h;
  EXPECT(sum == 100, "threads %zu: the job after a failure ran %d of 100 tasks", threads, sum);
}

void EveryTaskOnceOnSeveralThreads() {
  std::vector<std::atomic<int>> hits(1000);
  std::mutex m;
  std::set<std::thread::id> threads;
  ThreadPool::Global().ParallelFor(1000, 2, [&](size_t t) {
    hits[t].fetch_add(1);
    std::this_thread::sleep_for(std::chrono::microseconds(20));
    std::lock_guard<std::mutex> lock(m);
    threads.insert(std::this_thread::get_id());
  });
  int wrong = 0;
  for (auto& h : hits) wrong += h.load() != 1;
  EXPECT(wrong == 0, "%d of 1000 tasks did not run exactly once", wrong);
  EXPECT(threads.size() == 2, "a 2-thread job ran on %zu threads", threads.size());
}

}  // namespace
}  // namespace rvascend

int main() {
  const char* expect = std::getenv("RVASCEND_EXPECT_THREAD_TEAM");
  std::printf("thread team: %s\n", rvascend::ThreadPool::Team());
  EXPECT(expect == nullptr || std::strcmp(expect, rvascend::ThreadPool::Team()) == 0, "expected the %s team",
         expect ? expect : "");
  rvascend::EveryTaskOnceOnSeveralThreads();
  // Failures early and late in the job, serial and on 2 and 4 threads.
  for (size_t threads : {1, 2, 4}) {
    for (size_t bad : {0, 1, 40, 63}) rvascend::ThrowingTask(threads, bad);
  }
  return rvascend::testing::Summary();
}
