#include "python_frames.h"

#include <Python.h>
#include <frameobject.h>

#include <mutex>
#include <string_view>
#include <unordered_map>

#include "opguard/shim.h"

namespace opguard::torch_adapter {
namespace {

struct CodeInfo {
  bool user = false;
  std::string file;
  std::string function;
  uint64_t file_id = 0;
};

std::mutex g_mu;  // guards the prefixes and the code cache (GIL held anyway)
std::vector<std::string>* g_prefixes = new std::vector<std::string>();
// Keyed by code object; a code object lives as long as its function, and a
// reused address only costs a wrong "user" classification for a new object
// of the same file set, which we avoid by also keying on the filename object.
std::unordered_map<const void*, CodeInfo>* g_codes = new std::unordered_map<const void*, CodeInfo>();

bool IsUserFile(std::string_view file) {
  if (file.empty() || file.front() == '<') return false;  // <frozen ...>, <string>
  for (const auto& prefix : *g_prefixes) {
    if (file.substr(0, prefix.size()) == prefix) return false;
  }
  return true;
}

const CodeInfo& Classify(PyCodeObject* code) {
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
  if (g_codes->size() > 100000) g_codes->clear();  // bound memory for code generated at run time
  return g_codes->emplace(code, std::move(info)).first->second;
}

}  // namespace

void SetSkippedPathPrefixes(std::vector<std::string> prefixes) {
  std::lock_guard<std::mutex> lock(g_mu);
  *g_prefixes = std::move(prefixes);
  g_codes->clear();
}

UserSite FindUserSite() {
  UserSite result;
  if (!Py_IsInitialized() || PyGILState_GetThisThreadState() == nullptr) return result;
  PyGILState_STATE gil = PyGILState_Ensure();
  {
    std::lock_guard<std::mutex> lock(g_mu);
    PyFrameObject* frame = PyEval_GetFrame();  // borrowed
    Py_XINCREF(frame);
    for (int depth = 0; frame != nullptr && depth < 64; ++depth) {
      PyCodeObject* code = PyFrame_GetCode(frame);  // new reference
      const CodeInfo& info = Classify(code);
      Py_DECREF(code);
      if (info.user) {
        int line = PyFrame_GetLineNumber(frame);
        result.site = opguard_site(info.file.c_str(), static_cast<uint32_t>(line),
                                   info.function.c_str());
        result.file = info.file_id;
        break;
      }
      PyFrameObject* back = PyFrame_GetBack(frame);  // new reference
      Py_DECREF(frame);
      frame = back;
    }
    Py_XDECREF(frame);
  }
  PyGILState_Release(gil);
  return result;
}

}  // namespace opguard::torch_adapter
