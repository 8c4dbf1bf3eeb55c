// A process that uses libopguard_shim.so through its C API only, for tests
// that need a fresh process: exit flush, fork, "disabled costs nothing",
// bad configuration. Prints key=value lines on stdout.
//   api_child record N      record N ops, return from main (exit flush)
//   api_child fork          record 50, fork a child that tries to record, record 50 more
//   api_child disabled      count threads and fds around API calls
//   api_child noblock N     record N ops and report how many were taken and dropped
#include <dirent.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "opguard/shim.h"

namespace {

// Set in the forked child. LeakSanitizer's exit-time check stops the world
// by tracing every thread, which in the forked child of a threaded process
// (the parent's sender thread does not exist there) hangs or fails at
// random; the child is not what sanitizer runs look for leaks in.
bool g_forked_child = false;

}  // namespace

#if defined(__SANITIZE_ADDRESS__)
extern "C" int __lsan_is_turned_off() { return g_forked_child ? 1 : 0; }
#endif

namespace {

int CountEntries(const char* dir) {
  DIR* d = opendir(dir);
  if (d == nullptr) return -1;
  int n = 0;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] != '.') ++n;
  }
  closedir(d);
  return n - 1;  // opendir's own fd shows up under /proc/self/fd; harmless for tasks
}

int RecordOne(uint64_t name, uint64_t site, uint64_t fp) {
  int64_t shape[1] = {8};
  opguard_tensor out = {};
  out.fp_lo = fp;
  out.shape = shape;
  out.ndim = 1;
  out.dtype = OPGUARD_DTYPE_FLOAT32;
  opguard_op op = {};
  op.struct_size = sizeof(op);
  op.op_index = OPGUARD_AUTO;
  op.name = name;
  op.site = site;
  op.num_outputs = 1;
  op.outputs = &out;
  return opguard_record_op(&op, nullptr);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return 2;
  std::string mode = argv[1];
  long n = argc > 2 ? std::atol(argv[2]) : 0;
  if (mode == "disabled") {
    int threads_before = CountEntries("/proc/self/task");
    int fds_before = CountEntries("/proc/self/fd");
    int rc = RecordOne(opguard_intern("x", 1), 0, 1);
    std::printf("enabled=%d\nrc=%d\nintern_abc=%llu\n", opguard_enabled(), rc,
                static_cast<unsigned long long>(opguard_intern("abc", 3)));
    std::printf("threads_before=%d\nthreads_after=%d\nfds_before=%d\nfds_after=%d\n", threads_before,
                CountEntries("/proc/self/task"), fds_before, CountEntries("/proc/self/fd"));
    return 0;
  }
  std::printf("enabled=%d\nrun=%s\nrank=%u\n", opguard_init(), opguard_run_name(), opguard_rank());
  opguard_set_run_info(OPGUARD_INFO_FRAMEWORK, nullptr, "api-child");
  uint64_t name = opguard_intern("aten::add", 9);
  uint64_t site = opguard_site("child.py", 7, "main");
  if (mode == "record") {
    int bad = 0;
    for (long i = 0; i < n; ++i) bad += RecordOne(name, site, static_cast<uint64_t>(i) + 1) != OPGUARD_OK;
    std::printf("bad=%d\n", bad);
    std::fflush(stdout);
    return 0;  // no flush, no shutdown: the exit handler must deliver everything
  }
  if (mode == "fork") {
    for (int i = 0; i < 50; ++i) RecordOne(name, site, i + 1);
    std::fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
      g_forked_child = true;
      // The DataLoader-worker case: the child must not record or touch the
      // parent's socket; exit() runs the atexit flush, which must do nothing.
      std::printf("child_enabled=%d\nchild_rc=%d\n", opguard_enabled(), RecordOne(name, site, 999));
      std::fflush(stdout);
      std::exit(0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    for (int i = 50; i < 100; ++i) RecordOne(name, site, i + 1);
    std::printf("child_status=%d\nparent_enabled=%d\n", status, opguard_enabled());
    std::fflush(stdout);
    return 0;
  }
  if (mode == "noblock") {
    long ok = 0;
    for (long i = 0; i < n; ++i) ok += RecordOne(name, site, static_cast<uint64_t>(i) + 1) == OPGUARD_OK;
    std::printf("ok=%ld\n", ok);
    opguard_counters c = {};
    c.struct_size = sizeof(c);
    opguard_get_counters(&c);
    std::printf("dropped=%llu\n", static_cast<unsigned long long>(c.records_dropped));
    std::fflush(stdout);
    return 0;
  }
  return 2;
}
