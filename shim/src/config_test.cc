#include "config.h"

#include <gtest/gtest.h>

#include <map>

namespace opguard::shim {
namespace {

using Env = std::map<std::string, std::string>;

EnvLookup Lookup(const Env& env) {
  return [env](const char* name) -> std::optional<std::string> {
    auto it = env.find(name);
    if (it == env.end()) return std::nullopt;
    return it->second;
  };
}

Result<Config> Parse(Env env) { return ParseConfig(Lookup(env)); }

// Expects the value to be refused with one line naming the variable.
void ExpectBad(Env env, const std::string& var) {
  auto c = Parse(env);
  ASSERT_FALSE(c.ok()) << var;
  const std::string& m = c.status().message();
  EXPECT_NE(m.find(var), std::string::npos) << m;
  EXPECT_NE(m.find("disabled"), std::string::npos) << m;
  EXPECT_EQ(m.find('\n'), std::string::npos) << m;
}

TEST(ShimConfig, DisabledUnlessOpguardIsOne) {
  for (const Env& env : {Env{}, Env{{"OPGUARD", "0"}}, Env{{"OPGUARD", ""}}}) {
    auto c = Parse(env);
    ASSERT_TRUE(c.ok());
    EXPECT_FALSE(c->enabled);
  }
  auto c = Parse({{"OPGUARD", "1"}, {"OPGUARD_RUN", "r"}});
  ASSERT_TRUE(c.ok());
  EXPECT_TRUE(c->enabled);
}

TEST(ShimConfig, DisabledReadsNothingElse) {
  // A bad tuning value in a job that does not enable OpGuard is not an error.
  auto c = Parse({{"OPGUARD_BATCH_RECORDS", "x"}, {"OPGUARD_LOG_LEVEL", "loud"}, {"RANK", "9"}});
  ASSERT_TRUE(c.ok());
  EXPECT_FALSE(c->enabled);
}

TEST(ShimConfig, BadOpguardValue) {
  for (const char* v : {"yes", "true", "2", " 1", "1 "}) ExpectBad({{"OPGUARD", v}}, "OPGUARD");
}

TEST(ShimConfig, Defaults) {
  auto c = Parse({{"OPGUARD", "1"}, {"OPGUARD_RUN", "r"}});
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->endpoint, "ipc:///run/opguard/ingest.sock");
  EXPECT_EQ(c->rank, 0u);
  EXPECT_EQ(c->local_rank, 0u);
  EXPECT_EQ(c->world_size, 1u);
  EXPECT_EQ(c->rank_source, "default");
  EXPECT_EQ(c->batch_records, 1024u);
  EXPECT_EQ(c->batch_interval_ms, 50u);
  EXPECT_EQ(c->buffer_bytes, 128ull << 20);
  EXPECT_EQ(c->ack_timeout_ms, 2000u);
  EXPECT_EQ(c->max_in_flight, 64u);
  EXPECT_EQ(c->flush_timeout_ms, 5000u);
  EXPECT_EQ(c->max_source_bytes, 1024u << 10);
  EXPECT_EQ(c->log_level, LogLevel::kInfo);
  EXPECT_FALSE(c->run_generated);
}

TEST(ShimConfig, RunName) {
  auto c = Parse({{"OPGUARD", "1"}, {"OPGUARD_RUN", "gpt-7b_ref.2"}});
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->run, "gpt-7b_ref.2");
  const std::string too_long(129, 'a');
  for (const char* v : {"", "has space", "a/b", "ü", too_long.c_str()}) {
    ExpectBad({{"OPGUARD", "1"}, {"OPGUARD_RUN", v}}, "OPGUARD_RUN");
  }
}

TEST(ShimConfig, GeneratedRunNameIsSharedByTheJob) {
  auto slurm = Parse({{"OPGUARD", "1"}, {"SLURM_JOB_ID", "4711"}, {"SLURM_STEP_ID", "0"}});
  ASSERT_TRUE(slurm.ok());
  EXPECT_TRUE(slurm->run_generated);
  EXPECT_EQ(slurm->run, "slurm-4711.0");
  auto torchrun = Parse({{"OPGUARD", "1"}, {"TORCHELASTIC_RUN_ID", "abc-1"}});
  ASSERT_TRUE(torchrun.ok());
  EXPECT_EQ(torchrun->run, "torchrun-abc-1");
  auto ompi = Parse({{"OPGUARD", "1"}, {"OMPI_MCA_ess_base_jobid", "123"}});
  ASSERT_TRUE(ompi.ok());
  EXPECT_EQ(ompi->run, "ompi-123");
  // torchrun's default rendezvous id "none" names nothing: host-launcher-start.
  auto none = Parse({{"OPGUARD", "1"}, {"TORCHELASTIC_RUN_ID", "none"}});
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->run.find("torchrun"), std::string::npos);
  EXPECT_FALSE(none->run.empty());
  // Siblings of one launcher agree; the name is stable within the process.
  EXPECT_EQ(GenerateRunName(Lookup({}), 4), GenerateRunName(Lookup({}), 4));
}

TEST(ShimConfig, Endpoint) {
  for (const char* v : {"ipc:///tmp/x.sock", "tcp://127.0.0.1:7000", "inproc://x"}) {
    auto c = Parse({{"OPGUARD", "1"}, {"OPGUARD_RUN", "r"}, {"OPGUARD_ENDPOINT", v}});
    ASSERT_TRUE(c.ok()) << v;
    EXPECT_EQ(c->endpoint, v);
  }
  for (const char* v : {"", "/tmp/x.sock", "ipc://", "http://x", "tcp://a b"}) {
    ExpectBad({{"OPGUARD", "1"}, {"OPGUARD_RUN", "r"}, {"OPGUARD_ENDPOINT", v}}, "OPGUARD_ENDPOINT");
  }
}

TEST(ShimConfig, RankFromTorchrunSlurmOpenMpiInThatOrder) {
  Env base{{"OPGUARD", "1"}, {"OPGUARD_RUN", "r"}};
  Env t = base;
  t.insert({{"RANK", "3"}, {"LOCAL_RANK", "1"}, {"WORLD_SIZE", "8"},
            {"SLURM_PROCID", "5"}, {"SLURM_LOCALID", "0"}, {"SLURM_NTASKS", "16"}});
  auto c = Parse(t);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->rank, 3u);
  EXPECT_EQ(c->local_rank, 1u);
  EXPECT_EQ(c->world_size, 8u);
  EXPECT_EQ(c->rank_source, "torchrun");

  Env s = base;
  s.insert({{"SLURM_PROCID", "5"}, {"SLURM_LOCALID", "1"}, {"SLURM_NTASKS", "16"},
            {"OMPI_COMM_WORLD_RANK", "2"}, {"OMPI_COMM_WORLD_SIZE", "4"}});
  c = Parse(s);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->rank, 5u);
  EXPECT_EQ(c->local_rank, 1u);
  EXPECT_EQ(c->world_size, 16u);
  EXPECT_EQ(c->rank_source, "slurm");

  Env o = base;
  o.insert({{"OMPI_COMM_WORLD_RANK", "2"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "0"},
            {"OMPI_COMM_WORLD_SIZE", "4"}});
  c = Parse(o);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->rank, 2u);
  EXPECT_EQ(c->local_rank, 0u);
  EXPECT_EQ(c->world_size, 4u);
  EXPECT_EQ(c->rank_source, "openmpi");

  // Local rank is optional: it defaults to the rank.
  Env nolocal = base;
  nolocal.insert({{"RANK", "2"}, {"WORLD_SIZE", "4"}});
  c = Parse(nolocal);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->local_rank, 2u);
}

TEST(ShimConfig, BadRanks) {
  Env base{{"OPGUARD", "1"}, {"OPGUARD_RUN", "r"}};
  struct Case {
    Env env;
    const char* var;
  } cases[] = {
      {{{"RANK", "x"}, {"WORLD_SIZE", "2"}}, "RANK"},
      {{{"RANK", "-1"}, {"WORLD_SIZE", "2"}}, "RANK"},
      {{{"RANK", "1"}}, "WORLD_SIZE"},
      {{{"RANK", "1"}, {"WORLD_SIZE", "0"}}, "WORLD_SIZE"},
      {{{"RANK", "2"}, {"WORLD_SIZE", "2"}}, "RANK"},
      {{{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "2"}}, "LOCAL_RANK"},
      {{{"RANK", "0"}, {"WORLD_SIZE", "2x"}}, "WORLD_SIZE"},
      {{{"SLURM_PROCID", "a"}, {"SLURM_NTASKS", "2"}}, "SLURM_PROCID"},
      {{{"SLURM_PROCID", "0"}}, "SLURM_NTASKS"},
      {{{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_LOCALID", "z"}}, "SLURM_LOCALID"},
      {{{"OMPI_COMM_WORLD_RANK", "5"}, {"OMPI_COMM_WORLD_SIZE", "4"}}, "OMPI_COMM_WORLD_RANK"},
      {{{"OMPI_COMM_WORLD_RANK", "0"}}, "OMPI_COMM_WORLD_SIZE"},
  };
  for (const auto& c : cases) {
    Env env = base;
    env.insert(c.env.begin(), c.env.end());
    ExpectBad(env, c.var);
  }
}

struct TuningCase {
  const char* var;
  std::vector<const char*> good;
  std::vector<const char*> bad;
};

TEST(ShimConfig, TuningVariables) {
  const TuningCase cases[] = {
      {"OPGUARD_BATCH_RECORDS", {"1", "1000000"}, {"0", "1000001", "x", "-5", "1e3", "", " 1"}},
      {"OPGUARD_BATCH_INTERVAL_MS",
       {"1", "60000"},
       {"0", "60001", "abc", "99999999999999999999999"}},
      {"OPGUARD_BUFFER_MB", {"1", "65536"}, {"0", "65537", "1.5"}},
      {"OPGUARD_ACK_TIMEOUT_MS", {"10", "600000"}, {"9", "600001", "ten"}},
      {"OPGUARD_MAX_IN_FLIGHT", {"1", "1000"}, {"0", "1001", "-1", "8 ", "0x10", "", "many"}},
      {"OPGUARD_FLUSH_TIMEOUT_MS", {"0", "600000"}, {"600001", "-1", "5s"}},
      {"OPGUARD_MAX_SOURCE_KB", {"0", "65536"}, {"65537", "big"}},
      {"OPGUARD_MAX_PENDING_FP", {"1", "1000000"}, {"0", "1000001", "lots"}},
      {"OPGUARD_LOG_LEVEL", {"debug", "info", "warn", "error", "off"}, {"loud", "INFO", ""}},
      {"OPGUARD_KERNELS", {"0", "1"}, {"yes", "2", ""}},
  };
  for (const auto& tc : cases) {
    for (const char* v : tc.good) {
      auto c = Parse({{"OPGUARD", "1"}, {"OPGUARD_RUN", "r"}, {tc.var, v}});
      EXPECT_TRUE(c.ok()) << tc.var << "=" << v << ": " << c.status().message();
    }
    for (const char* v : tc.bad) ExpectBad({{"OPGUARD", "1"}, {"OPGUARD_RUN", "r"}, {tc.var, v}}, tc.var);
  }
  auto c = Parse({{"OPGUARD", "1"}, {"OPGUARD_RUN", "r"}, {"OPGUARD_BATCH_RECORDS", "7"},
                  {"OPGUARD_BATCH_INTERVAL_MS", "8"}, {"OPGUARD_BUFFER_MB", "9"},
                  {"OPGUARD_ACK_TIMEOUT_MS", "100"}, {"OPGUARD_MAX_IN_FLIGHT", "5"},
                  {"OPGUARD_FLUSH_TIMEOUT_MS", "0"},
                  {"OPGUARD_MAX_SOURCE_KB", "2"}, {"OPGUARD_MAX_PENDING_FP", "3"},
                  {"OPGUARD_LOG_LEVEL", "debug"}});
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->batch_records, 7u);
  EXPECT_EQ(c->batch_interval_ms, 8u);
  EXPECT_EQ(c->buffer_bytes, 9ull << 20);
  EXPECT_EQ(c->ack_timeout_ms, 100u);
  EXPECT_EQ(c->max_in_flight, 5u);
  EXPECT_EQ(c->flush_timeout_ms, 0u);
  EXPECT_EQ(c->max_source_bytes, 2048u);
  EXPECT_EQ(c->max_pending_fp, 3u);
  EXPECT_EQ(c->log_level, LogLevel::kDebug);
  EXPECT_FALSE(c->kernels) << "kernel names are off by default";
  auto k = Parse({{"OPGUARD", "1"},
                  {"OPGUARD_RUN", "r"},
                  {"OPGUARD_KERNELS", "1"},
                  {"OPGUARD_CUPTI_LIBRARY", "/opt/cuda/libcupti.so"}});
  ASSERT_TRUE(k.ok());
  EXPECT_TRUE(k->kernels);
  EXPECT_EQ(k->cupti_library, "/opt/cuda/libcupti.so");
}

TEST(ShimConfig, LogLevelIsReportedEvenWhenAnotherValueIsBad) {
  LogLevel level = LogLevel::kInfo;
  auto c = ParseConfig(Lookup({{"OPGUARD", "1"}, {"OPGUARD_LOG_LEVEL", "error"},
                               {"OPGUARD_BUFFER_MB", "0"}}),
                       &level);
  EXPECT_FALSE(c.ok());
  EXPECT_EQ(level, LogLevel::kError);
}

}  // namespace
}  // namespace opguard::shim
