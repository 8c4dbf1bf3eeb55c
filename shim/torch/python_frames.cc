#include "python_frames.h"

#include <Python.h>
#include <frameobject.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <string_view>
#include <unordered_map>

#include "opguard/shim.h"

namespace opguard::torch_adapter {
namespace {

// What the lookup knows about one code object. The cache holds a strong
// reference to the code object, so its address cannot be reused by another
// code object while the entry exists.
struct CodeInfo {
  bool user = false;
  std::string file;
  std::string function;
  uint64_t file_id = 0;
  // Site id by instruction offset (user code only): a frame suspended at the
  // same instruction of the same code is on the same line.
  std::unordered_map<int, uint64_t> sites;
};

std::mutex g_mu;  // guards the prefixes and the code cache (GIL held anyway)
std::vector<std::string>* g_prefixes = new std::vector<std::string>();
std::atomic<uint64_t> g_prefix_generation{0};
uint64_t g_cache_generation = 0;  // generation the code cache was built with
std::unordered_map<PyCodeObject*, CodeInfo>* g_codes = new std::unordered_map<PyCodeObject*, CodeInfo>();

bool IsUserFile(std::string_view file) {
  if (file.empty() || file.front() == '<') return false;  // <frozen ...>, <string>
  for (const auto& prefix : *g_prefixes) {
    if (file.substr(0, prefix.size()) == prefix) return false;
  }
  return true;
}

// Drops the cache and its references. GIL and g_mu held.
void ClearCodes() {
  for (auto& [code, info] : *g_codes) Py_DECREF(reinterpret_cast<PyObject*>(code));
  g_codes->clear();
}

// GIL and g_mu held.
CodeInfo& Classify(PyCodeObject* code) {
  auto it = g_codes->find(code);
  if (it != g_codes->end()) return it->second;
  CodeInfo info;
  Py_ssize_t len = 0;
  const char* file = PyUnicode_AsUTF8AndSize(code->co_filename, &len);
  const char* name = PyUnicode_AsUTF8(code->co_name);
  if (file == nullptr || name == nullptr) {
    PyErr_Clear();
  } else {
    info.file.assign(file, static_cast<size_t>(len));
    info.function = name;
    info.user = IsUserFile(info.file);
    if (info.user) {
      info.file_id = opguard_source_file(info.file.c_str(), nullptr, 0);
    }
  }
  if (g_codes->size() > 100000) ClearCodes();  // bound memory for code generated at run time
  Py_INCREF(reinterpret_cast<PyObject*>(code));
  return g_codes->emplace(code, std::move(info)).first->second;
}

int LastInstruction(PyFrameObject* frame) {
#if PY_VERSION_HEX >= 0x030B0000
  return PyFrame_GetLasti(frame);
#else
  return frame->f_lasti;
#endif
}

}  // namespace

void SetSkippedPathPrefixes(std::vector<std::string> prefixes) {
  std::lock_guard<std::mutex> lock(g_mu);
  *g_prefixes = std::move(prefixes);
  // The cache holds Python references: it is rebuilt by the next lookup,
  // which holds the GIL (this may be called without it, through ctypes).
  g_prefix_generation.fetch_add(1);
}

namespace {

// Calls fn(frame, lasti) for each user frame of the calling thread, innermost
// first. GIL and g_mu held.
template <typename Fn>
void ForEachUserFrame(Fn&& fn) {
  PyFrameObject* frame = PyEval_GetFrame();  // borrowed
  Py_XINCREF(frame);
  for (int depth = 0; frame != nullptr && depth < 256; ++depth) {
    PyCodeObject* code = PyFrame_GetCode(frame);  // new reference
    const bool user = Classify(code).user;
    Py_DECREF(code);
    if (user) fn(frame, LastInstruction(frame));
    PyFrameObject* back = PyFrame_GetBack(frame);  // new reference
    Py_DECREF(frame);
    frame = back;
  }
  Py_XDECREF(frame);
}

// Runs fn with the GIL and g_mu held; false if this thread cannot run Python.
// torch releases the GIL around every op, so the thread usually has to take it
// back; when it still holds it (ops run from C++ with the GIL held), Ensure
// and Release are skipped.
template <typename Fn>
bool WithFrames(Fn&& fn) {
  if (!Py_IsInitialized() || PyGILState_GetThisThreadState() == nullptr) return false;
  const bool held = PyGILState_Check() != 0;
  PyGILState_STATE gil = PyGILState_LOCKED;
  if (!held) gil = PyGILState_Ensure();
  {
    std::lock_guard<std::mutex> lock(g_mu);
    fn();
  }
  if (!held) PyGILState_Release(gil);
  return true;
}

}  // namespace

UserSite FindUserSite() {
  UserSite result;
  WithFrames([&] {
    uint64_t generation = g_prefix_generation.load();
    if (generation != g_cache_generation) {
      ClearCodes();
      g_cache_generation = generation;
    }
    PyFrameObject* frame = PyEval_GetFrame();  // borrowed
    Py_XINCREF(frame);
    for (int depth = 0; frame != nullptr && depth < 64; ++depth) {
      PyCodeObject* code = PyFrame_GetCode(frame);  // new reference
      CodeInfo& info = Classify(code);
      Py_DECREF(code);  // the cache holds its own reference
      if (info.user) {
        int lasti = LastInstruction(frame);
        auto hit = info.sites.find(lasti);
        if (hit != info.sites.end()) {
          result.site = hit->second;
        } else {
          int line = PyFrame_GetLineNumber(frame);
          result.site = opguard_site(info.file.c_str(), static_cast<uint32_t>(line),
                                     info.function.c_str());
          if (info.sites.size() >= 4096) info.sites.clear();
          info.sites.emplace(lasti, result.site);
        }
        result.file = info.file_id;
        break;
      }
      PyFrameObject* back = PyFrame_GetBack(frame);  // new reference
      Py_DECREF(frame);
      frame = back;
    }
    Py_XDECREF(frame);
  });
  return result;
}

void UserStack::Capture() {
  WithFrames([&] {
    for (const Frame& f : frames_) Py_DECREF(static_cast<PyObject*>(f.frame));
    frames_.clear();
    ForEachUserFrame([&](PyFrameObject* frame, int lasti) {
      Py_INCREF(reinterpret_cast<PyObject*>(frame));
      frames_.push_back(Frame{frame, lasti});
    });
    std::reverse(frames_.begin(), frames_.end());
  });
}

bool UserStack::IsBehind() const {
  bool behind = false;
  WithFrames([&] {
    std::vector<Frame> now;
    ForEachUserFrame([&](PyFrameObject* frame, int lasti) { now.push_back(Frame{frame, lasti}); });
    std::reverse(now.begin(), now.end());
    for (size_t i = 0; i < std::min(now.size(), frames_.size()); ++i) {
      if (now[i].frame != frames_[i].frame) {
        behind = true;
        return;
      }
      if (now[i].lasti != frames_[i].lasti) {
        behind = now[i].lasti < frames_[i].lasti;
        return;
      }
    }
  });
  return behind;
}

}  // namespace opguard::torch_adapter
