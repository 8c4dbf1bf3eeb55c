#include "fake_daemon.h"

#include <algorithm>
#include <chrono>
#include <future>

#include "opguard/idl/envelope.h"

namespace opguard::shim::testing {

namespace w = opguard::wire;

FakeDaemon::FakeDaemon(std::string endpoint, FakeDaemonOptions options)
    : endpoint_(std::move(endpoint)),
      ack_(options.ack),
      ack_delay_ms_(options.ack_delay_ms),
      service_us_(options.service_us),
      reject_seqs_(std::move(options.reject_seqs)),
      keep_records_(options.keep_records),
      drop_first_ack_seqs_(std::move(options.drop_first_ack_seqs)) {}

FakeDaemon::~FakeDaemon() { Stop(); }

bool FakeDaemon::Start() {
  Stop();
  stop_ = false;
  std::promise<std::string> bound;
  auto result = bound.get_future();
  thread_ = std::thread([this, &bound] {
    std::string error;
    bool announced = false;
    try {
      {
        // A new socket answers nothing that the previous one received.
        std::lock_guard<std::mutex> lock(mu_);
        outstanding_.clear();
      }
      zmq::socket_t sock(ctx_, zmq::socket_type::router);
      sock.set(zmq::sockopt::linger, 0);
      sock.bind(endpoint_);
      bound.set_value("");
      announced = true;
      std::deque<Reply> replies;  // in arrival order; dropped with the socket
      auto next_due = std::chrono::milliseconds(10);
      while (!stop_) {
        zmq_pollitem_t item{sock.handle(), 0, ZMQ_POLLIN, 0};
        zmq::poll(&item, 1, std::min(next_due, std::chrono::milliseconds(10)));
        for (int i = 0; i < 1000 && !stop_; ++i) {
          zmq::message_t id, msg;
          if (!sock.recv(id, zmq::recv_flags::dontwait)) break;
          if (!id.more() || !sock.recv(msg, zmq::recv_flags::none)) continue;
          while (msg.more()) {  // extra frames: not our protocol, drain them
            zmq::message_t extra;
            (void)sock.recv(extra, zmq::recv_flags::none);
            if (!extra.more()) break;
          }
          if (uint32_t us = service_us_.load(); us != 0) {
            std::this_thread::sleep_for(std::chrono::microseconds(us));
          }
          Handle(id, msg, &replies);
          (void)SendDue(sock, &replies);
        }
        next_due = SendDue(sock, &replies);
      }
    } catch (const std::exception& e) {
      if (!announced) bound.set_value(e.what());
    }
  });
  std::string error = result.get();
  if (!error.empty()) {
    thread_.join();
    return false;
  }
  return true;
}

void FakeDaemon::Stop() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

void FakeDaemon::SetAck(bool ack) { ack_ = ack; }

Received FakeDaemon::Snapshot() {
  std::lock_guard<std::mutex> lock(mu_);
  return received_;
}

bool FakeDaemon::WaitFor(const std::function<bool(const Received&)>& pred, int timeout_ms) {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms), [&] { return pred(received_); });
}

std::chrono::milliseconds FakeDaemon::SendDue(zmq::socket_t& sock, std::deque<Reply>* replies) {
  auto now = std::chrono::steady_clock::now();
  while (!replies->empty() && replies->front().due <= now) {
    Reply r = std::move(replies->front());
    replies->pop_front();
    {
      std::lock_guard<std::mutex> lock(mu_);
      outstanding_.erase(r.key);
      if (drop_first_ack_seqs_.erase(std::get<1>(r.key)) != 0) {
        ++received_.acks_lost;
        cv_.notify_all();
        continue;
      }
      ++received_.acks_sent;
      answered_.insert(r.key);
      cv_.notify_all();
    }
    zmq::message_t reply_id(r.id.data(), r.id.size());
    zmq::message_t reply(r.ack.data(), r.ack.size());
    (void)sock.send(reply_id, zmq::send_flags::sndmore | zmq::send_flags::dontwait);
    (void)sock.send(reply, zmq::send_flags::dontwait);
  }
  if (replies->empty()) return std::chrono::milliseconds(10);
  auto left = std::chrono::ceil<std::chrono::milliseconds>(replies->front().due - now);
  return std::max(left, std::chrono::milliseconds(0));
}

void FakeDaemon::Handle(const zmq::message_t& id, const zmq::message_t& msg, std::deque<Reply>* replies) {
  w::AlignedStorage aligned;
  auto env = w::OpenEnvelope(msg.data(), msg.size(), aligned);
  std::unique_lock<std::mutex> lock(mu_);
  ++received_.messages;
  if (!env.ok() || (*env)->message_type() != w::Message::Batch) {
    ++received_.invalid;
    cv_.notify_all();
    return;
  }
  const w::Batch* b = (*env)->message_as_Batch();
  auto key = std::make_tuple(b->rank(), b->session(), b->seq());
  bool reject = reject_seqs_.count(b->seq()) != 0;
  if (!reject) {
    if (!stored_.insert(key).second) {
      ++received_.duplicates;
    } else {
      ++received_.batches;
      received_.sessions.insert(b->session());
      std::string run = b->run()->str();
      bool known = false;
      for (const auto& r : received_.runs) known = known || r == run;
      if (!known) received_.runs.push_back(run);
      if (b->announce() != nullptr) {
        ++received_.announces;
        const auto* a = b->announce();
        if (a->framework() != nullptr) received_.framework = a->framework()->str();
        if (a->determinism() != nullptr) {
          for (const auto* kv : *a->determinism()) received_.determinism[kv->key()->str()] = kv->value()->str();
        }
        if (a->versions() != nullptr) {
          for (const auto* kv : *a->versions()) received_.versions[kv->key()->str()] = kv->value()->str();
        }
      }
      if (b->end_of_run()) ++received_.end_of_run;
      if (b->strings() != nullptr) {
        for (const auto* s : *b->strings()) received_.strings[s->id()] = s->text()->str();
      }
      if (b->sites() != nullptr) {
        for (const auto* s : *b->sites()) received_.sites.insert(s->id());
      }
      if (b->communicators() != nullptr) {
        for (const auto* c : *b->communicators()) received_.communicators.insert(c->id());
      }
      if (b->steps() != nullptr) received_.steps += b->steps()->size();
      if (b->sources() != nullptr) received_.sources += b->sources()->size();
      if (b->ops() != nullptr) {
        received_.records += b->ops()->size();
        if (keep_records_) {
          for (const auto* op : *b->ops()) {
            ReceivedOp r;
            r.rank = b->rank();
            r.lane = op->lane();
            r.op_index = op->op_index();
            r.step = op->step();
            r.name = op->name();
            r.site = op->site();
            r.seq_nr = op->seq_nr();
            r.backward = op->backward();
            r.replicated = op->replicated();
            r.trusted = op->trusted();
            r.inputs = op->inputs() != nullptr ? op->inputs()->size() : 0;
            r.outputs = op->outputs() != nullptr ? op->outputs()->size() : 0;
            if (r.outputs != 0 && op->outputs()->Get(0)->fingerprint() != nullptr) {
              r.out_lo = op->outputs()->Get(0)->fingerprint()->lo();
              r.out_hi = op->outputs()->Get(0)->fingerprint()->hi();
              r.out_has_stats = op->outputs()->Get(0)->stats() != nullptr;
            }
            if (r.inputs != 0 && op->inputs()->Get(0)->tensor() != nullptr &&
                op->inputs()->Get(0)->tensor()->fingerprint() != nullptr) {
              r.in_lo = op->inputs()->Get(0)->tensor()->fingerprint()->lo();
            }
            if (op->kernels() != nullptr)
              r.kernels.assign(op->kernels()->begin(), op->kernels()->end());
            received_.ops.push_back(r);
          }
        }
      }
      if (b->collectives() != nullptr) {
        received_.records += b->collectives()->size();
        if (keep_records_) {
          for (const auto* c : *b->collectives()) {
            ReceivedCollective r;
            r.rank = b->rank();
            r.communicator = c->communicator();
            r.seq = c->seq();
            r.phase = static_cast<uint8_t>(c->phase());
            r.op_index = c->op_index();
            r.kind = static_cast<uint8_t>(c->kind());
            r.dtype = static_cast<uint8_t>(c->dtype());
            r.reduce_op = c->reduce_op();
            r.root = c->root();
            r.count = c->count();
            r.time_ns = c->time_ns();
            r.inputs = c->inputs() != nullptr ? c->inputs()->size() : 0;
            r.outputs = c->outputs() != nullptr ? c->outputs()->size() : 0;
            if (r.inputs != 0) r.in_lo = c->inputs()->Get(0)->fingerprint()->lo();
            if (c->outputs() != nullptr && c->outputs()->size() != 0) {
              r.out_lo = c->outputs()->Get(0)->fingerprint()->lo();
            }
            received_.collectives.push_back(r);
          }
        }
      }
      if (b->gaps() != nullptr) {
        for (const auto* g : *b->gaps()) {
          ReceivedGap r;
          r.rank = b->rank();
          r.lane = g->lane();
          r.first_op = g->first_op();
          r.last_op = g->last_op();
          r.records_dropped = g->records_dropped();
          r.communicator = g->communicator();
          r.first_seq = g->first_seq();
          r.last_seq = g->last_seq();
          r.reason = g->reason() != nullptr ? g->reason()->str() : "";
          received_.gaps.push_back(r);
        }
      }
    }
  }
  ++received_.receipts[b->seq()];
  bool send = ack_.load();
  if (send && answered_.count(std::make_tuple(b->session(), b->seq())) == 0) {
    outstanding_.insert(std::make_tuple(b->session(), b->seq()));
    received_.max_outstanding = std::max<uint64_t>(received_.max_outstanding, outstanding_.size());
  }
  cv_.notify_all();
  lock.unlock();
  if (!send) return;
  // "Durable" here means stored in memory above, before the ack.
  flatbuffers::FlatBufferBuilder fbb(256);
  auto run = fbb.CreateString(b->run()->string_view());
  auto error = reject ? fbb.CreateString("rejected by test") : 0;
  w::AckBuilder ab(fbb);
  ab.add_run(run);
  ab.add_rank(b->rank());
  ab.add_session(b->session());
  ab.add_seq(b->seq());
  ab.add_code(reject ? w::AckCode::Rejected : w::AckCode::Durable);
  if (reject) ab.add_error(error);
  w::FinishEnvelope(fbb, ab.Finish());
  Reply r;
  r.due = std::chrono::steady_clock::now() + std::chrono::milliseconds(ack_delay_ms_.load());
  r.id.assign(static_cast<const char*>(id.data()), id.size());
  r.ack.assign(reinterpret_cast<const char*>(fbb.GetBufferPointer()), fbb.GetSize());
  r.key = std::make_tuple(b->session(), b->seq());
  replies->push_back(std::move(r));
}

}  // namespace opguard::shim::testing
