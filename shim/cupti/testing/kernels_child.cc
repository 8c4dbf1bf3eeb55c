// A process that records ops with kernel names through libopguard_shim.so's
// C API, the way the PyTorch adapter does, with the stand-in libcupti
// (standin_cupti.cc) as CUPTI: OPGUARD_KERNELS=1 and OPGUARD_CUPTI_LIBRARY
// pointing at it. Used by tests/integration/shim/test_kernels.py.
//
//   opguard_kernels_child OPS PIVOT PIVOT_KERNEL PIVOT_OUTPUT
// records OPS ops "aten::mm" on lane 0, op i reading op i-1's output and
// launching "ampere_sgemm_128x64_nn" then "_Z8bias_addPfPKfi" (bias_add), except op
// PIVOT, which launches PIVOT_KERNEL first and writes PIVOT_OUTPUT as its
// output's fingerprint (op i writes i + 1). Prints "kernel_names=N" (the
// shim's count) once everything was flushed.
#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "opguard/shim.h"

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: %s OPS PIVOT PIVOT_KERNEL PIVOT_OUTPUT\n", argv[0]);
    return 2;
  }
  const long ops = std::atol(argv[1]);
  const long pivot = std::atol(argv[2]);
  const char* pivot_kernel = argv[3];
  const uint64_t pivot_output = std::strtoull(argv[4], nullptr, 0);
  const char* lib = std::getenv("OPGUARD_CUPTI_LIBRARY");
  void* cupti = lib != nullptr ? dlopen(lib, RTLD_NOW | RTLD_LOCAL) : nullptr;
  auto launch =
      cupti != nullptr
          ? reinterpret_cast<void (*)(const char*)>(dlsym(cupti, "opguard_standin_cupti_launch"))
          : nullptr;
  if (launch == nullptr) {
    std::fprintf(stderr, "OPGUARD_CUPTI_LIBRARY must name the stand-in libcupti\n");
    return 2;
  }
  const uint64_t name = opguard_intern("aten::mm", 8);
  const uint64_t site = opguard_site("model.py", 12, "forward");
  int64_t shape[2] = {64, 64};
  uint64_t previous = 0;
  int bad = 0;
  for (long i = 0; i < ops; ++i) {
    opguard_value in = {};
    in.kind = OPGUARD_VALUE_TENSOR;
    in.tensor.fp_lo = previous;
    in.tensor.fp_hi = ~previous;
    in.tensor.shape = shape;
    in.tensor.ndim = 2;
    in.tensor.dtype = OPGUARD_DTYPE_FLOAT32;
    in.tensor.device = 0;
    uint64_t key = 0;
    const int on = opguard_kernels_begin(&key) == OPGUARD_OK;
    launch(i == pivot ? pivot_kernel : "ampere_sgemm_128x64_nn");
    launch("_Z8bias_addPfPKfi");
    if (on) opguard_kernels_end(key);
    bad += !on;
    opguard_tensor out = in.tensor;
    out.fp_lo = i == pivot ? pivot_output : static_cast<uint64_t>(i) + 1;
    out.fp_hi = ~out.fp_lo;
    opguard_op op = {};
    op.struct_size = sizeof(op);
    op.op_index = OPGUARD_AUTO;
    op.name = name;
    op.site = site;
    op.num_inputs = 1;
    op.inputs = &in;
    op.num_outputs = 1;
    op.outputs = &out;
    op.kernels_key = key;
    bad += opguard_record_op(&op, nullptr) != OPGUARD_OK;
    previous = out.fp_lo;
  }
  bad += opguard_flush(20000) != OPGUARD_OK;
  opguard_counters c = {};
  c.struct_size = sizeof(c);
  opguard_get_counters(&c);
  bad += opguard_shutdown(20000) != OPGUARD_OK;
  std::printf("bad=%d kernel_names=%llu\n", bad, static_cast<unsigned long long>(c.kernel_names));
  return bad == 0 ? 0 : 1;
}
