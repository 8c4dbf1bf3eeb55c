// Interned op names for the op observer, per thread (ThreadState::names).
#pragma once

#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>

#include "opguard/shim.h"

namespace opguard::torch_adapter {

// Interned names by the address of the name RecordFunction hands out. Names
// of dispatcher ops are the operator's schema name, which lives as long as the
// process; other names may live in the RecordFunction itself, so a hit is
// only taken when the text is still the same (the address may be reused).
class NameIds {
 public:
  uint64_t Get(const char* name) {
    auto it = by_ptr_.find(name);
    if (it != by_ptr_.end() && it->second.text == name) return it->second.id;
    uint64_t id = opguard_intern(name, std::strlen(name));
    if (by_ptr_.size() >= 4096) by_ptr_.clear();
    by_ptr_.insert_or_assign(name, Entry{name, id});
    return id;
  }
  // "aten::mm [AddmmBackward0]" for op `name` inside autograd node `node`
  // (its text and a hash of it). A hit compares texts, builds no string.
  uint64_t GetBackward(const char* name, std::string_view node, size_t node_hash) {
    const BackwardKey key{name, node_hash};
    auto it = by_node_.find(key);
    if (it != by_node_.end() && it->second.node == node && it->second.text == name) {
      return it->second.id;
    }
    std::string text = std::string(name) + " [" + std::string(node) + "]";
    uint64_t id = opguard_intern(text.data(), text.size());
    if (by_node_.size() >= 4096) by_node_.clear();
    by_node_.insert_or_assign(key, BackwardEntry{name, std::string(node), id});
    return id;
  }

 private:
  struct Entry {
    std::string text;
    uint64_t id;
  };
  struct BackwardKey {
    const char* name;
    size_t node_hash;
    bool operator==(const BackwardKey&) const = default;
  };
  struct BackwardKeyHash {
    size_t operator()(const BackwardKey& k) const {
      return std::hash<const char*>()(k.name) ^ (k.node_hash * 0x9E3779B97F4A7C15ull);
    }
  };
  struct BackwardEntry {
    std::string text;  // the op's name
    std::string node;
    uint64_t id;
  };
  std::unordered_map<const char*, Entry> by_ptr_;
  std::unordered_map<BackwardKey, BackwardEntry, BackwardKeyHash> by_node_;
};


}  // namespace opguard::torch_adapter
