// What one op record is collected in, from the op's start to its end: the
// fingerprinted inputs and outputs and their shapes (OpContext, torch's
// observer context for the op), and the shape storage that collective
// records use as well.
#pragma once

#include <ATen/ATen.h>
#include <ATen/record_function.h>
#include <c10/util/SmallVector.h>

#include <cstdint>
#include <memory>

#include "opguard/shim.h"

namespace opguard::torch_adapter {

// The shapes of one record's tensors, back to back. The array grows (and may
// move) while the record is collected, so a tensor refers to its shape by
// position until the record is complete; only then are pointers taken.
class Shapes {
 public:
  struct At {
    uint32_t offset = 0;
  };
  At Add(at::IntArrayRef sizes) {
    At at{static_cast<uint32_t>(dims_.size())};
    dims_.append(sizes.begin(), sizes.end());
    return at;
  }
  const int64_t* Pointer(At at) const { return dims_.data() + at.offset; }

 private:
  c10::SmallVector<int64_t, 48> dims_;
};

// Fingerprinted tensors (their `shape` pointers unset) and where each one's
// shape is in a Shapes.
template <unsigned N>
class TensorRecords {
 public:
  void Add(const opguard_tensor& tensor, Shapes::At shape) {
    tensors_.push_back(tensor);
    shapes_.push_back(shape);
  }
  // Points every tensor at its shape in `shapes`; valid while `shapes` is
  // not changed.
  const opguard_tensor* Resolve(const Shapes& shapes) {
    for (size_t i = 0; i < tensors_.size(); ++i) tensors_[i].shape = shapes.Pointer(shapes_[i]);
    return tensors_.data();
  }
  const opguard_tensor* data() const { return tensors_.data(); }
  uint32_t size() const { return static_cast<uint32_t>(tensors_.size()); }
  bool empty() const { return tensors_.empty(); }

 private:
  c10::SmallVector<opguard_tensor, N> tensors_;
  c10::SmallVector<Shapes::At, N> shapes_;
};

struct NativeCollective;  // a collective seen at c10d's dispatcher (collectives.cc)

// Storage for everything an opguard_op points to, kept until the record call.
// Allocated from a per-thread pool (see operator new): recording an op does
// not go to malloc for its few KiB of inline storage.
class OpContext final : public at::ObserverContext {
 public:
  static void* operator new(size_t size);
  static void operator delete(void* p, size_t size);

  bool unfingerprintable = false;
  bool backward = false;
  bool uninitialised_output = false;
  bool reenable_record_function = false;  // nested ops were switched off at start
  bool learn_nesting = false;  // RecordFunction left on: see whether nested ops run
  uint64_t nested_calls_at_start = 0;
  bool replicated = false;  // in Optimizer.step or opguard.replicated() at start
  bool trusted = false;  // trusted mode: tensors described, not fingerprinted
  bool transparent = false;  // not an op, nor counted in depth (a subclass's op)
  std::shared_ptr<NativeCollective> native;  // set for c10d ops: see NativeCollectiveStart
  uint64_t name = 0;
  uint64_t site = 0;
  uint64_t forward_site = 0;  // a backward op with its own site: its forward's
  int64_t seq_nr = -1;
  int64_t seq_begin = -1;
  uint64_t start_ns = 0;
  uint64_t kernels_key = 0;  // opguard_kernels_begin's, while kernel names are recorded

  Shapes shapes;
  // Input values; a tensor value's shape, or a tensor list's first tensor in
  // `list_tensors`, is in `input_refs` at the same index.
  c10::SmallVector<opguard_value, 8> inputs;
  c10::SmallVector<uint32_t, 8> input_refs;
  TensorRecords<8> list_tensors;  // TensorList inputs, back to back
  TensorRecords<4> outputs;
  c10::SmallVector<const c10::TensorImpl*, 8> input_impls;  // to tell writes from views
  // Run inside a tensor subclass's __torch_dispatch__, where writes do not
  // bump version counters (op_observer.cc, MarkUnversionedMemory).
  bool in_subclass_dispatch = false;
  c10::SmallVector<const c10::StorageImpl*, 4> input_storages;  // in_subclass_dispatch: to tell views
  // The tensors the op's schema marks written (`Tensor(a!)` arguments,
  // `Tensor(a!)[]` lists element by element), held from its start to its
  // end: they are its outputs too, the only ones of an op that returns
  // nothing (`_foreach_add_`, `_fused_adamw_`, a custom op filling its out
  // arguments).
  c10::SmallVector<at::Tensor, 4> written;

  void AddTensorInput(const opguard_value& value, Shapes::At shape) {
    inputs.push_back(value);
    input_refs.push_back(shape.offset);
  }
  void AddListInput(const opguard_value& value, uint32_t first_list_tensor) {
    inputs.push_back(value);
    input_refs.push_back(first_list_tensor);
  }
  void AddOtherInput(const opguard_value& value) {
    inputs.push_back(value);
    input_refs.push_back(0);
  }
  // Points every tensor and list at its storage: call once, when complete.
  void Resolve() {
    const opguard_tensor* lists = list_tensors.Resolve(shapes);
    for (size_t i = 0; i < inputs.size(); ++i) {
      opguard_value& v = inputs[i];
      if (v.kind == OPGUARD_VALUE_TENSOR) {
        v.tensor.shape = shapes.Pointer(Shapes::At{input_refs[i]});
      } else if (v.kind == OPGUARD_VALUE_TENSOR_LIST) {
        v.tensors = lists + input_refs[i];
      }
    }
    outputs.Resolve(shapes);
  }
};

}  // namespace opguard::torch_adapter
