// FingerprintCache and StorageSet (tensor_memory.h) against real tensors:
// what they remember of a storage is let go of once the storage is freed, so
// that the storage objects they reference do not pin the heap.
#include "tensor_memory.h"

#include <gtest/gtest.h>

#include <vector>

namespace opguard::torch_adapter {
namespace {

FingerprintCache::Key KeyOf(const at::Tensor& t) {
  return {t.data_ptr(), static_cast<uint32_t>(t._version()), /*dtype=*/1, /*contiguous=*/true,
          static_cast<size_t>(t.nbytes())};
}

FingerprintCache::Value ValueOf(const at::Tensor& t) {
  FingerprintCache::Value value;
  value.storage = t.storage().getWeakStorageImpl();
  value.lo = 1;
  return value;
}

// Weak references to the storage object of `t`, other than `w` itself and
// the one torch holds while the storage is alive.
uint32_t OtherWeakRefs(const c10::weak_intrusive_ptr<c10::StorageImpl>& w) {
  return w.weak_use_count() - 1 - (w.expired() ? 0 : 1);
}

TEST(FingerprintCacheTest, PutsLetGoOfFreedStorages) {
  FingerprintCache cache;
  c10::weak_intrusive_ptr<c10::StorageImpl> freed(c10::intrusive_ptr<c10::StorageImpl>{});
  {
    at::Tensor dead = at::ones({64});
    cache.Put(KeyOf(dead), ValueOf(dead));
    freed = dead.storage().getWeakStorageImpl();
    ASSERT_EQ(OtherWeakRefs(freed), 1u);  // the cache's
  }
  ASSERT_TRUE(freed.expired());
  EXPECT_EQ(OtherWeakRefs(freed), 1u) << "nothing let go of it yet";

  at::Tensor live = at::ones({64});
  cache.Put(KeyOf(live), ValueOf(live));
  // Another live tensor whose entry does not take the slot of `live`'s.
  at::Tensor other;
  for (int tries = 0; tries < 16; ++tries) {
    other = at::ones({32 + tries});
    cache.Put(KeyOf(other), ValueOf(other));
    if (cache.Find(KeyOf(live), live.storage().unsafeGetStorageImpl()) != nullptr) break;
    cache.Put(KeyOf(live), ValueOf(live));
  }
  ASSERT_NE(cache.Find(KeyOf(live), live.storage().unsafeGetStorageImpl()), nullptr);
  // However many entries a step puts, every slot is looked at again within
  // as many Puts as the table has slots.
  for (int i = 0; i < 4096; ++i) cache.Put(KeyOf(other), ValueOf(other));
  EXPECT_EQ(OtherWeakRefs(freed), 0u) << "the freed storage's object is still held";
  EXPECT_NE(cache.Find(KeyOf(live), live.storage().unsafeGetStorageImpl()), nullptr)
      << "a live storage's entry was dropped";
}

TEST(FingerprintCacheTest, NewStepLetsGoOfEveryStorage) {
  FingerprintCache cache;
  at::Tensor live = at::ones({16});
  c10::weak_intrusive_ptr<c10::StorageImpl> freed(c10::intrusive_ptr<c10::StorageImpl>{});
  {
    at::Tensor dead = at::ones({16});
    cache.Put(KeyOf(dead), ValueOf(dead));
    freed = dead.storage().getWeakStorageImpl();
  }
  cache.Put(KeyOf(live), ValueOf(live));
  auto held = live.storage().getWeakStorageImpl();
  ASSERT_EQ(OtherWeakRefs(held), 1u);
  cache.NewStep();
  EXPECT_EQ(OtherWeakRefs(freed), 0u);
  EXPECT_EQ(OtherWeakRefs(held), 0u);
  EXPECT_EQ(cache.Find(KeyOf(live), live.storage().unsafeGetStorageImpl()), nullptr);
}

// Clear (per op inside compiled code) drops the entries at once and leaves
// the references to Put's sweep.
TEST(FingerprintCacheTest, ClearDropsEveryEntry) {
  FingerprintCache cache;
  at::Tensor live = at::ones({16});
  cache.Put(KeyOf(live), ValueOf(live));
  ASSERT_NE(cache.Find(KeyOf(live), live.storage().unsafeGetStorageImpl()), nullptr);
  cache.Clear();
  EXPECT_EQ(cache.Find(KeyOf(live), live.storage().unsafeGetStorageImpl()), nullptr);
  cache.Put(KeyOf(live), ValueOf(live));
  EXPECT_NE(cache.Find(KeyOf(live), live.storage().unsafeGetStorageImpl()), nullptr);
}

// A write marked on a storage drops its entries put before, whatever the
// version in their keys (a tensor of the storage with a counter of its own
// reads the same count); entries put after it, and other storages', stay.
TEST(FingerprintCacheTest, AWrittenStorageDropsItsEarlierEntries) {
  FingerprintCache cache;
  at::Tensor t = at::ones({64});
  at::Tensor alias = t.detach();  // another tensor of the storage
  const c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
  // Another storage's entry that does not take the slot of `t`'s.
  at::Tensor other;
  for (int tries = 0; tries < 16; ++tries) {
    cache.Put(KeyOf(t), ValueOf(t));
    other = at::ones({16 + tries});
    cache.Put(KeyOf(other), ValueOf(other));
    if (cache.Find(KeyOf(t), storage) != nullptr) break;
  }
  ASSERT_NE(cache.Find(KeyOf(t), storage), nullptr);
  ASSERT_NE(cache.Find(KeyOf(other), other.storage().unsafeGetStorageImpl()), nullptr);
  cache.StorageWritten(alias.storage().unsafeGetStorageImpl());
  EXPECT_EQ(cache.Find(KeyOf(t), storage), nullptr) << "an entry from before the write";
  EXPECT_NE(cache.Find(KeyOf(other), other.storage().unsafeGetStorageImpl()), nullptr);
  cache.Put(KeyOf(t), ValueOf(t));
  EXPECT_NE(cache.Find(KeyOf(t), storage), nullptr) << "an entry from after the write";
  cache.Clear();
  cache.Put(KeyOf(t), ValueOf(t));
  EXPECT_NE(cache.Find(KeyOf(t), storage), nullptr) << "a write before Clear still counted";
}

TEST(StorageSetTest, FreedStoragesLeaveTheSetAsItGrows) {
  StorageSet set;
  std::vector<c10::weak_intrusive_ptr<c10::StorageImpl>> freed;
  for (int i = 0; i < 100; ++i) {
    at::Tensor dead = at::empty({8});
    set.Add(dead);
    freed.push_back(dead.storage().getWeakStorageImpl());
  }
  std::vector<at::Tensor> live;
  for (int i = 0; i < 300; ++i) {
    live.push_back(at::empty({8}));
    EXPECT_FALSE(set.Add(live.back())) << "a set of 400 storages was emptied";
  }
  for (const auto& w : freed) EXPECT_EQ(OtherWeakRefs(w), 0u);
  for (const at::Tensor& t : live) EXPECT_TRUE(set.Contains(t));
}

TEST(StorageSetTest, ASetFullOfLiveStoragesIsEmptied) {
  StorageSet set;
  std::vector<at::Tensor> live;
  bool emptied = false;
  for (int i = 0; i < 5000 && !emptied; ++i) {
    live.push_back(at::empty({1}));
    emptied = set.Add(live.back());
  }
  ASSERT_TRUE(emptied);
  EXPECT_EQ(live.size(), 4097u);
  EXPECT_TRUE(set.Contains(live.back()));
  EXPECT_FALSE(set.Contains(live.front()));
}

}  // namespace
}  // namespace opguard::torch_adapter
