// A process that uses libopguard_shim.so through its C API only, for tests
// that need a fresh process: exit flush, fork, "disabled costs nothing",
// bad configuration. Prints key=value lines on stdout.
//   api_child record N      record N ops, return from main (exit flush)
//   api_child fork          record 50, fork a child that tries to record, record 50 more
//   api_child disabled      count threads and fds around API calls
//   api_child noblock N     record N ops and report how many were taken and dropped
//   api_child pending D     ops whose fingerprints resolve later: a host buffer hashed
//                           off the thread, one resolved by another thread, and (D=1) a
//                           device tensor; return from main (exit flush)
//   api_child held N        2N ops on lane 0, every other one waiting for a fingerprint
//                           that another thread resolves later, in reverse order (the
//                           middle one fails); return from main (exit flush)
//   api_child latin1        ops 3-5 at a call site under a Latin-1 path, with a Latin-1
//                           op name, source file and gap reason (bytes that are not UTF-8
//                           through every string argument of the C API)
#include <dirent.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "opguard/shim.h"

namespace {

// Set in the forked child. LeakSanitizer's exit-time check stops the world
// by tracing every thread, which in the forked child of a threaded process
// (the parent's sender thread does not exist there) hangs or fails at
// random; the child is not what sanitizer runs look for leaks in.
bool g_forked_child = false;

}  // namespace

// GCC says AddressSanitizer with __SANITIZE_ADDRESS__, clang 14 only
// through __has_feature (the fuzz build's ASan pass is clang's).
#if defined(__SANITIZE_ADDRESS__)
#define OPGUARD_API_CHILD_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define OPGUARD_API_CHILD_ASAN 1
#endif
#endif
#ifdef OPGUARD_API_CHILD_ASAN
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

// One op with the single output `out`.
int RecordOutput(uint64_t name, uint64_t site, const opguard_tensor& out) {
  opguard_op op = {};
  op.struct_size = sizeof(op);
  op.op_index = OPGUARD_AUTO;
  op.name = name;
  op.site = site;
  op.num_outputs = 1;
  op.outputs = &out;
  return opguard_record_op(&op, nullptr);
}

// A float32 tensor of 8 elements with the fingerprint `fp` (or the pending
// marker of handle `fp` when `pending`).
int RecordOne(uint64_t name, uint64_t site, uint64_t fp, bool pending = false) {
  static const int64_t shape[1] = {8};
  opguard_tensor out = {};
  out.fp_lo = fp;
  out.shape = shape;
  out.ndim = 1;
  out.dtype = OPGUARD_DTYPE_FLOAT32;
  if (pending) opguard_tensor_set_pending(&out, fp);
  return RecordOutput(name, site, out);
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
  if (mode == "pending") {
    // 1. A host buffer fingerprinted off this thread; freed by the release callback.
    static int64_t shape[1] = {1 << 20};
    auto* data = new float[1 << 20];
    for (int i = 0; i < (1 << 20); ++i) data[i] = static_cast<float>(i % 1000) * 0.5f;
    opguard_tensor expect = {};
    opguard_fingerprint_host(data, OPGUARD_DTYPE_FLOAT32, shape, 1, nullptr, &expect);
    opguard_tensor t = {};
    int rc = opguard_fingerprint_host_async(
        data, OPGUARD_DTYPE_FLOAT32, shape, 1, nullptr,
        [](void* p) { delete[] static_cast<float*>(p); }, data, &t);
    std::printf("api=%d\nhost_rc=%d\nhost_pending=%d\nexpect_lo=%llu\nrecord_rc=%d\n",
                opguard_api_version(), rc, t.has_stats == OPGUARD_TENSOR_PENDING,
                static_cast<unsigned long long>(expect.fp_lo), RecordOutput(name, site, t));
    // 2. A fingerprint the caller resolves itself, from another thread.
    uint64_t handle = 0;
    std::printf("begin_rc=%d\n", opguard_pending_begin(&handle));
    std::printf("record2_rc=%d\n", RecordOne(name, site, handle, /*pending=*/true));
    std::thread([handle] {
      opguard_tensor r = {};
      r.fp_lo = 4242;
      r.fp_hi = 4343;
      std::printf("resolve_rc=%d\n", opguard_pending_resolve(handle, &r));
    }).join();
    // 3. A device tensor: without a driver, a gap with the reason.
    if (n == 1) {
      float fake_device_memory[8] = {};
      int64_t dshape[1] = {8};
      opguard_tensor d = {};
      std::printf("device_rc=%d\n", opguard_fingerprint_device_async(fake_device_memory, OPGUARD_DTYPE_FLOAT32,
                                                                   dshape, 1, nullptr, 0, nullptr, &d));
      std::printf("record3_rc=%d\n", RecordOutput(name, site, d));
    }
    std::fflush(stdout);
    return 0;
  }
  if (mode == "held") {
    std::vector<uint64_t> handles(static_cast<size_t>(n));
    int bad = 0;
    for (long i = 0; i < n; ++i) {
      bad += opguard_pending_begin(&handles[i]) != OPGUARD_OK;
      bad += RecordOne(name, site, handles[i], /*pending=*/true) != OPGUARD_OK;
      bad += RecordOne(name, site, 5000 + static_cast<uint64_t>(i)) != OPGUARD_OK;
    }
    std::thread([&] {
      for (long i = n; i-- > 0;) {
        if (i == n / 2) {
          bad += opguard_pending_fail(handles[i], "planted failure") != OPGUARD_OK;
          continue;
        }
        opguard_tensor r = {};
        r.fp_lo = 1000 + static_cast<uint64_t>(i);
        r.fp_hi = 2000 + static_cast<uint64_t>(i);
        bad += opguard_pending_resolve(handles[i], &r) != OPGUARD_OK;
      }
    }).join();
    std::printf("bad=%d\n", bad);
    std::fflush(stdout);
    return 0;
  }
  if (mode == "latin1") {
    const char* path = "/home/\xe9l\xe8ve/train.py";
    const uint64_t latin1_site = opguard_site(path, 12, "f\xf6rward");
    const uint64_t latin1_name = opguard_intern("aten::caf\xe9", 10);
    const uint64_t source = opguard_source_file(path, "x = 1\n", 6);
    int bad = 0;
    for (int i = 0; i < 3; ++i) bad += RecordOne(name, site, i + 1) != OPGUARD_OK;
    for (int i = 3; i < 6; ++i) bad += RecordOne(latin1_name, latin1_site, i + 1) != OPGUARD_OK;
    uint64_t first = 0;
    bad += opguard_report_gap(0, 2, "lost under /home/\xe9l\xe8ve", &first) != OPGUARD_OK;
    bad += RecordOne(name, site, 100) != OPGUARD_OK;
    std::printf("bad=%d\nsite=%llu\nname=%llu\nsource=%llu\ngap_first=%llu\n", bad,
                static_cast<unsigned long long>(latin1_site), static_cast<unsigned long long>(latin1_name),
                static_cast<unsigned long long>(source), static_cast<unsigned long long>(first));
    std::fflush(stdout);
    return bad == 0 ? 0 : 1;
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
