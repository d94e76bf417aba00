// CPU implementation of the Ascend C API subset: GlobalTensor, LocalTensor, TPipe, TQue, TBuf.
// Local tensors live in per-core buffers whose sizes TPipe::InitBuffer checks against the core's
// capacities; every local tensor carries the generation of its buffer, so a use after FreeTensor is
// caught, and queues check that AllocTensor / EnQue / DeQue / FreeTensor come in order.
#ifndef MS_ATB_ASCENDC_SIM_TENSOR_H_
#define MS_ATB_ASCENDC_SIM_TENSOR_H_

#include <deque>
#include <cstring>
#include <memory>

#include "sim_core.h"

namespace AscendC {

template <typename T>
class GlobalTensor {
 public:
  // buffer: bufferSize elements of a global tensor the runner registered.
  void SetGlobalBuffer(__gm__ T *buffer, uint64_t bufferSize) {
    uint64_t offset;
    GmRegion(buffer, bufferSize * sizeof(T), &offset);
    base_ = buffer;
    size_ = bufferSize;
  }
  GlobalTensor operator[](uint64_t offset) const {
    SIM_REQUIRE(offset <= size_, "global memory access",
                "offset " + std::to_string(offset) + " past a global tensor of " + std::to_string(size_) + " elements");
    GlobalTensor t;
    t.base_ = base_ + offset;
    t.size_ = size_ - offset;
    return t;
  }
  T GetValue(uint64_t i) const { return *Element(i); }
  void SetValue(uint64_t i, T v) const { *Element(i) = v; }
  uint64_t GetSize() const { return size_; }
  // For DataCopy only: count elements from the start, checked against the tensor and the registry.
  T *Span(uint64_t count, uint64_t *region_offset) const {
    SIM_REQUIRE(base_ != nullptr, "global memory access", "a GlobalTensor used before SetGlobalBuffer");
    SIM_REQUIRE(count <= size_, "global memory access",
                "a copy of " + std::to_string(count) + " elements from a global tensor of " + std::to_string(size_));
    GmRegion(base_, count * sizeof(T), region_offset);
    return base_;
  }

 private:
  T *Element(uint64_t i) const {
    uint64_t offset;
    return Span(i + 1, &offset) + i;
  }
  T *base_ = nullptr;
  uint64_t size_ = 0;
};

// Scalar writes to global memory reach it without a cache on the CPU: nothing to flush.
template <typename T, CacheLine line, DcciDst dst>
inline void DataCacheCleanAndInvalid(const GlobalTensor<T> &) {}

// One buffer of a queue or TBuf: host memory standing for a range of a core's local memory.
struct BufferSlot {
  enum State { kFree, kAllocated, kQueued, kDequeued };
  std::unique_ptr<uint8_t[]> data;
  uint64_t address = 0;  // byte address inside its local memory (unified buffer, L1, ...)
  uint32_t bytes = 0;
  TPosition position = TPosition::VECCALC;  // where the buffer lives (unified buffer, L1, L0A, L0B, L0C)
  uint64_t generation = 0;
  State state = kFree;
  const void *owner = nullptr;
};

// A view of a buffer. It holds the buffer's generation at allocation: once FreeTensor gives the buffer
// back (the generation moves on), every use of the view is caught. Buffers outlive their views (the
// queues and TBufs own them for the whole kernel), so a view keeps a plain pointer.
template <typename T>
class LocalTensor {
 public:
  LocalTensor() = default;
  LocalTensor(BufferSlot *slot, uint64_t generation, uint32_t offset, uint32_t size)
      : slot_(slot), generation_(generation), offset_(offset), size_(size) {}

  LocalTensor operator[](uint32_t offset) const {
    Check(offset, 0);
    return LocalTensor(slot_, generation_, offset_ + offset, size_ - offset);
  }
  T GetValue(uint32_t i) const { return Data(i, 1)[0]; }
  void SetValue(uint32_t i, T v) const { Data(i, 1)[0] = v; }
  uint32_t GetSize() const { return size_; }
  template <typename U>
  LocalTensor<U> ReinterpretCast() const {
    Check(0, 0);
    SIM_REQUIRE(offset_ * sizeof(T) % sizeof(U) == 0, "local bounds", "ReinterpretCast to a misaligned element");
    return LocalTensor<U>(slot_, generation_, offset_ * sizeof(T) / sizeof(U), size_ * sizeof(T) / sizeof(U));
  }
  // count elements from element i, after the liveness and bounds checks.
  T *Data(uint32_t i, uint32_t count) const {
    Check(i, count);
    return reinterpret_cast<T *>(slot_->data.get()) + offset_ + i;
  }
  uint64_t Generation() const { return generation_; }
  uint64_t Address() const { return slot_->address + static_cast<uint64_t>(offset_) * sizeof(T); }
  TPosition GetPosition() const { return slot_->position; }
  BufferSlot *Slot() const { return slot_; }

 private:
  void Check(uint32_t i, uint32_t count) const {
    if (slot_ != nullptr && slot_->generation == generation_ && slot_->state != BufferSlot::kFree &&
        slot_->state != BufferSlot::kQueued && static_cast<uint64_t>(i) + count <= size_)
      return;
    SIM_REQUIRE(slot_ != nullptr, "use after FreeTensor", "a LocalTensor that was never allocated");
    SIM_REQUIRE(slot_->generation == generation_ && slot_->state != BufferSlot::kFree, "use after FreeTensor",
                "a LocalTensor used after FreeTensor gave its buffer back");
    SIM_REQUIRE(slot_->state != BufferSlot::kQueued, "queue discipline", "a LocalTensor used between EnQue and DeQue");
    throw RuleViolation("local bounds", "elements [" + std::to_string(i) + ", " + std::to_string(i + count) +
                                            ") of a local tensor of " + std::to_string(size_));
  }
  BufferSlot *slot_ = nullptr;
  uint64_t generation_ = 0;
  uint32_t offset_ = 0, size_ = 0;
};

inline const char *MemoryName(TPosition pos) {
  switch (pos) {
    case TPosition::A1: case TPosition::B1: return "L1";
    case TPosition::A2: return "L0A";
    case TPosition::B2: return "L0B";
    case TPosition::CO1: return "L0C";
    default: return "unified buffer";
  }
}
inline bool InMemory(TPosition pos, const char *name) { return std::strcmp(MemoryName(pos), name) == 0; }

class TQueBase {
 public:
  explicit TQueBase(TPosition pos, int depth) : pos_(pos), depth_(depth) {}
  TQueBase(const TQueBase &) = delete;
  ~TQueBase() {
    for (const auto &s : slots_) {
      if (s->state == BufferSlot::kQueued && Sim().deferred_error.empty())
        Sim().deferred_error = RuleViolation("queue discipline", "a tensor was EnQue'd and never DeQue'd").what();
      else if (s->state != BufferSlot::kFree && Sim().deferred_error.empty())
        Sim().deferred_error = RuleViolation("queue discipline", "an AllocTensor without FreeTensor").what();
    }
  }
  template <typename T>
  LocalTensor<T> AllocTensor() {
    for (auto &s : slots_)
      if (s->state == BufferSlot::kFree) {
        s->state = BufferSlot::kAllocated;
        return LocalTensor<T>(s.get(), s->generation, 0, s->bytes / sizeof(T));
      }
    throw RuleViolation("queue discipline", "AllocTensor with all " + std::to_string(slots_.size()) +
                                                " buffers of the queue in use (a tensor was not freed)");
  }
  template <typename T>
  void EnQue(const LocalTensor<T> &t) {
    auto &s = Own(t, "EnQue");
    SIM_REQUIRE(s->state == BufferSlot::kAllocated, "queue discipline", "EnQue of a tensor not freshly allocated");
    SIM_REQUIRE(static_cast<int>(fifo_.size()) < depth_, "queue discipline", "EnQue beyond the queue's depth");
    s->state = BufferSlot::kQueued;
    fifo_.push_back(s);
  }
  template <typename T>
  LocalTensor<T> DeQue() {
    SIM_REQUIRE(!fifo_.empty(), "queue discipline", "DeQue of an empty queue (no EnQue before it)");
    auto s = fifo_.front();
    fifo_.pop_front();
    s->state = BufferSlot::kDequeued;
    return LocalTensor<T>(s.get(), s->generation, 0, s->bytes / sizeof(T));
  }
  template <typename T>
  void FreeTensor(const LocalTensor<T> &t) {
    auto &s = Own(t, "FreeTensor");
    SIM_REQUIRE(s->state != BufferSlot::kQueued, "queue discipline", "FreeTensor of a tensor still in the queue");
    SIM_REQUIRE(s->state != BufferSlot::kFree, "use after FreeTensor", "FreeTensor of a tensor already freed");
    s->state = BufferSlot::kFree;
    ++s->generation;
  }
  void AddSlot(std::shared_ptr<BufferSlot> s) { slots_.push_back(std::move(s)); }
  TPosition Position() const { return pos_; }

 private:
  template <typename T>
  std::shared_ptr<BufferSlot> &Own(const LocalTensor<T> &t, const char *what) {
    for (auto &s : slots_)
      if (s.get() == t.Slot()) {
        SIM_REQUIRE(s->generation == t.Generation(), "use after FreeTensor",
                    std::string(what) + " of a tensor whose buffer was freed");
        return s;
      }
    throw RuleViolation("queue discipline", std::string(what) + " of a tensor that belongs to another queue");
  }
  TPosition pos_;
  int depth_;
  std::vector<std::shared_ptr<BufferSlot>> slots_;
  std::deque<std::shared_ptr<BufferSlot>> fifo_;
};

template <TPosition pos, int32_t depth>
class TQue : public TQueBase {
 public:
  TQue() : TQueBase(pos, depth) {}
};

// A queue between two positions with no compute in between (copy-in straight to copy-out).
template <TPosition src, TPosition dst, int32_t depth>
class TQueBind : public TQueBase {
 public:
  TQueBind() : TQueBase(src, depth) {}
};

template <TPosition pos>
class TBuf {
 public:
  template <typename T>
  LocalTensor<T> Get() const { return LocalTensor<T>(slot_.get(), slot_->generation, 0, slot_->bytes / sizeof(T)); }
  template <typename T>
  LocalTensor<T> Get(uint32_t count) const {
    SIM_REQUIRE(count * sizeof(T) <= slot_->bytes, "local bounds", "TBuf::Get beyond the buffer");
    return LocalTensor<T>(slot_.get(), slot_->generation, 0, count);
  }
  void SetSlot(std::shared_ptr<BufferSlot> s) { slot_ = std::move(s); }

 private:
  std::shared_ptr<BufferSlot> slot_;
};

// The buffers of one core. Every InitBuffer takes its bytes (rounded up to 32) from the memory its
// position names; the sum over a core must fit that memory's capacity.
class TPipe {
 public:
  TPipe() = default;
  TPipe(const TPipe &) = delete;
  template <class Que>
  void InitBuffer(Que &que, uint8_t num, uint32_t len) {
    for (uint8_t i = 0; i < num; ++i) que.AddSlot(NewSlot(que.Position(), len));
  }
  template <TPosition pos>
  void InitBuffer(TBuf<pos> &buf, uint32_t len) {
    buf.SetSlot(NewSlot(pos, len));
    buf.template Get<uint8_t>().Slot()->state = BufferSlot::kAllocated;
  }
  uint64_t Used(const char *memory) const {
    for (const auto &u : used_) if (u.first == memory) return u.second;
    return 0;
  }

 private:
  std::shared_ptr<BufferSlot> NewSlot(TPosition pos, uint32_t len) {
    const char *memory = MemoryName(pos);
    const CoreCapacity &c = Sim().capacity;
    uint64_t capacity = InMemory(pos, "L1") ? c.l1 : InMemory(pos, "L0A") ? c.l0a
                      : InMemory(pos, "L0B") ? c.l0b : InMemory(pos, "L0C") ? c.l0c : c.ub;
    SIM_REQUIRE(len > 0, "capacity", "InitBuffer of 0 bytes");
    const bool cube = !InMemory(pos, "unified buffer");
    const CoreType need = cube ? CoreType::kAic : CoreType::kAiv;
    if (Sim().core_type != need)
      RequireCore(need, (std::string("InitBuffer of ") + memory +
                         (cube ? " (a Cube buffer)" : " (a vector core's buffer)")).c_str());
    uint64_t bytes = (len + kBlockBytes - 1) / kBlockBytes * kBlockBytes;
    uint64_t *used = nullptr;
    for (auto &u : used_) if (u.first == memory) used = &u.second;
    if (used == nullptr) {
      used_.push_back({memory, 0});
      used = &used_.back().second;
    }
    SIM_REQUIRE(*used + bytes <= capacity, "capacity",
                std::string("InitBuffers of one core ask for ") + std::to_string(*used + bytes) + " bytes of " + memory +
                    ", which holds " + std::to_string(capacity));
    auto s = std::make_shared<BufferSlot>();
    s->data.reset(new uint8_t[bytes]);
    std::memset(s->data.get(), 0xff, bytes);  // NaN in every float type: reading unwritten memory shows
    s->address = *used;
    s->position = pos;
    s->bytes = static_cast<uint32_t>(bytes);
    *used += bytes;
    return s;
  }
  std::vector<std::pair<std::string, uint64_t>> used_;
};

}  // namespace AscendC

#endif  // MS_ATB_ASCENDC_SIM_TENSOR_H_
