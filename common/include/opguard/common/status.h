// Status and Result<T>: how the daemon, the aligner and the CLI report errors.
// The core does not throw; a failed call returns a Status whose message is one
// line a user can read ("ingest: batch from rank 3 has schema major 9, expected 1").
#pragma once

#include <string>
#include <utility>
#include <variant>

namespace opguard {

enum class StatusCode { kOk = 0, kInvalidArgument, kNotFound, kUnavailable, kDataLoss, kInternal };

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }
  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "invalid argument: <message>" (or "ok").
  std::string ToString() const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status InvalidArgument(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }
inline Status NotFound(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
inline Status Unavailable(std::string m) { return {StatusCode::kUnavailable, std::move(m)}; }
inline Status DataLoss(std::string m) { return {StatusCode::kDataLoss, std::move(m)}; }
inline Status Internal(std::string m) { return {StatusCode::kInternal, std::move(m)}; }

// A value or the Status that explains why there is none.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}          // NOLINT: implicit by design
  Result(Status status) : v_(std::move(status)) {}   // NOLINT: must not be ok
  bool ok() const { return std::holds_alternative<T>(v_); }
  const Status& status() const {
    static const Status kOk;
    return ok() ? kOk : std::get<Status>(v_);
  }
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace opguard

#define OPGUARD_CONCAT_INNER(a, b) a##b
#define OPGUARD_CONCAT(a, b) OPGUARD_CONCAT_INNER(a, b)

// Returns from the calling function when `expr` (a Status) is not ok.
#define OPGUARD_RETURN_IF_ERROR(expr)            \
  do {                                           \
    ::opguard::Status _opguard_st = (expr);      \
    if (!_opguard_st.ok()) return _opguard_st;   \
  } while (0)

// `lhs = value of rexpr` (a Result<T>), or return its Status.
#define OPGUARD_ASSIGN_OR_RETURN(lhs, rexpr) \
  OPGUARD_ASSIGN_OR_RETURN_IMPL(OPGUARD_CONCAT(_opguard_r_, __LINE__), lhs, rexpr)
#define OPGUARD_ASSIGN_OR_RETURN_IMPL(tmp, lhs, rexpr) \
  auto tmp = (rexpr);                                  \
  if (!tmp.ok()) return tmp.status();                  \
  lhs = std::move(tmp).value()
