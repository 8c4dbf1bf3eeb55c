// The shim's C API (opguard/shim.h), loaded when recording starts rather
// than linked: with OPGUARD unset, a process that preloads libopguard_nccl.so
// (every process a job starts, under `opguard exec`) loads nothing beyond
// libc, and with it set, an opguard adapter in the same process shares the
// one libopguard_shim.so.1.
#pragma once

#include "opguard/shim.h"

namespace opguard::nccl {

struct ShimApi {
  decltype(&opguard_enabled) enabled;
  decltype(&opguard_set_run_info) set_run_info;
  decltype(&opguard_site) site;
  decltype(&opguard_communicator_define) communicator_define;
  decltype(&opguard_record_collective) record_collective;
  decltype(&opguard_fingerprint_host) fingerprint_host;
  // API 3 (pending fingerprints); NULL with an older shim: device buffers are
  // then recorded without fingerprints.
  decltype(&opguard_fingerprint_device_async) fingerprint_device_async;
};

// The shim: the libopguard_shim.so.1 already in the process, else the one
// next to this library (its RUNPATH). NULL (logged once)
// if none loads; recording is then off. Thread-safe; loads once.
const ShimApi* Shim();

}  // namespace opguard::nccl
