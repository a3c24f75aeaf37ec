#include "transport/frame_inbox.h"

#include "absl/strings/str_cat.h"

namespace ps {

absl::Status FrameInbox::ReadLoop() {
  absl::Status status;
  while (status.ok()) {
    status = socket_->AwaitReadable(absl::InfiniteFuture());  // a connection may rest
    absl::StatusOr<FrameHeader> h =
        status.ok() ? ReceiveHeader(*socket_, absl::InfiniteFuture()) : status;
    if (!h.ok()) {
      status = h.status();
      break;
    }
    if ((h->kind == FrameKind::kPushCall || h->kind == FrameKind::kPullCall ||
         h->kind == FrameKind::kChangeCall) &&
        on_call_ != nullptr && h->bytes <= kMaxCallBytes) {
      std::string payload(h->bytes, '\0');
      status = socket_->Receive(payload.data(), payload.size(), absl::InfiniteFuture());
      if (status.ok()) status = on_call_(h->kind, h->transfer, std::move(payload));
      continue;
    }
    if (h->kind == FrameKind::kAnswer && kind_ == FrameKind::kPull && h->bytes <= kMaxAnswerBytes) {
      status = ReadAnswer(*h);
      continue;
    }
    if (h->kind == FrameKind::kProceed && kind_ == FrameKind::kPull && h->bytes == 0) {
      absl::MutexLock lock(&mu_);
      auto it = expected_.find(AnswerKey(h->transfer));
      if (it != expected_.end() && it->second.answer != nullptr) it->second.proceed = true;
      continue;  // else its call gave up
    }
    if (h->kind != kind_ || h->bytes > max_bytes_) {
      status = absl::InvalidArgumentError(
          absl::StrCat("a frame of kind ", static_cast<int>(h->kind), " and ", h->bytes,
                       " bytes where one of kind ", static_cast<int>(kind_), " and at most ",
                       max_bytes_, " was due"));
      break;
    }
    Expected* taken = nullptr;
    {
      absl::MutexLock lock(&mu_);
      auto it = expected_.find(h->transfer);
      if (it != expected_.end() && it->second.state == State::kWaiting &&
          it->second.answer == nullptr) {
        taken = &it->second;  // stays put: its call waits until it is done
        taken->state = State::kFilling;
      }
    }
    if (taken == nullptr) {
      status = Discard(*socket_, h->bytes, absl::InfiniteFuture());
      continue;
    }
    absl::Status read = ReceiveValues(*socket_, h->bytes, taken->dst, taken->type,
                                      absl::InfiniteFuture(), [&](absl::Span<const float> run) {
                                        taken->on_read(run);
                                        absl::MutexLock lock(&mu_);
                                        taken->in += run.size();
                                      });
    // A frame of the wrong size fails its call only: it was read whole. Anything else ends the
    // connection, before its call learns of it (so that it finds the connection ended).
    if (read.code() != absl::StatusCode::kInvalidArgument) status = read;
    absl::MutexLock lock(&mu_);
    if (!status.ok()) ended_ = true;
    taken->state = State::kDone;
    taken->status = read;
  }
  End();
  return status;
}

absl::Status FrameInbox::ReadAnswer(const FrameHeader& h) {
  std::string answer(h.bytes, '\0');
  if (absl::Status s = socket_->Receive(answer.data(), answer.size(), absl::InfiniteFuture());
      !s.ok()) {
    return s;
  }
  absl::MutexLock lock(&mu_);
  auto it = expected_.find(AnswerKey(h.transfer));
  if (it == expected_.end() || it->second.state != State::kWaiting ||
      it->second.answer == nullptr) {
    return absl::OkStatus();  // its call gave up
  }
  *it->second.answer = std::move(answer);
  it->second.state = State::kDone;
  return absl::OkStatus();
}

absl::Status FrameInbox::ReadCallValues(uint64_t transfer, absl::Span<float> dst, WireType type,
                                        ValuesSeen seen, absl::Time deadline, ValuesOrder order) {
  absl::StatusOr<FrameHeader> h = ReceiveHeader(*socket_, deadline);
  absl::Status status = h.status();
  if (status.ok() && (h->kind != kind_ || h->transfer != transfer || h->bytes > max_bytes_)) {
    status =
        absl::DataLossError(absl::StrCat("a frame of kind ", static_cast<int>(h->kind),
                                         " where the tensor of push call ", transfer, " was due"));
  }
  if (status.ok()) {
    status = ReceiveValues(*socket_, h->bytes, dst, type, deadline, seen, order);
  }
  if (!status.ok() && status.code() != absl::StatusCode::kInvalidArgument) End();
  return status;
}

absl::StatusOr<bool> FrameInbox::AwaitProceed(uint64_t transfer, absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  const Expected& e = expected_.at(AnswerKey(transfer));
  auto news = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return e.proceed || e.state == State::kDone || ended_;
  };
  mu_.AwaitWithDeadline(absl::Condition(&news), deadline);
  if (e.proceed) return true;
  if (e.state == State::kDone) return false;
  if (ended_)
    return absl::UnavailableError("the data plane connection ended before the call was let in");
  return absl::DeadlineExceededError("the shard did not let the push call in in time");
}

absl::Status FrameInbox::ExpectAnswer(uint64_t transfer, std::string* answer) {
  absl::MutexLock lock(&mu_);
  if (ended_) return absl::FailedPreconditionError("the data plane connection ended");
  Expected e{{}, WireType::kFloat32, IgnoreValues, State::kWaiting, 0, absl::OkStatus(), answer};
  if (!expected_.emplace(AnswerKey(transfer), std::move(e)).second) {
    return absl::InvalidArgumentError("an answer already expected on this connection");
  }
  return absl::OkStatus();
}

absl::Status FrameInbox::Expect(uint64_t transfer, absl::Span<float> dst, WireType type,
                                ValuesSeen on_read) {
  absl::MutexLock lock(&mu_);
  if (ended_) return absl::FailedPreconditionError("the data plane connection ended");
  if (!expected_
           .emplace(transfer, Expected{dst, type, on_read, State::kWaiting, 0, absl::OkStatus()})
           .second) {
    return absl::InvalidArgumentError("a transfer id already in use on this connection");
  }
  return absl::OkStatus();
}

absl::Status FrameInbox::Await(uint64_t transfer, absl::Time deadline, ValuesSeen seen) {
  size_t told = 0;  // values `seen` was told of
  for (;;) {
    absl::Span<const float> run;  // in place, and written no more
    {
      absl::MutexLock lock(&mu_);
      Expected& e = expected_.at(transfer);
      auto news = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return e.in > told || e.state == State::kDone || (ended_ && e.state == State::kWaiting);
      };
      const bool woke = mu_.AwaitWithDeadline(absl::Condition(&news), deadline);
      const bool failed = e.state == State::kDone && !e.status.ok();
      if (woke && e.in > told && !failed) {
        run = absl::Span<const float>(e.dst).subspan(told, e.in - told);
      } else if (woke || e.state == State::kWaiting) {
        absl::Status status =
            e.state == State::kDone ? e.status
            : ended_
                ? absl::UnavailableError("the data plane connection ended before the tensor came")
                : absl::DeadlineExceededError("the tensor did not come on the data plane in time");
        expected_.erase(transfer);
        return status;
      } else {
        break;  // given up mid-tensor
      }
    }
    seen(run);
    told += run.size();
  }
  // The connection ends, so that ReadLoop stops writing into the tensor's place.
  End();
  absl::MutexLock lock(&mu_);
  Expected& e = expected_.at(transfer);
  auto filled = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return e.state == State::kDone; };
  mu_.Await(absl::Condition(&filled));
  expected_.erase(transfer);
  return absl::DeadlineExceededError("the tensor was still coming at the call's deadline");
}

void FrameInbox::End() {
  socket_->Shutdown();
  absl::MutexLock lock(&mu_);
  ended_ = true;
}

bool FrameInbox::ended() const {
  absl::MutexLock lock(&mu_);
  return ended_;
}

absl::Status ExpectStriped(absl::Span<FrameInbox* const> lanes, uint64_t transfer,
                           absl::Span<float> dst, WireType type, ValuesSeen on_read, int from) {
  const int parts = StripeCount(dst.size(), type, static_cast<int>(lanes.size()));
  for (int i = from; i < parts; ++i) {
    const Stripe part = StripeOf(dst.size(), parts, i);
    if (absl::Status s =
            lanes[i]->Expect(transfer, dst.subspan(part.offset, part.size), type, on_read);
        !s.ok()) {
      for (int j = from; j < i; ++j) lanes[j]->Await(transfer, absl::InfinitePast()).IgnoreError();
      return s;
    }
  }
  return absl::OkStatus();
}

absl::Status AwaitStriped(absl::Span<FrameInbox* const> lanes, uint64_t transfer, size_t values,
                          WireType type, absl::Time deadline, ValuesSeen seen, int from) {
  const int parts = StripeCount(values, type, static_cast<int>(lanes.size()));
  absl::Status first;
  for (int i = from; i < parts; ++i) {
    absl::Status s = lanes[i]->Await(transfer, deadline, parts == 1 ? seen : IgnoreValues);
    if (!s.ok() && first.ok()) {
      first = s;
      // A lane that ended (cut, or given up mid-part) ends the others, whose parts would not
      // come; a part forgotten before it came, or of the wrong size, leaves the lanes be.
      if (lanes[i]->ended()) {
        for (FrameInbox* lane : lanes) lane->End();
      }
    }
  }
  return first;
}

}  // namespace ps
