#include "opguard/daemon/client.h"

#include <zmq.hpp>

namespace opguard::daemon {

DaemonClient::DaemonClient(std::string endpoint, std::chrono::milliseconds timeout,
                           CurveClientConfig curve)
    : endpoint_(std::move(endpoint)), timeout_(timeout), curve_(std::move(curve)) {}

DaemonClient::~DaemonClient() {
  socket_.reset();
  context_.reset();
}

opguard::Status DaemonClient::Connect() {
  if (socket_) return opguard::Status::Ok();
  CurveKeyPair keys;
  std::string server_key;
  const bool curve = !curve_.empty() && endpoint_.rfind("tcp://", 0) == 0;
  if (curve) {
    if (curve_.key_file.empty() || curve_.server_key.empty()) {
      return InvalidArgument("CURVE to " + endpoint_ + " needs both a client key (--key, $OPGUARD_KEY) and "
                             "the daemon's public key (--server-key, $OPGUARD_SERVER_KEY)");
    }
    auto pair = ReadKeyPair(curve_.key_file);
    if (!pair.ok()) return pair.status();
    keys = *pair;
    auto server = ReadPublicKey(curve_.server_key);
    if (!server.ok()) return server.status();
    server_key = *server;
  }
  try {
    context_ = std::make_unique<zmq::context_t>(1);
    socket_ = std::make_unique<zmq::socket_t>(*context_, zmq::socket_type::dealer);
    socket_->set(zmq::sockopt::linger, 0);
    // Queue nothing for a daemon that is not there: the send waits for a
    // connection at most `timeout` and then fails.
    socket_->set(zmq::sockopt::immediate, 1);
    socket_->set(zmq::sockopt::sndtimeo, static_cast<int>(timeout_.count()));
    socket_->set(zmq::sockopt::rcvtimeo, static_cast<int>(timeout_.count()));
    socket_->set(zmq::sockopt::maxmsgsize, static_cast<int64_t>(wire::kMaxMessageBytes));
    if (curve) {
      socket_->set(zmq::sockopt::curve_serverkey, server_key);
      socket_->set(zmq::sockopt::curve_publickey, keys.public_key);
      socket_->set(zmq::sockopt::curve_secretkey, keys.secret_key);
    }
    socket_->connect(endpoint_);
  } catch (const zmq::error_t& e) {
    socket_.reset();
    return Unavailable("cannot connect to daemon at " + endpoint_ + ": " + e.what());
  }
  return opguard::Status::Ok();
}

// A CURVE handshake that fails looks like silence to the client (ZeroMQ
// retries quietly): say what to check.
std::string DaemonClient::CurveHint() const {
  if (endpoint_.rfind("tcp://", 0) != 0) return "";
  return curve_.empty() ? " · a daemon with CURVE keys answers only clients with --key and --server-key"
                        : " · is this key in the daemon's curve.authorized_keys, and --server-key its key?";
}

Result<Answer> DaemonClient::Call(const flatbuffers::FlatBufferBuilder& request) {
  OPGUARD_RETURN_IF_ERROR(Connect());
  const std::string seconds = std::to_string(timeout_.count() / 1000.0).substr(0, 4);
  try {
    auto sent = socket_->send(zmq::const_buffer(request.GetBufferPointer(), request.GetSize()),
                              zmq::send_flags::none);
    if (!sent) {
      socket_.reset();  // drop anything queued so a retry starts clean
      return Unavailable("daemon not reachable at " + endpoint_ + " (no connection within " + seconds +
                         "s; is opguardd running?)" + CurveHint());
    }
    zmq::message_t reply;
    if (!socket_->recv(reply, zmq::recv_flags::none)) {
      socket_.reset();
      return Unavailable("daemon at " + endpoint_ + " did not answer within " + seconds + "s" + CurveHint());
    }
    // A received frame may start at any address (libzmq decodes large
    // frames in place); FlatBuffers needs alignment.
    wire::AlignedStorage storage;
    auto opened = wire::OpenEnvelope(reply.data(), reply.size(), storage);
    if (!opened.ok()) return DataLoss("bad answer from " + endpoint_ + ": " + opened.status().message());
    if (const auto* error = (*opened)->message_as_ErrorAnswer()) {
      return opguard::Status(StatusCode::kInvalidArgument,
                             error->message() ? error->message()->str() : "daemon error");
    }
    return Answer(std::string(static_cast<const char*>(reply.data()), reply.size()));
  } catch (const zmq::error_t& e) {
    socket_.reset();
    return Unavailable("talking to daemon at " + endpoint_ + ": " + e.what());
  }
}

Result<Answer> DaemonClient::Status() {
  flatbuffers::FlatBufferBuilder b;
  wire::FinishEnvelope(b, wire::CreateStatusRequest(b));
  return Call(b);
}

Result<Answer> DaemonClient::ListRuns() {
  flatbuffers::FlatBufferBuilder b;
  wire::FinishEnvelope(b, wire::CreateListRunsRequest(b));
  return Call(b);
}

Result<Answer> DaemonClient::ReadTrace(const std::string& run, uint32_t rank, uint32_t lane,
                                       uint64_t from_op, uint32_t max_ops) {
  flatbuffers::FlatBufferBuilder b;
  wire::FinishEnvelope(b, wire::CreateReadTraceRequest(b, b.CreateString(run), rank, lane, from_op, max_ops));
  return Call(b);
}

opguard::Status DaemonClient::DeleteRun(const std::string& run) {
  flatbuffers::FlatBufferBuilder b;
  wire::FinishEnvelope(b, wire::CreateDeleteRunRequest(b, b.CreateString(run)));
  auto answer = Call(b);
  return answer.status();
}

}  // namespace opguard::daemon
