// Fingerprints taken off the recording thread (async_fingerprints.h) against
// the real shim: every hash handed to the fingerprint thread leaves its
// storage's pending count when it is done, however the threads interleave.
#include "async_fingerprints.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace opguard::torch_adapter {
namespace {

// Two recording threads submit small tensors as fast as they can while the
// fingerprint thread hashes and releases them; each submission also drops
// the references released so far (what a recording thread does before each
// op). A release that read its storage after handing its reference over
// could decrement another storage's count, leaving one pending for good.
TEST(AsyncFingerprintsTest, EveryReleasedHashLeavesItsStorage) {
  const std::string endpoint = "ipc:///tmp/opguard-async-test-" + std::to_string(getpid());
  setenv("OPGUARD", "1", 1);
  setenv("OPGUARD_RUN", "async-test", 1);
  setenv("OPGUARD_ENDPOINT", endpoint.c_str(), 1);  // nothing listens: records stay buffered
  ASSERT_EQ(opguard_init(), 1);
  constexpr int kThreads = 2;
  constexpr int kPerThread = 300000;
  std::vector<std::set<const c10::StorageImpl*>> seen(kThreads);
  std::vector<int> taken(kThreads, 0);
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      const int64_t shape[] = {16};
      for (int n = 0; n < kPerThread; ++n) {
        at::Tensor t = at::full({16}, static_cast<float>(n));
        opguard_tensor out{};
        if (SubmitHostFingerprint(t, OPGUARD_DTYPE_FLOAT32, shape, 1, &out)) ++taken[i];
        seen[i].insert(t.storage().unsafeGetStorageImpl());
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_GT(taken[0] + taken[1], 0);
  // Bounded wait for the fingerprint thread to drain its queue.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  size_t stuck = 0;
  do {
    stuck = 0;
    for (const auto& storages : seen) {
      for (const c10::StorageImpl* s : storages) stuck += PendingHashesOf(s);
    }
    if (stuck != 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  } while (stuck != 0 && std::chrono::steady_clock::now() < deadline);
  EXPECT_EQ(stuck, 0u) << "storages still counted as pending after every hash was released";
}

}  // namespace
}  // namespace opguard::torch_adapter
