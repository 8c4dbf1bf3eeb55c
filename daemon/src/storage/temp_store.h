// Unit tests only: a Store in a fresh directory under `dir`, nullptr if it
// cannot be opened.
#pragma once

#include <memory>

#include "opguard/daemon/testing/batch_maker.h"
#include "storage/store.h"

namespace opguard::daemon {

inline std::unique_ptr<Store> OpenTempStore(const testing::TempDir& dir) {
  Config config;
  config.data_dir = dir.path() + "/data";
  auto store = Store::Open(config);
  return store.ok() ? std::move(*store) : nullptr;
}

}  // namespace opguard::daemon
