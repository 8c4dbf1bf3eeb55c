// opguardd and its disk (docs/storage.md, "Disk space"), against a real
// daemon process and real RocksDB: at storage.max_bytes or on a full file
// system new batches are answered "retry later" while queries and rm go on,
// ingest resumes by itself once space is freed, and no acknowledged record
// is lost; the daemon starts on a full disk; a damaged value is a gap in the
// answer, not a failed query.
//
// The full file system is a small tmpfs mounted by the test (needs root, or
// CAP_SYS_ADMIN); without the right to mount, those cases skip and say why.
// OPGUARDD_UNDER_TEST=PATH runs these against another opguardd build.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/mount.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "opguard/daemon/client.h"
#include "opguard/daemon/testing/batch_maker.h"
#include "opguard/idl/envelope.h"

namespace opguard::daemon {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using testing::BatchOptions;
namespace fs = std::filesystem;

constexpr uint32_t kOpsPerBatch = 128;  // one stored chunk per batch

std::string Opguardd() {
  const char* other = std::getenv("OPGUARDD_UNDER_TEST");
  return other != nullptr && *other != '\0' ? other : OPGUARDD_PATH;
}

// Polls `done` every 50 ms until it holds or `limit` passes.
bool WaitFor(const std::function<bool()>& done, std::chrono::milliseconds limit) {
  const auto deadline = Clock::now() + limit;
  while (Clock::now() < deadline) {
    if (done()) return true;
    std::this_thread::sleep_for(50ms);
  }
  return done();
}

// Writes zeros to `path` until the file system refuses (ENOSPC): a disk
// another program filled. Returns the bytes written.
uint64_t FillUp(const std::string& path) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return 0;
  std::vector<char> block(1 << 20, 0);
  uint64_t written = 0;
  for (size_t size = block.size(); size >= 512; size /= 4) {
    while (true) {
      ssize_t n = ::write(fd, block.data(), size);
      if (n <= 0) break;
      written += static_cast<uint64_t>(n);
    }
  }
  ::fsync(fd);
  ::close(fd);
  return written;
}

// Creates empty files in `dir` until the file system has no inode left
// (ENOSPC with bytes to spare): the one kind of full disk the daemon's
// free-space checks cannot see coming, so RocksDB itself meets it. Returns
// the number of files made.
size_t UseUpInodes(const std::string& dir) {
  fs::create_directories(dir);
  for (size_t n = 0; n < 100000; ++n) {
    const std::string path = dir + "/" + std::to_string(n);
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) return errno == ENOSPC ? n : 0;
    ::close(fd);
  }
  return 0;
}

class DiskTest : public ::testing::Test {
 protected:
  void TearDown() override {
    daemon_.reset();  // killed before its file system goes
    if (!mounted_.empty()) ::umount2(mounted_.c_str(), MNT_DETACH);
  }

  // A tmpfs of `size` (and `options`, e.g. ",nr_inodes=N") under the
  // test's temp dir; "" (with the reason in *why) when this process may not
  // mount.
  std::string MountSmallFileSystem(const std::string& size, std::string* why, const std::string& options = "") {
    const std::string dir = dir_.path() + "/fs";
    fs::create_directories(dir);
    if (::mount("opguard-test", dir.c_str(), "tmpfs", 0, ("size=" + size + ",mode=0700" + options).c_str()) != 0) {
      *why = std::string("cannot mount a tmpfs (") + std::strerror(errno) +
             "): a full file system needs root or CAP_SYS_ADMIN";
      return "";
    }
    mounted_ = dir;
    return dir;
  }

  // The inode tests' file system (256 MiB, 400 inodes) and daemon (the
  // storage.reserved_inodes given), with 10 batches of "keep" stored.
  // Returns the mount point, "" (with *why) when this process may not mount.
  std::string StartOnFewInodes(const std::string& reserved_inodes, std::string* why) {
    const std::string dir = MountSmallFileSystem("256m", why, ",nr_inodes=400");
    if (dir.empty()) return "";
    inode_args_ = {"--storage.reserved-bytes", "0", "--storage.reserved-inodes", reserved_inodes,
                   "--storage.write-buffer-bytes", "1MiB", "--storage.memtable-budget-bytes", "8MiB"};
    auto& d = StartDaemon(dir, inode_args_);
    EXPECT_TRUE(d.Running());
    if (d.Running()) SendAll(d, "keep", 1, 10);
    return dir;
  }

  testing::DaemonProcess& StartDaemon(const std::string& dir, std::vector<std::string> args) {
    daemon_ = std::make_unique<testing::DaemonProcess>(Opguardd(), dir, std::move(args));
    Status st = daemon_->Start();
    EXPECT_TRUE(st.ok()) << st.message() << LogTail(*daemon_);
    return *daemon_;
  }

  // The end of the daemon's log, for failure messages.
  static std::string LogTail(const testing::DaemonProcess& d) {
    std::ifstream in(d.log_path());
    std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    return "\n--- daemon log ---\n" + all.substr(all.size() > 3000 ? all.size() - 3000 : 0);
  }

  static std::string Ack(testing::DaemonProcess& d, const std::string& frame) {
    auto reply = testing::SendRaw(d.ingest(), frame, 10s);
    return reply.ok() ? testing::DescribeAck(*reply) : "no ack: " + reply.status().message();
  }

  static double Metric(testing::DaemonProcess& d, const std::string& name) {
    auto metrics = testing::HttpGet(d.http(), "/metrics");
    if (!metrics.ok()) return -1;
    auto pos = metrics->body.find("\n" + name + " ");
    if (pos == std::string::npos) return -1;
    return std::stod(metrics->body.substr(pos + name.size() + 2));
  }

  // Every op index of (run, rank, lane 0), read back page by page; an
  // error ends the list (and fails the test).
  static std::vector<uint64_t> ReadAll(testing::DaemonProcess& d, const std::string& run, uint32_t rank = 0) {
    std::vector<uint64_t> ops;
    DaemonClient client(d.query(), 10s);
    uint64_t from = 0;
    for (int page = 0; page < 1000; ++page) {
      auto answer = client.ReadTrace(run, rank, 0, from, 5000);
      EXPECT_TRUE(answer.ok()) << run << ": " << answer.status().message();
      if (!answer.ok()) break;
      const auto* t = answer->envelope()->message_as_ReadTraceAnswer();
      if (t->ops()) {
        for (const auto* op : *t->ops()) ops.push_back(op->op_index());
      }
      if (t->done()) break;
      from = t->next_op();
    }
    return ops;
  }

  // Sends `batches` batches of `run` (rank 0) and expects every one acked.
  static void SendAll(testing::DaemonProcess& d, const std::string& run, uint64_t session, uint64_t batches) {
    testing::RankSender sender(d.ingest(), run, 0, session, kOpsPerBatch);
    Status st = sender.Run(batches, Clock::now() + 60s, 8);
    ASSERT_TRUE(st.ok()) << st.message();
    EXPECT_EQ(sender.rejected(), 0u);
  }

  static void ExpectAllOps(testing::DaemonProcess& d, const std::string& run, uint64_t batches) {
    const auto ops = ReadAll(d, run);
    ASSERT_EQ(ops.size(), batches * kOpsPerBatch) << run;
    for (uint64_t i = 0; i < ops.size(); ++i) ASSERT_EQ(ops[i], i) << run;
  }

  testing::TempDir dir_;
  std::string mounted_;
  std::vector<std::string> inode_args_;
  std::unique_ptr<testing::DaemonProcess> daemon_;
};

// A thread joined when it goes out of scope (an ASSERT may return early).
struct JoinedThread {
  explicit JoinedThread(std::function<void()> fn) : thread(std::move(fn)) {}
  ~JoinedThread() { Join(); }
  void Join() {
    if (thread.joinable()) thread.join();
  }
  std::thread thread;
};

// A sender that keeps sending `batches` in the background, as a shim does
// while the daemon answers "retry later".
struct BackgroundSender {
  BackgroundSender(testing::DaemonProcess& d, const std::string& run, uint64_t session, uint64_t batches)
      : sender(d.ingest(), run, 0, session, kOpsPerBatch), total(batches) {
    thread = std::thread([this] {
      result = sender.Run(total, Clock::now() + 90s, 4, 0, std::chrono::milliseconds(300));
    });
  }
  ~BackgroundSender() {
    sender.Abort();
    if (thread.joinable()) thread.join();
  }
  Status Join() {
    thread.join();
    return result;
  }
  testing::RankSender sender;
  uint64_t total;
  Status result;
  std::thread thread;
};

// storage.max_bytes needs no mount: the store refuses new records at the
// limit, answers queries and rm, and takes records again once rm gave the
// space back. The batches sent meanwhile were kept by their sender and
// arrive whole; a restart over the limit starts and behaves the same.
TEST_F(DiskTest, AtStorageMaxBytesIngestWaitsAndResumesAfterRm) {
  const std::vector<std::string> args = {"--storage.max-bytes", "3MiB", "--storage.write-buffer-bytes", "1MiB",
                                         "--storage.reserved-bytes", "0"};
  auto* d = &StartDaemon(dir_.path(), args);
  ASSERT_TRUE(d->Running());
  SendAll(*d, "keep", 1, 10);

  // Fill the store: a sender with far more than 3 MiB to say.
  {
    BackgroundSender big(*d, "big", 2, 5000);
    ASSERT_TRUE(WaitFor([&] { return big.sender.retried() > 0; }, 60s))
        << "the daemon never answered 'retry later' (" << big.sender.acked().size() << " batches acked)";
  }
  ASSERT_TRUE(WaitFor([&] { return Metric(*d, "opguard_ingest_read_only") == 1; }, 10s));
  const std::string refused = Ack(*d, testing::MakeBatch("other", 0, 3, 0, 0, 10, {}));
  EXPECT_EQ(refused.rfind("retry: ", 0), 0u) << refused;
  EXPECT_NE(refused.find("storage.max_bytes"), std::string::npos) << refused;

  // A job sending while the store is full: kept, resent, stored later.
  BackgroundSender late(*d, "late", 4, 30);
  ASSERT_TRUE(WaitFor([&] { return late.sender.retried() > 0; }, 10s));
  // Queries are answered meanwhile.
  ExpectAllOps(*d, "keep", 10);

  // A restart over the limit: the daemon starts, still refuses, serves.
  late.sender.Abort();
  (void)late.Join();
  EXPECT_EQ(d->Stop(), 0);
  d = &StartDaemon(dir_.path(), args);
  ASSERT_TRUE(d->Running());
  EXPECT_EQ(Metric(*d, "opguard_ingest_read_only"), 1);
  EXPECT_EQ(Ack(*d, testing::MakeBatch("other", 0, 3, 0, 0, 10, {})).rfind("retry: ", 0), 0u);
  ExpectAllOps(*d, "keep", 10);

  BackgroundSender again(*d, "late", 4, 30);
  // And the real shim (opguard-loadgen's ranks): it logs the reason once,
  // keeps its records and delivers them all once the store takes them.
  // What arrives after rm (these ranks, "late") stays well under
  // storage.max_bytes (about 1.7 MiB once flushed), so the last batch below is taken
  // whether or not a flush has turned it into files yet.
  const std::string shim_log = dir_.path() + "/loadgen.stderr";
  testing::CommandResult loadgen;
  JoinedThread shims([&] {
    loadgen = testing::RunCommand(std::string(OPGUARD_LOADGEN_PATH) +
                                      " --run shims --ranks 2 --ops 1000 --flush-timeout-ms 60000 --endpoint " +
                                      d->ingest() + " --json 2>" + shim_log,
                                  90);
  });
  auto shim_warnings = [&] {
    std::ifstream in(shim_log);
    std::string line;
    int n = 0;
    while (std::getline(in, line)) n += line.find("cannot store records now") != std::string::npos;
    return n;
  };
  const bool shims_told = WaitFor([&] { return shim_warnings() == 2; }, 20s);
  DaemonClient client(d->query(), 60s);
  Status rm = client.DeleteRun("big");
  ASSERT_TRUE(rm.ok()) << rm.message();
  // The compaction of the removed run gives its space back; ingest resumes.
  ASSERT_TRUE(WaitFor([&] { return Metric(*d, "opguard_ingest_read_only") == 0; }, 30s))
      << "store bytes stayed at the limit after rm";
  Status st = again.Join();
  shims.Join();
  ASSERT_TRUE(st.ok()) << st.message();
  EXPECT_TRUE(shims_told) << "each rank's shim logs the reason once";
  EXPECT_EQ(shim_warnings(), 2);
  ASSERT_EQ(loadgen.exit_code, 0) << loadgen.output;
  const auto lg = nlohmann::json::parse(loadgen.output.substr(loadgen.output.find('{')), nullptr, false);
  ASSERT_FALSE(lg.is_discarded()) << loadgen.output;
  EXPECT_TRUE(lg["all_acknowledged"].get<bool>()) << loadgen.output;
  for (const auto& r : lg["per_rank"]) {
    EXPECT_EQ(ReadAll(*d, "shims", r["rank"].get<uint32_t>()).size(), r["ops"].get<uint64_t>());
  }
  ExpectAllOps(*d, "late", 30);
  ExpectAllOps(*d, "keep", 10);
  EXPECT_GT(Metric(*d, "opguard_batches_deferred_total"), 0);
  EXPECT_EQ(Ack(*d, testing::MakeBatch("other", 0, 3, 0, 0, 10, {})), "durable");
  EXPECT_EQ(d->Stop(), 0);
}

// `opguard status` says that ingest is paused for disk space, why, and
// since when (text and --json), and stops saying it once rm gave the
// space back.
TEST_F(DiskTest, StatusShowsAPauseForDiskSpaceWithItsReasonAndStart) {
  auto& d = StartDaemon(dir_.path(), {"--storage.max-bytes", "2MiB", "--storage.write-buffer-bytes",
                                      "1MiB", "--storage.reserved-bytes", "0"});
  ASSERT_TRUE(d.Running());
  const std::string status = std::string(OPGUARD_CLI_PATH) + " status --daemon " + d.query();
  auto json_status = [&] {
    auto r = testing::RunCommand(status + " --json", 20);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return nlohmann::json::parse(r.output, nullptr, false);
  };
  auto before = json_status();
  ASSERT_TRUE(before.contains("ingest_paused")) << before.dump();
  EXPECT_TRUE(before["ingest_paused"].empty()) << before.dump();

  const auto t0 = std::chrono::system_clock::now();
  {
    BackgroundSender big(d, "big", 2, 5000);
    ASSERT_TRUE(WaitFor([&] { return big.sender.retried() > 0; }, 60s))
        << "the daemon never answered 'retry later' (" << big.sender.acked().size()
        << " batches acked)";
  }
  const auto paused = json_status();
  ASSERT_EQ(paused["ingest_paused"].size(), 1u) << paused.dump();
  const auto& pause = paused["ingest_paused"][0];
  EXPECT_EQ(pause["cause"], "disk_space");
  EXPECT_NE(pause["reason"].get<std::string>().find("storage.max_bytes"), std::string::npos)
      << pause.dump();
  const auto since = std::chrono::system_clock::time_point(
      std::chrono::duration_cast<std::chrono::system_clock::duration>(
          std::chrono::nanoseconds(pause["since_ns"].get<int64_t>())));
  EXPECT_GE(since, t0 - 1s);
  EXPECT_LE(since, std::chrono::system_clock::now());
  auto text = testing::RunCommand(status, 20);
  EXPECT_EQ(text.exit_code, 0) << text.output;
  EXPECT_NE(text.output.find("paused    for disk space since "), std::string::npos) << text.output;
  EXPECT_NE(text.output.find("storage.max_bytes"), std::string::npos) << text.output;

  DaemonClient client(d.query(), 60s);
  Status rm = client.DeleteRun("big");
  ASSERT_TRUE(rm.ok()) << rm.message();
  ASSERT_TRUE(WaitFor([&] { return json_status()["ingest_paused"].empty(); }, 30s))
      << json_status().dump();
  text = testing::RunCommand(status, 20);
  EXPECT_EQ(text.output.find("paused"), std::string::npos) << text.output;
  EXPECT_EQ(d.Stop(), 0);
}

// A file system another program filled to the last byte: the daemon answers
// "retry later" (it does not let RocksDB write into it), keeps serving
// queries, and takes records again by itself once space is freed. Then a
// start on the full disk: queries are answered.
TEST_F(DiskTest, AFullFileSystemPausesIngestAndTheDaemonStillStartsOnIt) {
  std::string why;
  const std::string dir = MountSmallFileSystem("48m", &why);
  if (dir.empty()) GTEST_SKIP() << why;
  const std::vector<std::string> args = {"--storage.reserved-bytes", "0", "--storage.write-buffer-bytes", "1MiB",
                                         "--storage.memtable-budget-bytes", "8MiB"};
  auto* d = &StartDaemon(dir, args);
  ASSERT_TRUE(d->Running());
  SendAll(*d, "keep", 1, 10);

  const std::string filler = dir + "/filler";
  ASSERT_GT(FillUp(filler), 0u);
  BackgroundSender late(*d, "late", 2, 400);
  ASSERT_TRUE(WaitFor([&] { return late.sender.retried() > 0; }, 30s))
      << "the full file system never stopped ingest (" << late.sender.acked().size() << " batches acked)";
  EXPECT_EQ(Metric(*d, "opguard_ingest_read_only"), 1);
  const std::string refused = Ack(*d, testing::MakeBatch("other", 0, 3, 0, 0, 10, {}));
  EXPECT_EQ(refused.rfind("retry: ", 0), 0u) << refused;
  EXPECT_NE(refused.find("free, less than"), std::string::npos) << refused;
  ExpectAllOps(*d, "keep", 10);
  // Nothing can be written, not even a deletion: a clear refusal.
  DaemonClient client(d->query(), 30s);
  Status rm = client.DeleteRun("keep");
  EXPECT_FALSE(rm.ok());
  EXPECT_NE(rm.message().find("free, less than"), std::string::npos) << rm.message();

  // The operator frees space: the daemon takes records again by itself.
  fs::remove(filler);
  Status st = late.Join();
  ASSERT_TRUE(st.ok()) << st.message() << LogTail(*d);
  EXPECT_EQ(Metric(*d, "opguard_ingest_read_only"), 0);
  ExpectAllOps(*d, "late", 400);
  ExpectAllOps(*d, "keep", 10);

  // Started on a full disk: it starts and answers from what is stored.
  EXPECT_EQ(d->Stop(), 0);
  ASSERT_GT(FillUp(filler), 0u);
  d = &StartDaemon(dir, args);
  ASSERT_TRUE(d->Running()) << "the daemon did not start on a full disk";
  ExpectAllOps(*d, "keep", 10);
  ExpectAllOps(*d, "late", 400);
  const std::string on_full = Ack(*d, testing::MakeBatch("other", 0, 3, 0, 0, 10, {}));
  EXPECT_EQ(on_full.rfind("retry: ", 0), 0u) << on_full << LogTail(*d);
  EXPECT_EQ(Metric(*d, "opguard_ingest_read_only"), 1);
  fs::remove(filler);
  EXPECT_EQ(d->Stop(), 0);
  d = &StartDaemon(dir, args);
  ASSERT_TRUE(d->Running());
  EXPECT_EQ(Ack(*d, testing::MakeBatch("other", 0, 3, 0, 0, 10, {})), "durable");
  ExpectAllOps(*d, "late", 400);
  EXPECT_EQ(d->Stop(), 0);
}

// A file system out of inodes, with bytes to spare: below
// storage.reserved_inodes the daemon answers "retry later" before RocksDB
// would fail to create a file, and takes records again once files are
// removed.
TEST_F(DiskTest, FewFreeInodesPauseIngestBeforeRocksDBMeetsThem) {
  std::string why;
  const std::string dir = StartOnFewInodes("32", &why);
  if (dir.empty()) GTEST_SKIP() << why;
  ASSERT_FALSE(HasFailure());
  auto* d = daemon_.get();
  const std::string fillers = dir + "/fillers";
  ASSERT_GT(UseUpInodes(fillers), 0u);
  BackgroundSender late(*d, "late", 2, 300);
  ASSERT_TRUE(WaitFor([&] { return late.sender.retried() > 0; }, 30s))
      << "no pause for inodes (" << late.sender.acked().size() << " batches acked)" << LogTail(*d);
  const std::string refused = Ack(*d, testing::MakeBatch("other", 0, 3, 0, 0, 10, {}));
  EXPECT_NE(refused.find("free inodes, below storage.reserved_inodes (32)"), std::string::npos) << refused;
  // 0, or a few if RocksDB has removed an obsolete file since.
  const double free_inodes = Metric(*d, "opguard_store_free_inodes");
  EXPECT_GE(free_inodes, 0);
  EXPECT_LT(free_inodes, 32);
  ExpectAllOps(*d, "keep", 10);

  fs::remove_all(fillers);
  Status st = late.Join();
  ASSERT_TRUE(st.ok()) << st.message() << LogTail(*d);
  EXPECT_EQ(Metric(*d, "opguard_ingest_read_only"), 0);
  ExpectAllOps(*d, "late", 300);
  EXPECT_EQ(LogTail(*d).find("No space left on device"), std::string::npos) << "RocksDB met the full file system"
                                                                             << LogTail(*d);
  EXPECT_EQ(d->Stop(), 0);
}

// Without that reserve (storage.reserved_inodes 0), RocksDB itself meets the
// full file system: the flush cannot create its SST, a background error
// stops writes, and the daemon pauses ingest with RocksDB's reason. While no
// inode is freed it does not try to resume (a resume whose flush finds no
// inode for its new WAL turns the error into one only a restart clears);
// once files are removed it resumes the store (DB::Resume) by itself, and
// every batch, the refused ones resent, is stored once and survives a
// restart.
TEST_F(DiskTest, RocksDBsOwnNoSpaceErrorIsResumedOnceFilesAreFreed) {
  std::string why;
  const std::string dir = StartOnFewInodes("0", &why);
  if (dir.empty()) GTEST_SKIP() << why;
  ASSERT_FALSE(HasFailure());
  auto* d = daemon_.get();

  // One inode left: the memtable switch's new WAL takes it, the flush's SST
  // finds none.
  const std::string fillers = dir + "/fillers";
  ASSERT_GT(UseUpInodes(fillers), 0u);
  fs::remove(fillers + "/0");
  BackgroundSender late(*d, "late", 2, 600);
  ASSERT_TRUE(WaitFor([&] { return late.sender.retried() > 0; }, 60s))
      << "RocksDB never stopped writing (" << late.sender.acked().size() << " batches acked)" << LogTail(*d);
  EXPECT_EQ(Metric(*d, "opguard_ingest_read_only"), 1);
  const std::string refused = Ack(*d, testing::MakeBatch("other", 0, 3, 0, 0, 10, {}));
  EXPECT_EQ(refused.rfind("retry: ", 0), 0u) << refused;
  EXPECT_NE(refused.find("stopped writing after an error (IO error: No space left on device"), std::string::npos)
      << refused;
  ExpectAllOps(*d, "keep", 10);
  // Still no inode: no resume is tried, and the error stays resumable.
  std::this_thread::sleep_for(1s);
  EXPECT_EQ(Metric(*d, "opguard_store_resumes_total"), 0);
  EXPECT_EQ(Metric(*d, "opguard_ingest_read_only"), 1);
  ASSERT_TRUE(d->Running()) << LogTail(*d);

  fs::remove_all(fillers);
  Status st = late.Join();
  ASSERT_TRUE(st.ok()) << st.message() << LogTail(*d);
  EXPECT_GE(Metric(*d, "opguard_store_resumes_total"), 1);
  EXPECT_EQ(Metric(*d, "opguard_ingest_read_only"), 0);
  EXPECT_EQ(Ack(*d, testing::MakeBatch("other", 0, 3, 0, 0, 10, {})), "durable");
  ExpectAllOps(*d, "late", 600);
  ExpectAllOps(*d, "keep", 10);
  EXPECT_EQ(d->Stop(), 0);
  d = &StartDaemon(dir, inode_args_);
  ASSERT_TRUE(d->Running());
  ExpectAllOps(*d, "late", 600);
  ExpectAllOps(*d, "keep", 10);
  EXPECT_EQ(d->Stop(), 0);
}

// No inode at all when a memtable switch needs a new WAL: RocksDB takes that
// as an error it cannot resume from. The daemon says so (restart it once
// there is space) and keeps answering queries; restarted on the same full
// file system it opens the store read-only; restarted once files are freed,
// every acknowledged batch is there and ingest goes on.
TEST_F(DiskTest, AnErrorRocksDBCannotResumeFromAsksForARestartAndLosesNothingAcked) {
  std::string why;
  const std::string dir = StartOnFewInodes("0", &why);
  if (dir.empty()) GTEST_SKIP() << why;
  ASSERT_FALSE(HasFailure());
  auto* d = daemon_.get();
  const std::string fillers = dir + "/fillers";
  ASSERT_GT(UseUpInodes(fillers), 0u);
  uint64_t acked = 0;
  {
    BackgroundSender late(*d, "late", 2, 600);
    ASSERT_TRUE(WaitFor([&] { return late.sender.retried() > 0; }, 60s))
        << "RocksDB never stopped writing (" << late.sender.acked().size() << " batches acked)" << LogTail(*d);
    late.sender.Abort();
    late.thread.join();
    acked = late.sender.acked().size();
  }
  const std::string refused = Ack(*d, testing::MakeBatch("other", 0, 3, 0, 0, 10, {}));
  EXPECT_NE(refused.find("RocksDB cannot resume from"), std::string::npos) << refused;
  EXPECT_NE(refused.find("restart opguardd once there is space"), std::string::npos) << refused;
  ExpectAllOps(*d, "keep", 10);
  EXPECT_EQ(ReadAll(*d, "late").size(), acked * kOpsPerBatch);

  // Restarted with still no inode: the store cannot be opened for writing
  // (a new WAL and MANIFEST), so it opens read-only and answers queries.
  EXPECT_EQ(d->Stop(), 0) << LogTail(*d);
  d = &StartDaemon(dir, inode_args_);
  ASSERT_TRUE(d->Running()) << "the daemon did not start out of inodes";
  ExpectAllOps(*d, "keep", 10);
  EXPECT_EQ(ReadAll(*d, "late").size(), acked * kOpsPerBatch);
  const std::string read_only = Ack(*d, testing::MakeBatch("other", 0, 3, 0, 0, 10, {}));
  EXPECT_NE(read_only.find("opened read-only"), std::string::npos) << read_only << LogTail(*d);

  fs::remove_all(fillers);
  EXPECT_EQ(d->Stop(), 0) << LogTail(*d);
  d = &StartDaemon(dir, inode_args_);
  ASSERT_TRUE(d->Running());
  EXPECT_EQ(ReadAll(*d, "late").size(), acked * kOpsPerBatch);
  ExpectAllOps(*d, "keep", 10);
  EXPECT_EQ(Ack(*d, testing::MakeBatch("other", 0, 3, 0, 0, 10, {})), "durable");
  EXPECT_EQ(d->Stop(), 0);
}

// `opguard rm` on a nearly full disk (room for the deletion, not for moving
// the blobs another run shares files with): the compaction after it could
// move those blobs into a full file system, and a blob file that meets
// ENOSPC aborts Debian's RocksDB (docs/storage.md). The daemon compacts only
// what the free space allows (here: without moving blobs), stays up, the run
// is gone, ingest waits ("retry later") and resumes once space is freed, and
// no acknowledged record is lost.
TEST_F(DiskTest, RmOnANearlyFullDiskKeepsTheDaemonUpAndIngestResumes) {
  std::string why;
  const std::string dir = MountSmallFileSystem("64m", &why);
  if (dir.empty()) GTEST_SKIP() << why;
  const std::vector<std::string> args = {"--storage.reserved-bytes", "16MiB", "--storage.write-buffer-bytes",
                                         "1MiB", "--storage.memtable-budget-bytes", "8MiB"};
  auto* d = &StartDaemon(dir, args);
  ASSERT_TRUE(d->Running());
  // Two runs recorded at once (the real shim's ranks) share blob files.
  {
    auto record = [&](const std::string& run) {
      auto r = testing::RunCommand(std::string(OPGUARD_LOADGEN_PATH) + " --run " + run +
                                       " --ranks 2 --ops 40000 --endpoint " + d->ingest() + " --json",
                                   120);
      EXPECT_EQ(r.exit_code, 0) << r.output;
    };
    JoinedThread other([&] { record("big"); });
    record("keep");
  }
  const auto keep = ReadAll(*d, "keep");
  ASSERT_EQ(keep.size(), 40000u);
  // Stopped (it flushes) and started again: the memtables are empty, so the
  // deletion itself needs little room.
  EXPECT_EQ(d->Stop(), 0);
  d = &StartDaemon(dir, args);
  ASSERT_TRUE(d->Running());
  // RocksDB's own compactions are done before the disk fills.
  ASSERT_TRUE(WaitFor([&] { return Metric(*d, "opguard_rocksdb_pending_compaction_bytes") == 0; }, 20s));
  // Another program leaves room for the deletion (the memtables' flush and
  // 1 MiB), not for rewriting the blobs the runs share.
  const double memtables = Metric(*d, "opguard_rocksdb_memtable_bytes");
  ASSERT_GE(memtables, 0);
  const std::string filler = dir + "/filler";
  {
    const uint64_t total = FillUp(filler);
    const uint64_t leave = static_cast<uint64_t>(memtables) + (9u << 17);  // + 1.125 MiB
    ASSERT_GT(total, leave);
    fs::resize_file(filler, total - leave);
  }
  ASSERT_TRUE(WaitFor([&] { return Metric(*d, "opguard_ingest_read_only") == 1; }, 10s));
  DaemonClient client(d->query(), 60s);
  Status rm = client.DeleteRun("big");
  EXPECT_TRUE(rm.ok()) << rm.message() << LogTail(*d);
  std::this_thread::sleep_for(500ms);  // the compaction runs after the deletion is durable
  ASSERT_TRUE(d->Running()) << "the daemon died compacting on a nearly full disk" << LogTail(*d);
  EXPECT_EQ(ReadAll(*d, "keep"), keep);
  const std::string refused = Ack(*d, testing::MakeBatch("other", 0, 3, 0, 0, 10, {}));
  EXPECT_EQ(refused.rfind("retry: ", 0), 0u) << refused;

  // A job sending meanwhile keeps its batches; space freed, all arrive.
  BackgroundSender late(*d, "late", 4, 30);
  ASSERT_TRUE(WaitFor([&] { return late.sender.retried() > 0; }, 10s));
  fs::remove(filler);
  Status st = late.Join();
  ASSERT_TRUE(st.ok()) << st.message() << LogTail(*d);
  EXPECT_EQ(Metric(*d, "opguard_ingest_read_only"), 0);
  ExpectAllOps(*d, "late", 30);
  EXPECT_EQ(ReadAll(*d, "keep"), keep);
  EXPECT_EQ(Ack(*d, testing::MakeBatch("other", 0, 3, 0, 0, 10, {})), "durable");
  auto big = testing::HttpGet(d->http(), "/api/runs/big");
  ASSERT_TRUE(big.ok()) << big.status().message();
  EXPECT_EQ(big->status, 404) << big->body;
  EXPECT_EQ(d->Stop(), 0);
}

// With storage.reserved_bytes, the daemon stops taking records before the
// file system is full: rm still has room to work and gives space back.
TEST_F(DiskTest, BelowReservedBytesIngestWaitsAndRmStillWorks) {
  std::string why;
  const std::string dir = MountSmallFileSystem("48m", &why);
  if (dir.empty()) GTEST_SKIP() << why;
  auto& d = StartDaemon(dir, {"--storage.reserved-bytes", "16MiB", "--storage.write-buffer-bytes", "1MiB"});
  ASSERT_TRUE(d.Running());
  SendAll(d, "keep", 1, 10);
  SendAll(d, "old", 2, 10);
  // Leave 8 MiB free: a filler of the rest.
  const std::string filler = dir + "/filler";
  {
    const uint64_t total = FillUp(filler);
    ASSERT_GT(total, 8u << 20);
    fs::resize_file(filler, total - (8u << 20));
  }
  ASSERT_TRUE(WaitFor([&] { return Metric(d, "opguard_ingest_read_only") == 1; }, 10s));
  const std::string refused = Ack(d, testing::MakeBatch("other", 0, 3, 0, 0, 10, {}));
  EXPECT_NE(refused.find("storage.reserved_bytes"), std::string::npos) << refused;
  DaemonClient client(d.query(), 30s);
  Status rm = client.DeleteRun("old");
  EXPECT_TRUE(rm.ok()) << rm.message();
  ExpectAllOps(d, "keep", 10);
  fs::resize_file(filler, 0);
  ASSERT_TRUE(WaitFor([&] { return Metric(d, "opguard_ingest_read_only") == 0; }, 10s));
  EXPECT_EQ(Ack(d, testing::MakeBatch("other", 0, 3, 0, 0, 10, {})), "durable");
  EXPECT_EQ(d.Stop(), 0);
}

// One damaged blob (a flipped byte: RocksDB's checksum no longer matches)
// used to fail the whole diff; now its ops are a gap and the rest answers.
TEST_F(DiskTest, ADamagedValueIsAGapNotAFailedQuery) {
  constexpr uint64_t kBatches = 40;
  // Without event cores, so that the diff reads the op chunks (with them,
  // it reads the cores column family alone and a damaged chunk only makes
  // a hole in the pages).
  auto* d = &StartDaemon(dir_.path(), {"--storage.op-cores", "false"});
  ASSERT_TRUE(d->Running());
  SendAll(*d, "ref", 1, kBatches);
  SendAll(*d, "sus", 2, kBatches);
  EXPECT_EQ(d->Stop(), 0);  // flushed: op chunks are in blob files now

  std::vector<fs::path> blobs;
  for (const auto& e : fs::directory_iterator(d->data_dir())) {
    if (e.path().extension() == ".blob") blobs.push_back(e.path());
  }
  ASSERT_FALSE(blobs.empty()) << "no blob file in " << d->data_dir();
  {
    // One byte in the middle of the largest blob file: inside a chunk.
    std::sort(blobs.begin(), blobs.end(), [](const fs::path& a, const fs::path& b) {
      return fs::file_size(a) > fs::file_size(b);
    });
    std::fstream f(blobs[0], std::ios::in | std::ios::out | std::ios::binary);
    const auto middle = static_cast<std::streamoff>(fs::file_size(blobs[0]) / 2);
    f.seekg(middle);
    char c = 0;
    f.read(&c, 1);
    c = static_cast<char>(c ^ 0x5a);
    f.seekp(middle);
    f.write(&c, 1);
    ASSERT_TRUE(f.good());
  }

  d = &StartDaemon(dir_.path(), {});
  ASSERT_TRUE(d->Running());
  auto diff = testing::HttpGet(d->http(), "/api/diff?reference=ref&suspect=sus", 60s);
  ASSERT_TRUE(diff.ok()) << diff.status().message();
  ASSERT_EQ(diff->status, 200) << diff->body;
  const auto j = nlohmann::json::parse(diff->body);
  EXPECT_NE(j["status"], "identical") << diff->body;  // a hole is not agreement
  EXPECT_NE(diff->body.find("missing"), std::string::npos) << diff->body;
  // One chunk (at most 128 ops, one contiguous range) of one run is gone;
  // everything else reads, the pages skip the hole.
  const uint64_t total = kBatches * kOpsPerBatch;
  auto ref = ReadAll(*d, "ref"), sus = ReadAll(*d, "sus");
  auto& damaged = ref.size() < sus.size() ? ref : sus;
  EXPECT_EQ(std::max(ref.size(), sus.size()), total);
  ASSERT_LT(damaged.size(), total);
  EXPECT_GE(damaged.size(), total - kOpsPerBatch);
  uint64_t holes = 0;
  for (size_t i = 1; i < damaged.size(); ++i) holes += damaged[i] != damaged[i - 1] + 1;
  holes += damaged.front() != 0;
  holes += damaged.back() != total - 1;
  EXPECT_EQ(holes, 1u) << "the missing ops are one range";
  EXPECT_GE(Metric(*d, "opguard_store_read_errors_total"), 1);
  EXPECT_EQ(d->Stop(), 0);
}

}  // namespace
}  // namespace opguard::daemon
