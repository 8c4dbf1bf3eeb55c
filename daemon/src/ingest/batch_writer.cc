#include "ingest/batch_writer.h"

#include <string_view>

#include "opguard/common/saturating.h"
#include "opguard/common/utf8.h"
#include "opguard/daemon/report_wire.h"
#include "storage/record_copy.h"

namespace opguard::daemon {
namespace {

std::string_view Finished(const flatbuffers::FlatBufferBuilder& b) {
  return {reinterpret_cast<const char*>(b.GetBufferPointer()), b.GetSize()};
}

}  // namespace

RecordCounts& RecordCounts::operator+=(const RecordCounts& o) {
  ops += o.ops;
  collectives += o.collectives;
  steps += o.steps;
  strings += o.strings;
  sites += o.sites;
  sources += o.sources;
  gap_notices += o.gap_notices;
  already_stored += o.already_stored;
  sources_refused += o.sources_refused;
  op_gap_records = SaturatingAdd(op_gap_records, o.op_gap_records);
  collective_gap_records = SaturatingAdd(collective_gap_records, o.collective_gap_records);
  return *this;
}

RecordCounts BatchWriter::Write(const wire::Batch& batch, const uint8_t* buffer, size_t bytes,
                                uint64_t run, uint64_t rank_ops, StoreBatch* out) {
  RecordCounts n;
  PutDefinitions(batch, run, out, &n);
  PutOps(batch, buffer, bytes, run, rank_ops, out, &n);
  PutCollectives(batch, run, out, &n);
  PutSteps(batch, run, out, &n);
  PutGaps(batch, run, out, &n);
  PutSources(batch, run, out, &n);
  return n;
}

void BatchWriter::PutDefinitions(const wire::Batch& batch, uint64_t run, StoreBatch* out,
                                 RecordCounts* n) {
  if (const auto* v = batch.strings()) {
    for (const auto* s : *v) {
      if (s->text() == nullptr) continue;
      if (out->PutString(run, s->id(), RepairedUtf8(s->text()->string_view(), &text_))) ++n->strings;
    }
  }
  if (const auto* v = batch.sites()) {
    for (const auto* s : *v) {
      if (out->PutSite(run, s->id(), SiteDef{s->file(), s->line(), s->function()})) ++n->sites;
    }
  }
  if (const auto* v = batch.communicators()) {
    for (const auto* c : *v) {
      fbb_.Clear();
      fbb_.Finish(CopyCommunicatorDef(fbb_, c));
      out->PutCommunicator(run, c->id(), Finished(fbb_));
    }
  }
}

void BatchWriter::PutOps(const wire::Batch& batch, const uint8_t* buffer, size_t bytes, uint64_t run,
                         uint64_t rank_ops, StoreBatch* out, RecordCounts* n) {
  const auto* v = batch.ops();
  if (v == nullptr || v->size() == 0) return;
  // Consecutive records of one lane go into one chunk value, keyed by its
  // last op_index (docs/storage.md). Chunking depends only on the batch's
  // content, so a resent batch rewrites exactly the same keys.
  const uint32_t rank = batch.rank();
  // Every chunk of the rank has its cores in the cores column family as
  // long as every batch of it came with them: marked with the rank's first
  // ops, unmarked (in the same write) by any batch without them, so a
  // reader never takes an incomplete set of cores for the trace.
  if (!cores_) {
    out->DeleteCoresComplete(run, rank);
  } else if (rank_ops == 0) {
    out->PutCoresComplete(run, rank);
  }
  auto put_chunk = [&](uint32_t lane, OpChunkWriter& w) {
    if (w.empty()) return;
    if (cores_) {
      const std::string_view cores = w.FinishCores(codec_);
      if (cores.empty()) {
        out->DeleteCoresComplete(run, rank);  // later in the batch than the mark
      } else {
        out->PutOpCores(run, rank, lane, w.last_op(), cores);
      }
    }
    if (out->PutOpChunk(run, rank, lane, w.last_op(), w.Finish(codec_))) {
      n->ops += w.count();
    } else {
      n->already_stored += w.count();
    }
    w.Clear();
  };
  // One open chunk per lane of this batch (lanes are few; usually one).
  size_t open_lanes = 0;
  for (const auto* op : *v) {
    const uint32_t lane = op->lane();
    size_t i = 0;
    while (i < open_lanes && chunk_lanes_[i] != lane) ++i;
    if (i == open_lanes) {
      if (open_lanes == chunks_.size()) chunks_.emplace_back();
      if (chunk_lanes_.size() <= open_lanes) chunk_lanes_.resize(open_lanes + 1);
      chunk_lanes_[i] = lane;
      ++open_lanes;
    }
    OpChunkWriter& w = chunks_[i];
    if (!w.Accepts(op->op_index())) put_chunk(lane, w);
    // The record's own bytes when they form one compact span (any batch
    // the shim encodes), else a rebuilt copy.
    if (!AddOpRecordBytes(&w, buffer, bytes, op)) {
      fbb_.Clear();
      fbb_.Finish(CopyOpRecord(fbb_, op));
      w.Add(op->op_index(), fbb_.GetBufferPointer(), fbb_.GetSize());
    }
    // Reduced once here, so that no query has to decode and hash the
    // record to align it (op_chunk.h).
    if (cores_) {
      OpDetailFromRecord(*op, &detail_);
      w.AddCore(aligner::MakeOpEventCore(detail_));
    }
  }
  for (size_t i = 0; i < open_lanes; ++i) put_chunk(chunk_lanes_[i], chunks_[i]);
}

void BatchWriter::PutCollectives(const wire::Batch& batch, uint64_t run, StoreBatch* out,
                                 RecordCounts* n) {
  const auto* v = batch.collectives();
  if (v == nullptr) return;
  for (const auto* c : *v) {
    fbb_.Clear();
    fbb_.Finish(CopyCollectiveRecord(fbb_, c));
    if (!out->PutCollective(run, batch.rank(), c->communicator(), c->seq(),
                            static_cast<uint8_t>(c->phase()), Finished(fbb_))) {
      ++n->already_stored;
    } else if (c->phase() == wire::CollectivePhase::Completed) {
      ++n->collectives;
    }
  }
}

void BatchWriter::PutSteps(const wire::Batch& batch, uint64_t run, StoreBatch* out, RecordCounts* n) {
  const auto* v = batch.steps();
  if (v == nullptr) return;
  for (const auto* s : *v) {
    if (out->PutStep(run, batch.rank(), s->lane(), s->step(), s->op_index(), s->time_ns())) {
      ++n->steps;
    } else {
      ++n->already_stored;
    }
  }
}

void BatchWriter::PutGaps(const wire::Batch& batch, uint64_t run, StoreBatch* out, RecordCounts* n) {
  const auto* v = batch.gaps();
  if (v == nullptr) return;
  for (const auto* gap : *v) {
    fbb_.Clear();
    fbb_.Finish(CopyGapNotice(fbb_, gap));
    const bool collective = gap->communicator() != 0;  // a gap of collective records
    const bool fresh =
        collective ? out->PutCollectiveGap(run, batch.rank(), gap->communicator(), gap->first_seq(), Finished(fbb_))
                   : out->PutOpGap(run, batch.rank(), gap->lane(), gap->first_op(), Finished(fbb_));
    if (!fresh) {
      ++n->already_stored;
      continue;
    }
    uint64_t* records = collective ? &n->collective_gap_records : &n->op_gap_records;
    *records = SaturatingAdd(*records, gap->records_dropped());
    ++n->gap_notices;
  }
}

void BatchWriter::PutSources(const wire::Batch& batch, uint64_t run, StoreBatch* out,
                             RecordCounts* n) {
  const auto* v = batch.sources();
  if (v == nullptr) return;
  for (const auto* s : *v) {
    if (s->content() == nullptr) continue;
    if (max_source_bytes_ != 0 && s->content()->size() > max_source_bytes_) {
      ++n->sources_refused;
      continue;
    }
    if (out->PutSource(run, s->file(),
                       {reinterpret_cast<const char*>(s->content()->data()), s->content()->size()})) {
      ++n->sources;
    }
  }
}

}  // namespace opguard::daemon
