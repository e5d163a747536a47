// Status and StatusOr: errors are values inside Orrery's libraries.
//
// A Status is OK or carries a code and one human-readable line. The CLI prints that line and
// exits non-zero; actors send it back in a reply. Nothing in core, kernels or model throws across
// an API boundary. Orrery keeps its own small type rather than absl::Status so that core, kernels
// and model link nothing but the C++ runtime (and CUDA), which is all a bare GPU machine offers.
#pragma once

#include <cassert>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace orrery {

enum class StatusCode : int {
  kOk = 0,
  kInvalidArgument,  // bad input from a user: config value, CLI flag, file contents
  kNotFound,         // a named thing (file, table, tensor, actor) does not exist
  kAlreadyExists,
  kOutOfRange,          // an index, size or value outside what is allowed
  kFailedPrecondition,  // the system is not in a state where the call can run
  kDataLoss,            // corrupt or truncated data (checksums, headers that lie)
  kIoError,             // the operating system refused (open, read, write, mmap)
  kDeadlineExceeded,
  kCancelled,
  kResourceExhausted,  // out of memory, queue full, rate limited
  kUnavailable,        // a peer cannot be reached right now; retrying may help
  kUnimplemented,
  kInternal,  // a broken invariant inside Orrery: a bug
};

std::string_view StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK
  Status(StatusCode code, std::string message);

  static Status OK() { return Status(); }
  bool ok() const { return rep_ == nullptr; }
  StatusCode code() const { return rep_ ? rep_->code : StatusCode::kOk; }
  // The one-line message, without the code name. Empty when OK.
  const std::string& message() const;
  // "InvalidArgument: message", or "OK".
  std::string ToString() const;
  // Returns a copy whose message is "context: message" (same code); OK stays OK.
  Status WithContext(std::string_view context) const;

  friend bool operator==(const Status& a, const Status& b) {
    return a.code() == b.code() && a.message() == b.message();
  }

 private:
  struct Rep {
    StatusCode code;
    std::string message;
  };
  std::shared_ptr<const Rep> rep_;  // null when OK; shared so copies are cheap
};

Status InvalidArgumentError(std::string message);
Status NotFoundError(std::string message);
Status AlreadyExistsError(std::string message);
Status OutOfRangeError(std::string message);
Status FailedPreconditionError(std::string message);
Status DataLossError(std::string message);
Status IoError(std::string message);
Status DeadlineExceededError(std::string message);
Status CancelledError(std::string message);
Status ResourceExhaustedError(std::string message);
Status UnavailableError(std::string message);
Status UnimplementedError(std::string message);
Status InternalError(std::string message);
// IoError built from errno: "<what>: <strerror(errno)>".
Status ErrnoError(std::string_view what, int err);

// Either a value or a non-OK Status.
template <typename T>
class [[nodiscard]] StatusOr {
 public:
  StatusOr(const Status& status)  // NOLINT: implicit by design
      : status_(status.ok() ? Status(StatusCode::kInternal, "StatusOr built from an OK Status")
                            : status) {
    assert(!status.ok() && "StatusOr built from an OK Status");
  }
  StatusOr(T value) : value_(std::move(value)) {}  // NOLINT: implicit by design

  bool ok() const { return status_.ok(); }
  const Status& status() const { return status_; }

  T& value() & {
    assert(ok());
    return *value_;
  }
  const T& value() const& {
    assert(ok());
    return *value_;
  }
  T&& value() && {
    assert(ok());
    return std::move(*value_);
  }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  Status status_;
  std::optional<T> value_;
};

}  // namespace orrery

#define ORRERY_STATUS_CONCAT_INNER(a, b) a##b
#define ORRERY_STATUS_CONCAT(a, b) ORRERY_STATUS_CONCAT_INNER(a, b)

// Returns from the enclosing function when `expr` (a Status) is not OK.
#define ORRERY_RETURN_IF_ERROR(expr)                 \
  do {                                               \
    ::orrery::Status orrery_status_ = (expr);        \
    if (!orrery_status_.ok()) return orrery_status_; \
  } while (0)

// `lhs = value of expr` (a StatusOr), or returns its Status from the enclosing function.
#define ORRERY_ASSIGN_OR_RETURN(lhs, expr) \
  ORRERY_ASSIGN_OR_RETURN_IMPL(ORRERY_STATUS_CONCAT(orrery_statusor_, __LINE__), lhs, expr)
#define ORRERY_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                 \
  if (!tmp.ok()) return tmp.status();                \
  lhs = std::move(tmp).value()
