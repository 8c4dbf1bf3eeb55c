// Shim configuration, read from the environment only (docs/shim.md has the
// table). Parsing is a pure function of an environment lookup so that every
// variable and every bad value is unit-tested without touching the process
// environment.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "opguard/common/log.h"
#include "opguard/common/status.h"

namespace opguard::shim {

struct Config {
  bool enabled = false;
  std::string run;                  // empty only when !enabled
  bool run_generated = false;       // OPGUARD_RUN was unset; `run` was derived
  std::string endpoint = "ipc:///run/opguard/ingest.sock";
  uint32_t rank = 0;
  uint32_t local_rank = 0;
  uint32_t world_size = 1;
  std::string rank_source = "default";  // "torchrun", "slurm", "openmpi", "default"
  uint32_t batch_records = 1024;
  uint32_t batch_interval_ms = 50;
  uint64_t buffer_bytes = 128ull << 20;
  uint32_t ack_timeout_ms = 2000;     // least ack timeout; adapted upwards to the ack latency
  uint32_t max_in_flight = 64;        // batches sent and not yet acknowledged, at most
  uint32_t flush_timeout_ms = 5000;
  uint32_t max_source_bytes = 1024u << 10;
  uint32_t max_pending_fp = 4096;     // unresolved pending fingerprints at most
  bool kernels = false;               // OPGUARD_KERNELS=1: record kernel names (docs/kernels.md)
  std::string cupti_library;          // OPGUARD_CUPTI_LIBRARY: the libcupti to load; empty: search
  LogLevel log_level = LogLevel::kInfo;
};

// Returns the value of an environment variable, or nullopt if unset.
using EnvLookup = std::function<std::optional<std::string>(const char*)>;

// The process environment (getenv).
EnvLookup ProcessEnv();

// Parses the configuration. OPGUARD unset or "0" gives {enabled = false} and
// reads nothing else (not even the log level). Any invalid value gives an InvalidArgument status whose
// message is the one warning line to print ("OPGUARD_BATCH_RECORDS='x' is not
// an integer in 1..1000000"). The log level is parsed first so that it
// applies even when another variable is invalid (returned through
// `log_level_out` when non-null).
Result<Config> ParseConfig(const EnvLookup& env, LogLevel* log_level_out = nullptr);

// A run name shared by every rank of one job when OPGUARD_RUN is unset:
// slurm-<job>[.<step>], torchrun-<rdzv id>, ompi-<jobid>, else
// <host>-<launcher pid>-<launcher start ticks> (the launcher is the parent
// process when world_size > 1, so sibling ranks agree; this process otherwise).
std::string GenerateRunName(const EnvLookup& env, uint32_t world_size);

}  // namespace opguard::shim
