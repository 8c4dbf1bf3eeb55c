// Turns staged entries (staging.h) into Envelope{Batch} messages. Runs on the
// sender thread only; stateless between calls except for what the caller
// passes in (the next batch sequence number).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <flatbuffers/flatbuffers.h>

namespace opguard::shim {

struct BatchIdentity {
  std::string run;
  uint32_t rank = 0;
  uint64_t session = 0;
};

using KeyValues = std::vector<std::pair<std::string, std::string>>;

// Contents of RunAnnounce (ingest.fbs).
struct AnnounceInfo {
  std::string job_id;
  uint32_t local_rank = 0;
  uint32_t world_size = 1;
  std::string node;
  uint64_t pid = 0;
  std::string framework;
  KeyValues versions;
  KeyValues determinism;
  KeyValues environment;
  uint64_t start_ns = 0;
};

struct EncodedBatch {
  uint64_t seq = 0;
  flatbuffers::DetachedBuffer buffer;
  uint32_t records = 0;  // ops + collectives
};

struct EncodeStats {
  uint64_t sources_skipped = 0;  // unreadable or over the size limit
};

class BatchEncoder {
 public:
  BatchEncoder(BatchIdentity identity, uint32_t batch_records, uint32_t max_source_bytes)
      : id_(std::move(identity)), batch_records_(batch_records), max_source_bytes_(max_source_bytes) {}

  // Encodes all entries in data[0..size) into batches of at most
  // `batch_records` ops+collectives each (definitions ride along with the
  // records that follow them), numbered from *next_seq (advanced). `announce`
  // (may be null) goes into the first batch produced; `end_of_run` marks the
  // last one, producing an empty batch if there is nothing else to send.
  //
  // With `max_batches`, encoding stops once that many batches are complete
  // and `*consumed` (if given) says how many bytes of `data` they cover: a
  // batch boundary, so encoding the rest in a later call gives the same
  // batches as one call would. `end_of_run` applies only to a call that
  // reaches the end of `data` (*consumed == size).
  std::vector<EncodedBatch> Encode(const uint8_t* data, size_t size, const AnnounceInfo* announce,
                                   bool end_of_run, uint64_t* next_seq, EncodeStats* stats,
                                   size_t max_batches = SIZE_MAX, size_t* consumed = nullptr);

 private:
  BatchIdentity id_;
  uint32_t batch_records_;
  uint32_t max_source_bytes_;
};

}  // namespace opguard::shim
