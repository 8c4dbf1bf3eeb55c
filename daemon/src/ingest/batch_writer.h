// One verified Batch's records into a StoreBatch: definitions, op chunks,
// collectives, step marks, gap notices and sources, each under the keys
// storage/ assigns. The registry side of a batch (which run, dedup, counters)
// stays with Ingest; this only writes and counts what it wrote.
//
// Private to the ingest room. Used by the receiver thread only; keeps its
// scratch (open chunks, a FlatBufferBuilder) across batches so a batch
// allocates nothing in the steady state.
#pragma once

#include <flatbuffers/flatbuffers.h>

#include <cstdint>
#include <vector>

#include "opguard/aligner/trace.h"
#include "opguard/idl/envelope.h"
#include "storage/op_chunk.h"
#include "storage/store.h"

namespace opguard::daemon {

// What one batch (or a commit group, summed) wrote.
struct RecordCounts {
  uint64_t ops = 0, collectives = 0, steps = 0;  // collectives: completed records
  uint64_t strings = 0, sites = 0, sources = 0;
  uint64_t gap_notices = 0, op_gap_records = 0, collective_gap_records = 0;
  // Records written again that the store already held (StoreBatch::CheckExisting):
  // counted in none of the fields above.
  uint64_t already_stored = 0;
  uint64_t sources_refused = 0;  // over the source size limit, not stored

  // Records of a kind the rank's counters count (ops, collectives, steps, gap notices).
  uint64_t counted() const { return ops + collectives + steps + gap_notices; }

  RecordCounts& operator+=(const RecordCounts& o);
};

class BatchWriter {
 public:
  // `cores`: store each op's event core under its chunk's key in the cores
  // column family (storage.op_cores).
  // `max_source_bytes`: a larger source file is not stored (counted in
  // RecordCounts::sources_refused); 0: no limit.
  explicit BatchWriter(ChunkCodec codec, bool cores = true, uint64_t max_source_bytes = 0)
      : codec_(codec), cores_(cores), max_source_bytes_(max_source_bytes) {}

  // `buffer` of `bytes`: the verified message that holds `batch`, whose
  // records are stored under run id `run`. `rank_ops`: the ops its rank has
  // stored before it (the rank's cores are complete when they all came with
  // cores).
  RecordCounts Write(const wire::Batch& batch, const uint8_t* buffer, size_t bytes, uint64_t run,
                     uint64_t rank_ops, StoreBatch* out);

 private:
  void PutDefinitions(const wire::Batch& batch, uint64_t run, StoreBatch* out, RecordCounts* n);
  void PutOps(const wire::Batch& batch, const uint8_t* buffer, size_t bytes, uint64_t run,
              uint64_t rank_ops, StoreBatch* out, RecordCounts* n);
  void PutCollectives(const wire::Batch& batch, uint64_t run, StoreBatch* out, RecordCounts* n);
  void PutSteps(const wire::Batch& batch, uint64_t run, StoreBatch* out, RecordCounts* n);
  void PutGaps(const wire::Batch& batch, uint64_t run, StoreBatch* out, RecordCounts* n);
  void PutSources(const wire::Batch& batch, uint64_t run, StoreBatch* out, RecordCounts* n);

  const ChunkCodec codec_;  // storage.compression, applied to each ops chunk
  const bool cores_;
  const uint64_t max_source_bytes_;
  flatbuffers::FlatBufferBuilder fbb_{1024};
  std::vector<OpChunkWriter> chunks_;  // one open chunk per lane of a batch
  std::vector<uint32_t> chunk_lanes_;
  aligner::OpDetail detail_;  // scratch of the event cores, kept for its capacity
  std::string text_;          // a string repaired to UTF-8
};

}  // namespace opguard::daemon
