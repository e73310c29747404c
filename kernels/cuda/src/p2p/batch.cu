// Point-to-point within a node (core/src/p2p/gpu.rs): one launch runs one batch of sends and
// receives (an NCCL group), every operation progressed together.
//
// extern "C" __global__ void p2p_batch(P2pArgs args);        // up to P2P_MAX_OPS operations
// extern "C" __global__ void p2p_batch_small(P2pArgsSmall args);  // up to P2P_SMALL_OPS: the
//   same code with a 240-byte argument block instead of 3 KiB (a launch copies its arguments).
// extern "C" __global__ void p2p_ll(P2pArgsSmall args);  // (p2p_ll_big: P2pArgs) every op an LL message (or a copy to
//   self of at most P2P_LL_MAX bytes): one block per (peer, direction) pair, each thread waits
//   for its own packets (llBatch below); the host picks it (core/src/p2p/gpu.rs, `Plan::ll`).
// extern "C" __global__ void p2p_a2a_direct(P2pA2aArgs args);  // a captured all-to-all whose
//   receive buffers every rank registered: blocks written straight into the peers' (a2aDirect).
//
// Every rank owns one buffer (`base`, mapped by every peer of the node; same layout everywhere,
// P2pLayout below): counters, then two LL buffers per sending peer, then the space of
// args.ringSlots slots of (16-byte header + CHUNK payload) per sending peer: one ring per channel
// (args.channels) of args.slots slots of (16-byte header + args.maxChunk payload), where
// channels x slots x (maxChunk / CHUNK) = ringSlots (64 unless MSCCLPP_P2P_TUNE sets `ring`).
//
// Small messages (at most P2P_LL_MAX bytes) travel as LL16 packets (mscclpp/packet_device.hpp:
// 8 data bytes and the flag twice in one 16-byte store), no signal and no fence: message n of a
// (sender -> receiver) pair (n = llSent / llRecvd, device counters since the buffers were created)
// goes to LL buffer n % 2 of the receiver with flag n + 1: packet 0 = {bytes, magic}, packet
// 1 + i = bytes [8i, 8i + 8). The receiver copies out once every packet carries the flag and
// stores llConsumed = n + 1 in the sender's buffer; the sender writes message n only once
// llConsumed >= n - 1 (message n - 2, the buffer's last user, was read), normally long true, so
// a message that fits costs one one-way trip. Flags come from the monotonic counters, so a
// captured graph replays correctly.
//
// Larger messages are cut into chunks of chunkOf(bytes) (a quarter of a channel's share, a
// multiple of 4 KiB, clamped to [P2P_MIN_CHUNK, args.maxChunk]); chunk i goes to channel i % nch
// (nch = min(args.channels, chunks), computed alike on both sides: every rank's args.channels
// is the same, the host checks at setup).
// Per (sender -> receiver, channel), counters count chunks since the buffers were created
// (monotonic, device-only, so a captured graph replays correctly):
//   sender:   n = sent[r][c]; waits until n - consumed[r][c] < slots (consumed: written by the
//             receiver into the sender's buffer), writes header {total bytes, chunk index, magic}
//             + payload into the receiver's slot n % slots, and after a block barrier one thread
//             stores ready[me][c] = n + 1 in the receiver's buffer (release, system scope; no
//             separate fence), sent = n + 1.
//   receiver: n = recvd[s][c]; waits until ready[s][c] > n (acquire), copies the payload out
//             and checks the header beside it (a total that differs from its own size is an
//             error), stores consumed[me][c] = n + 1 in the sender's buffer (release), recvd =
//             n + 1.
// Both ends poll only when the last poll's count is used up: ready - n chunks (receiver) or
// slots - (n - consumed) free slots (sender) go without another poll.
// Tasks (op, channel) are owned by block (op.pair + channel * npairs) % gridDim.x, or packed
// (P2P_TUNE_PACKED) (first block of the pair + channel) % gridDim.x (the host launches
// min(tasks, its block limit) blocks: a 1 KiB exchange runs on two):
// the ops of one (peer, direction) pair share the blocks of their channels, so a channel of a
// later op only starts once the same channel of the op before it (op.pred, same pair) is done:
// per (peer, direction) order as NCCL specifies. A block polls all of its tasks round-robin
// without blocking on any of them, so matched sends and receives complete in any order.
// Copies to this rank itself (an all-to-all's own block) run in the launch too, beside the
// transfers: a send to self at op k is followed by its receive at op k + 1; the send's tasks
// copy chunk by chunk, over up to 2 * channels virtual channels: even ones on the blocks of
// op k's pair, odd ones on those of op k + 1's (which have nothing else to do). Copies to self
// are not ordered among themselves (their buffers are the caller's, distinct in practice).
// In place: a receive into the very buffer a send of this launch to the same peer reads (same
// address and size: an in-place all-to-all's block) gets that send's pair from the host (same
// blocks) and writes chunk j of a channel only after the send has read its chunk j there (LL:
// after the send); both ends cut the message alike, so this never waits in a circle.
// A block that makes no progress for `timeoutNs` records an error in the buffer's error words
// (kind, peer, detail) and their host-mapped copy, prints it and returns; a launch finding the
// error word set returns at once (the host reads the copy at its next call, without waiting).
#include <mscclpp/atomic_device.hpp>
#include <mscclpp/device.hpp>
#include <mscclpp/packet_device.hpp>

#define P2P_MAX_OPS 128
#define P2P_SMALL_OPS 8
#define P2P_MAX_CHANNELS 32  // counters per (sender, receiver) pair; args.channels <= this
#define P2P_CHUNK (128 * 1024)
#define P2P_MIN_CHUNK P2P_CHUNK  // = MIN_CHUNK in core/src/p2p/gpu.rs (why: there)
#define P2P_HEADER 16
#define P2P_SLOT_BYTES (P2P_CHUNK + P2P_HEADER)
#define P2P_MAGIC 0x3250434eu  // "NCP2"
#define P2P_THREADS 512
#define P2P_LL_MAX (16 * 1024)
#define P2P_LL_BUF_BYTES ((1 + P2P_LL_MAX / 8) * 16)  // header packet + data packets
#define P2P_A2A_MAX_RANKS 16   // the direct all-to-all's most ranks (receive buffers by value)
#define P2P_A2A_MAX_BLOCKS 64  // and most blocks (its words per sender in the layout)

/// struct P2pOpDev (core/src/p2p/gpu.rs), 24 bytes.
struct P2pOpDev {
  uint64_t buf;
  uint64_t bytes;
  uint16_t peer;
  uint8_t recv;  // 0 send, 1 receive
  uint8_t pad;
  int16_t pred;   // the previous op of the same (peer, direction) in this launch, -1 if none
  uint16_t pair;  // index of the (peer, direction) pair (block assignment)
};

/// struct Args<N> (core/src/p2p/gpu.rs).
template <int N>
struct P2pArgsN {
  static constexpr int kMaxOps = N;
  uint64_t base;              // this rank's buffer
  const uint64_t* peerBases;  // [nranks] every rank's buffer mapped here (own at rank)
  uint64_t* hostErr;          // [2] host-mapped copy of the error words (read by the host)
  uint64_t timeoutNs;
  uint32_t nops;
  uint32_t rank;
  uint32_t nranks;
  uint32_t npairs;  // (peer, direction) pairs of the ops (block assignment)
  uint32_t flags;     // P2P_TUNE_* bits (MSCCLPP_P2P_TUNE)
  uint32_t channels;  // most channels per message (every rank the same; a power of 2, <= 32)
  uint32_t slots;     // slots per channel's ring: ringSlots / (channels * maxChunk / P2P_CHUNK)
  uint32_t abortPoll;  // the batch loop reads the host's abort word every abortPoll idle rounds
  uint32_t maxChunk;   // the largest chunk: m * P2P_CHUNK (m = 1, 2, 4 or 8)
  uint32_t slotBytes;  // a slot: P2P_HEADER + maxChunk
  uint32_t ringSlots;  // the ring space per sender, in slots of P2P_SLOT_BYTES (the same on every rank)
  uint32_t pad;
  P2pOpDev ops[N];
};
using P2pArgs = P2pArgsN<P2P_MAX_OPS>;
#define P2P_TUNE_FENCE 1u         // a system fence before each chunk's release store (round 5's)
#define P2P_TUNE_UNROLL4 2u       // 4 loads in flight per thread in chunk copies instead of 8
#define P2P_TUNE_NO_SELF_SPREAD 4u  // copies to self over their own pair's channels only
#define P2P_TUNE_PACKED 8u        // task (pair, ch) on block (firstBlock[pair] + ch) % blocks
using P2pArgsSmall = P2pArgsN<P2P_SMALL_OPS>;
// The host's mirror (core/src/p2p/gpu.rs `Args<N>`) asserts the same sizes.
static_assert(sizeof(P2pOpDev) == 24, "P2pOpDev: 24 bytes, as OpDev in gpu.rs");
static_assert(sizeof(P2pArgs) == 80 + 24 * P2P_MAX_OPS, "P2pArgs: an 80-byte head, as Args in gpu.rs");
static_assert(sizeof(P2pArgsSmall) == 80 + 24 * P2P_SMALL_OPS, "P2pArgsSmall: as Args<SMALL_OPS> in gpu.rs");

/// struct A2aArgs (core/src/p2p/gpu.rs): the direct all-to-all (p2p_a2a_direct below).
struct P2pA2aArgs {
  uint64_t base;              // this rank's buffer
  const uint64_t* peerBases;  // [nranks] every rank's buffer mapped here
  uint64_t* hostErr;          // [2] host-mapped copy of the error words
  uint64_t timeoutNs;
  uint64_t send;  // this rank's send buffer: block p (of `per` bytes) goes to rank p
  uint64_t per;
  uint32_t rank;
  uint32_t nranks;
  uint64_t recv[P2P_A2A_MAX_RANKS];  // every rank's receive buffer as mapped here (own at rank)
};
static_assert(sizeof(P2pA2aArgs) == 56 + 8 * P2P_A2A_MAX_RANKS, "P2pA2aArgs: as A2aArgs in gpu.rs");

namespace {

struct P2pLayout {
  uint64_t n;  // nranks
  MSCCLPP_DEVICE_INLINE uint64_t ready(uint64_t sender, uint64_t c) const { return (sender * P2P_MAX_CHANNELS + c) * 8; }
  MSCCLPP_DEVICE_INLINE uint64_t consumed(uint64_t receiver, uint64_t c) const {
    return (n + receiver) * P2P_MAX_CHANNELS * 8 + c * 8;
  }
  MSCCLPP_DEVICE_INLINE uint64_t sent(uint64_t peer, uint64_t c) const {
    return (2 * n + peer) * P2P_MAX_CHANNELS * 8 + c * 8;
  }
  MSCCLPP_DEVICE_INLINE uint64_t recvd(uint64_t peer, uint64_t c) const {
    return (3 * n + peer) * P2P_MAX_CHANNELS * 8 + c * 8;
  }
  MSCCLPP_DEVICE_INLINE uint64_t llSent(uint64_t peer) const { return 4 * n * P2P_MAX_CHANNELS * 8 + peer * 8; }
  MSCCLPP_DEVICE_INLINE uint64_t llRecvd(uint64_t peer) const { return 4 * n * P2P_MAX_CHANNELS * 8 + (n + peer) * 8; }
  MSCCLPP_DEVICE_INLINE uint64_t llConsumed(uint64_t receiver) const {
    return 4 * n * P2P_MAX_CHANNELS * 8 + (2 * n + receiver) * 8;
  }
  MSCCLPP_DEVICE_INLINE uint64_t error() const { return 4 * n * P2P_MAX_CHANNELS * 8 + 3 * n * 8; }
  /// The direct all-to-all's word of block b of `sender` (written by the sender: 2k + 1 when
  /// its launch k started, 2k + 2 when its writes into this rank's buffer are done).
  MSCCLPP_DEVICE_INLINE uint64_t a2a(uint64_t sender, uint64_t b) const {
    return error() + 64 + (sender * P2P_A2A_MAX_BLOCKS + b) * 8;
  }
  /// Direct all-to-all launches block b of this rank ran so far (only that block writes it).
  MSCCLPP_DEVICE_INLINE uint64_t a2aSeq(uint64_t b) const { return a2a(n, 0) + b * 8; }
  MSCCLPP_DEVICE_INLINE uint64_t ll(uint64_t sender, uint64_t k) const {
    return (a2aSeq(P2P_A2A_MAX_BLOCKS) + 4095) / 4096 * 4096 + (sender * 2 + k) * (uint64_t)P2P_LL_BUF_BYTES;
  }
  MSCCLPP_DEVICE_INLINE uint64_t rings() const { return (ll(n, 0) + 4095) / 4096 * 4096; }
  /// Slot k of channel c's ring of messages from `sender` (`slots` slots of `slotBytes` per
  /// channel, inside the sender's ringSlots * P2P_SLOT_BYTES).
  template <class A>
  MSCCLPP_DEVICE_INLINE uint64_t slot(const A& a, uint64_t sender, uint64_t c, uint64_t k) const {
    return rings() + sender * a.ringSlots * (uint64_t)P2P_SLOT_BYTES + (c * a.slots + k) * (uint64_t)a.slotBytes;
  }
};

MSCCLPP_DEVICE_INLINE uint64_t nowNs() {
#if defined(MSCCLPP_DEVICE_HIP)
  return wall_clock64() * 10;  // 100 MHz constant clock
#else
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
#endif
}

/// How messages are cut (the same on every rank): at most `most` channels, chunks of at most
/// `maxChunk` bytes (args.channels, args.maxChunk).
struct P2pCut {
  uint32_t most;
  uint64_t maxChunk;
};

/// Chunk bytes of a chunked message (above P2P_LL_MAX): a quarter of its share of `most`
/// channels (each channel gets 4 chunks or more before chunks grow), a multiple of 4 KiB,
/// clamped to [P2P_MIN_CHUNK, maxChunk]; both ends compute it from the size alike.
MSCCLPP_DEVICE_INLINE uint64_t chunkOf(uint64_t bytes, const P2pCut& t) {
  const uint64_t c = (bytes / (4 * (uint64_t)t.most)) & ~(uint64_t)4095;
  return c < P2P_MIN_CHUNK ? P2P_MIN_CHUNK : c > t.maxChunk ? t.maxChunk : c;
}
/// A message of at most P2P_LL_MAX bytes travels as one LL message (one task, channel 0).
MSCCLPP_DEVICE_INLINE uint64_t chunksOf(uint64_t bytes, const P2pCut& t) {
  return bytes <= P2P_LL_MAX ? 1 : (bytes + chunkOf(bytes, t) - 1) / chunkOf(bytes, t);
}
/// Channels of a message: one per chunk, at most t.most.
MSCCLPP_DEVICE_INLINE uint32_t channelsOf(uint64_t bytes, const P2pCut& t) {
  const uint64_t k = chunksOf(bytes, t);
  return k < t.most ? (uint32_t)k : t.most;
}
/// Chunks of a message on channel c of its channelsOf(bytes, t).
MSCCLPP_DEVICE_INLINE uint64_t chunksOn(uint64_t bytes, uint32_t c, const P2pCut& t) {
  const uint64_t k = chunksOf(bytes, t);
  const uint32_t nch = channelsOf(bytes, t);
  return c < nch ? (k - c + nch - 1) / nch : 0;
}

/// Block-wide copy of len bytes (16-byte vectors when both ends are aligned, kUnroll loads in
/// flight per thread).
template <int kUnroll>
MSCCLPP_DEVICE_INLINE void blockCopyN(char* dst, const char* src, uint64_t len) {
  uint64_t done = 0;
  if ((((uintptr_t)dst | (uintptr_t)src) & 15) == 0) {
    const uint64_t n = len / 16;
    uint4* d4 = reinterpret_cast<uint4*>(dst);
    const uint4* s4 = reinterpret_cast<const uint4*>(src);
    const uint64_t step = blockDim.x;
    uint64_t i = threadIdx.x;
    for (; i + (kUnroll - 1) * step < n; i += kUnroll * step) {
      uint4 r[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) r[u] = s4[i + u * step];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) d4[i + u * step] = r[u];
    }
    for (; i < n; i += step) d4[i] = s4[i];
    done = n * 16;
  }
  for (uint64_t i = done + threadIdx.x; i < len; i += blockDim.x) dst[i] = src[i];
}

/// blockCopyN with 8 loads in flight per thread, or 4 under P2P_TUNE_UNROLL4.
MSCCLPP_DEVICE_INLINE void blockCopy(char* dst, const char* src, uint64_t len, uint32_t flags) {
  if (flags & P2P_TUNE_UNROLL4) {
    blockCopyN<4>(dst, src, len);
  } else {
    blockCopyN<8>(dst, src, len);
  }
}

/// Bytes [off, off + 8) of a message of `len` bytes at `p` (zeros past the end) as a packet
/// payload; 8-byte loads when aligned.
MSCCLPP_DEVICE_INLINE uint2 loadPayload(const char* p, uint64_t off, uint64_t len) {
  if ((((uintptr_t)p + off) & 7) == 0 && off + 8 <= len) return *reinterpret_cast<const uint2*>(p + off);
  uint32_t w[2] = {0, 0};
  for (int i = 0; i < 8 && off + i < len; ++i) w[i / 4] |= (uint32_t)(uint8_t)p[off + i] << (8 * (i & 3));
  return make_uint2(w[0], w[1]);
}

/// The inverse of loadPayload: store the payload `v` at bytes [off, min(off + 8, len)).
MSCCLPP_DEVICE_INLINE void storePayload(char* p, uint64_t off, uint64_t len, uint2 v) {
  if ((((uintptr_t)p + off) & 7) == 0 && off + 8 <= len) {
    *reinterpret_cast<uint2*>(p + off) = v;
    return;
  }
  for (int i = 0; i < 8 && off + i < len; ++i) p[off + i] = (char)((i < 4 ? v.x : v.y) >> (8 * (i & 3)));
}

// Error kinds (error word: 1 << 63 | kind << 48 | dir << 40 | peer; detail word: see kind).
constexpr uint64_t kErrStall = 1;     // detail: the pending op index
constexpr uint64_t kErrSize = 2;      // detail: the size the sender announced
constexpr uint64_t kErrHeader = 3;    // detail: the header's chunk index / magic

template <class A>
MSCCLPP_DEVICE_INLINE void recordError(const A& a, uint64_t kind, uint64_t recv, uint64_t peer, uint64_t detail) {
  P2pLayout L{a.nranks};
  uint64_t* err = reinterpret_cast<uint64_t*>(a.base + L.error());
  const uint64_t word = (1ull << 63) | (kind << 48) | (recv << 40) | peer;
  // The first error of this rank's buffer is the one recorded and printed (several threads
  // of the LL kernel may find the same stall).
  if (atomicCAS((unsigned long long*)err, 0ull, (unsigned long long)word) != 0ull) return;
  err[1] = detail;
  a.hostErr[1] = detail;
  __threadfence_system();
  mscclpp::storeReleaseSys(a.hostErr, word);
  printf("mscclpp p2p: rank %u: %s rank %llu failed (kind %llu, detail %llu): %s\n", a.rank,
         recv ? "receive from" : "send to", (unsigned long long)peer, (unsigned long long)kind,
         (unsigned long long)detail,
         kind == kErrStall ? "no progress within the timeout: expected the peer to post the matching call"
         : kind == kErrSize ? "the sender's message size differs from this receive's"
                            : "malformed chunk header");
}

}  // namespace

namespace {

/// One attempt at LL message k (a send, or a receive whose packets all arrived): 1 done, 0 not
/// yet, -1 failed (recorded). Every thread of the block calls it.
template <class A>
MSCCLPP_DEVICE_INLINE int llStep(const A& a, const P2pOpDev& op, int* sErr) {
  P2pLayout L{a.nranks};
  const uint64_t base = a.base;
  const uint64_t peer = op.peer;
  const uint64_t npk = (op.bytes + 7) / 8;
  if (op.recv) {
    uint64_t* recvd = reinterpret_cast<uint64_t*>(base + L.llRecvd(peer));
    const uint64_t n = *recvd;  // this block alone writes it, before a barrier
    const uint32_t flag = (uint32_t)(n + 1);
    const mscclpp::LL16Packet* pk = reinterpret_cast<const mscclpp::LL16Packet*>(base + L.ll(peer, n & 1));
    bool ok = true;
    if (threadIdx.x == 0) {
      uint2 h;
      if (!pk[0].readOnce(flag, h)) {
        ok = false;
      } else if (h.x != (uint32_t)op.bytes || h.y != P2P_MAGIC) {
        recordError(a, h.y != P2P_MAGIC ? kErrHeader : kErrSize, 1, peer, h.y != P2P_MAGIC ? h.y : h.x);
        *sErr = 1;
      }
    }
    char* dst = reinterpret_cast<char*>(op.buf);
    for (uint64_t i = threadIdx.x; i < npk; i += blockDim.x) {
      uint2 v;
      if (pk[1 + i].readOnce(flag, v)) {
        storePayload(dst, i * 8, op.bytes, v);  // rewritten alike if this attempt fails
      } else {
        ok = false;
      }
    }
    if (!__syncthreads_and(ok)) return *sErr ? -1 : 0;
    if (*sErr) return -1;
    if (threadIdx.x == 0) {
      // Relaxed (no fence on the fast path): every packet read above has returned its value
      // (stored out before the barrier), so the sender's next use of the buffer cannot reach
      // those reads.
      mscclpp::storeRelaxedSys(reinterpret_cast<uint64_t*>(a.peerBases[peer] + L.llConsumed(a.rank)), n + 1);
      *recvd = n + 1;
    }
    return 1;
  }
  uint64_t* sent = reinterpret_cast<uint64_t*>(base + L.llSent(peer));
  const uint64_t n = *sent;
  const bool room = n < 2 || mscclpp::loadAcquireSys(reinterpret_cast<const uint64_t*>(base + L.llConsumed(peer))) + 1 >= n;
  if (!__syncthreads_and(room)) return 0;
  const uint32_t flag = (uint32_t)(n + 1);
  mscclpp::LL16Packet* pk = reinterpret_cast<mscclpp::LL16Packet*>(a.peerBases[peer] + L.ll(a.rank, n & 1));
  const char* src = reinterpret_cast<const char*>(op.buf);
  if (threadIdx.x == 0) pk[0].write((uint32_t)op.bytes, P2P_MAGIC, flag);
  for (uint64_t i = threadIdx.x; i < npk; i += blockDim.x) pk[1 + i].write(loadPayload(src, i * 8, op.bytes), flag);
  __syncthreads();  // every thread read `sent` above
  if (threadIdx.x == 0) *sent = n + 1;
  return 1;
}

template <class A>
MSCCLPP_DEVICE_INLINE void batch(const A& a) {
  __shared__ uint32_t prog[A::kMaxOps * P2P_MAX_CHANNELS];
  __shared__ int16_t after[A::kMaxOps];  // in place: the send whose buffer this receive overwrites
  // P2P_TUNE_PACKED: channels of each pair (pairs <= ops), then each pair's first block.
  __shared__ uint32_t pairWidth[A::kMaxOps];
  __shared__ uint32_t pairFirst[A::kMaxOps];
  __shared__ int sAvail;
  __shared__ int sStop;
  __shared__ int sErr;
  P2pLayout L{a.nranks};
  const uint64_t base = a.base;
  volatile uint64_t* errWord = reinterpret_cast<volatile uint64_t*>(base + L.error());
  for (uint32_t i = threadIdx.x; i < a.nops * P2P_MAX_CHANNELS; i += blockDim.x) prog[i] = 0;
  for (uint32_t k = threadIdx.x; k < a.nops; k += blockDim.x) {
    const P2pOpDev& op = a.ops[k];
    int16_t j = -1;
    if (op.recv) {
      for (uint32_t i = 0; i < a.nops; ++i) {
        const P2pOpDev& o = a.ops[i];
        if (!o.recv && o.peer == op.peer && o.buf == op.buf && o.bytes == op.bytes) {
          j = (int16_t)i;
          break;
        }
      }
    }
    after[k] = j;
  }
  const uint32_t G = gridDim.x;
  const uint32_t P = a.npairs;
  const uint32_t CH = a.channels;
  const P2pCut cut{a.channels, a.maxChunk};
  const uint32_t spread = (a.flags & P2P_TUNE_NO_SELF_SPREAD) ? 1 : 2;
  const bool packed = (a.flags & P2P_TUNE_PACKED) != 0;
  for (uint32_t i = threadIdx.x; i < P; i += blockDim.x) pairWidth[i] = 0;
  if (threadIdx.x == 0) {
    sStop = (*errWord != 0);
    sErr = 0;
  }
  __syncthreads();
  if (sStop) return;
  if (packed) {
    // The tasks of pair after pair on consecutive blocks (wrapping), so a launch with more
    // tasks than blocks gives each block tasks of different pairs (an all-to-all: its copy to
    // self beside a transfer). The host sizes the grid alike (gpu.rs `plan`).
    for (uint32_t k = threadIdx.x; k < a.nops; k += blockDim.x) {
      const P2pOpDev& op = a.ops[k];
      if (op.peer != a.rank) {
        atomicMax(&pairWidth[op.pair], channelsOf(op.bytes, cut));
      } else if (!op.recv) {
        const uint64_t K = chunksOf(op.bytes, cut);
        const uint32_t nv = (uint32_t)(K < spread * CH ? K : spread * CH);
        atomicMax(&pairWidth[op.pair], (nv + spread - 1) / spread);
        if (spread == 2) atomicMax(&pairWidth[a.ops[k + 1].pair], nv / 2);
      }
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      uint32_t sum = 0;
      for (uint32_t i = 0; i < P; ++i) {
        pairFirst[i] = sum;
        sum += pairWidth[i];
      }
    }
    __syncthreads();
  }
  uint64_t lastProgress = nowNs();
  uint32_t pendingOp = 0;
  uint32_t idle = 0;  // rounds without progress (thread 0): the abort word is read every abortPoll-th
  while (true) {
    bool allDone = true, progressed = false;
    for (uint32_t k = 0; k < a.nops; ++k) {
      const P2pOpDev& op = a.ops[k];
      if (op.recv && op.peer == a.rank) continue;  // done by its send (below)
      const bool self = op.peer == a.rank;
      const uint64_t K = chunksOf(op.bytes, cut);
      // A copy to self spreads its chunks over twice the channels (unless tuned off): even ones
      // on the blocks of its own pair, odd ones on those of its receive's pair (otherwise idle).
      const uint32_t nch = self ? (uint32_t)(K < spread * CH ? K : spread * CH) : channelsOf(op.bytes, cut);
      const uint64_t cs = op.bytes <= P2P_LL_MAX ? op.bytes : chunkOf(op.bytes, cut);
      for (uint32_t c = 0; c < nch; ++c) {
        const uint32_t side = self ? (c % spread) : 0;
        const uint32_t ch = self ? (c / spread) : c;
        const uint32_t pr0 = a.ops[k + side].pair;
        if ((packed ? pairFirst[pr0] + ch : pr0 + ch * P) % G != blockIdx.x) continue;
        const uint64_t total = (K - c + nch - 1) / nch;
        uint32_t* pr = &prog[(k + side) * P2P_MAX_CHANNELS + ch];
        if (*pr >= total) continue;
        allDone = false;
        pendingOp = k;
        const uint64_t peer = op.peer;
        if (self) {
          // A copy to this rank itself: the send (op k) copies into its receive (op k + 1,
          // placed there by the host), chunk by chunk, no protocol; the receive has no steps.
          const uint64_t j = *pr;
          const uint64_t off = (j * nch + c) * cs;
          const uint64_t len = op.bytes - off < cs ? op.bytes - off : cs;
          blockCopy(reinterpret_cast<char*>(a.ops[k + 1].buf + off), reinterpret_cast<const char*>(op.buf + off), len,
                    a.flags);
          __syncthreads();
          if (threadIdx.x == 0) *pr = (uint32_t)(j + 1);
          __syncthreads();
          progressed = true;
          continue;
        }
        // The last earlier op of the same pair with chunks on this channel must be done (its
        // own predecessors were done before it started).
        int pred = op.pred;
        while (pred >= 0 && chunksOn(a.ops[pred].bytes, c, cut) == 0) pred = a.ops[pred].pred;
        if (pred >= 0 && prog[pred * P2P_MAX_CHANNELS + c] < chunksOn(a.ops[pred].bytes, c, cut)) continue;
        const int dep = after[k];
        if (op.bytes <= P2P_LL_MAX) {
          if (dep >= 0 && prog[dep * P2P_MAX_CHANNELS] == 0) continue;
          const int r = llStep(a, op, &sErr);
          if (r < 0) return;
          if (r == 0) continue;
          if (threadIdx.x == 0) prog[k * P2P_MAX_CHANNELS] = 1;
          __syncthreads();
          progressed = true;
          continue;
        }
        // Chunks known ready (receive) or slots known free (send) from this task's last poll:
        // the next ones need no poll (one acquire load and two barriers less per chunk).
        uint64_t known = 0;
        while (prog[k * P2P_MAX_CHANNELS + c] < total) {
          const uint64_t j = prog[k * P2P_MAX_CHANNELS + c];
          // In place: the send must have read chunk j of this channel out of the buffer first.
          if (dep >= 0 && prog[dep * P2P_MAX_CHANNELS + c] <= j) break;
          const uint64_t idx = j * nch + c;  // chunk index in the message
          const uint64_t off = idx * cs;
          const uint64_t len = op.bytes - off < cs ? op.bytes - off : cs;
          uint64_t n = 0;
          if (op.recv) {
            uint64_t* recvd = reinterpret_cast<uint64_t*>(base + L.recvd(peer, c));
            if (known == 0) {
              if (threadIdx.x == 0) {
                n = *recvd;
                const uint64_t* ready = reinterpret_cast<const uint64_t*>(base + L.ready(peer, c));
                sAvail = (int)(mscclpp::loadAcquireSys(ready) - n);  // at most `slots`
              }
              __syncthreads();
              known = (uint64_t)sAvail;
              __syncthreads();
              if (known == 0) break;
            }
            --known;
            n = *recvd;  // every thread: this block alone writes it, before the barrier above
            const uint64_t slot = base + L.slot(a, peer, c, n % a.slots);
            // The header is checked beside the copy, not before it (one round trip less per
            // chunk): a bad one ends the launch with an error, whatever the copy wrote into this
            // receive's own buffer (within its `len` bytes).
            uint64_t tot = 0, w = 0;
            if (threadIdx.x == 0) {
              tot = reinterpret_cast<const uint64_t*>(slot)[0];
              w = reinterpret_cast<const uint64_t*>(slot)[1];
            }
            blockCopy(reinterpret_cast<char*>(op.buf + off), reinterpret_cast<const char*>(slot + P2P_HEADER), len,
                      a.flags);
            if (threadIdx.x == 0) {
              int ok = 1;
              if (tot != op.bytes) {
                recordError(a, kErrSize, 1, peer, tot);
                ok = -1;
              } else if ((uint32_t)(w >> 32) != P2P_MAGIC || (uint32_t)w != (uint32_t)idx) {
                recordError(a, kErrHeader, 1, peer, w);
                ok = -1;
              }
              sAvail = ok;
            }
            __syncthreads();
            if (sAvail < 0) return;  // every thread reads it before the chunk's last barrier
            if (threadIdx.x == 0) {
              // One release store (no extra fence unless tuned): it orders the block's reads
              // above (the barrier) before the sender may reuse the slot.
              if (a.flags & P2P_TUNE_FENCE) __threadfence_system();
              mscclpp::storeReleaseSys(reinterpret_cast<uint64_t*>(a.peerBases[peer] + L.consumed(a.rank, c)), n + 1);
              *recvd = n + 1;
            }
          } else {
            uint64_t* sent = reinterpret_cast<uint64_t*>(base + L.sent(peer, c));
            if (known == 0) {
              if (threadIdx.x == 0) {
                n = *sent;
                const uint64_t* consumed = reinterpret_cast<const uint64_t*>(base + L.consumed(peer, c));
                sAvail = (int)(a.slots - (n - mscclpp::loadAcquireSys(consumed)));  // free slots
              }
              __syncthreads();
              known = (uint64_t)sAvail;
              __syncthreads();
              if (known == 0) break;
            }
            --known;
            n = *sent;
            const uint64_t dst = a.peerBases[peer] + L.slot(a, a.rank, c, n % a.slots);
            if (threadIdx.x == 0) {
              uint64_t* h = reinterpret_cast<uint64_t*>(dst);
              h[0] = op.bytes;
              h[1] = ((uint64_t)P2P_MAGIC << 32) | (uint32_t)idx;
            }
            blockCopy(reinterpret_cast<char*>(dst + P2P_HEADER), reinterpret_cast<const char*>(op.buf + off), len,
                      a.flags);
            __syncthreads();
            if (threadIdx.x == 0) {
              // One release store: the block's payload writes (ordered by the barrier) before it.
              if (a.flags & P2P_TUNE_FENCE) __threadfence_system();
              mscclpp::storeReleaseSys(reinterpret_cast<uint64_t*>(a.peerBases[peer] + L.ready(a.rank, c)), n + 1);
              *sent = n + 1;
            }
          }
          if (threadIdx.x == 0) prog[k * P2P_MAX_CHANNELS + c] = (uint32_t)(j + 1);
          __syncthreads();
          progressed = true;
        }
      }
    }
    if (allDone) return;
    if (threadIdx.x == 0) {
      const uint64_t now = nowNs();
      if (progressed) {
        lastProgress = now;
        idle = 0;
        sStop = 0;
      } else if (now - lastProgress > a.timeoutNs) {
        recordError(a, kErrStall, a.ops[pendingOp].recv, a.ops[pendingOp].peer, pendingOp);
        sStop = 1;
      } else {
        // Another block failed, or the host raised the abort word. That word is host memory (a
        // read crosses PCIe, ~1 us, and every waiting block of every rank polls): read it on
        // every abortPoll-th idle round only (read on every round since the abort word came,
        // the suspect of the 4 MiB exchange's 54 us instead of round 5's 32 on the H200).
        sStop = (*errWord != 0 || (++idle % a.abortPoll == 0 && mscclpp::abortRaised())) ? 1 : 0;
      }
    }
    __syncthreads();
    const int stop = sStop;
    __syncthreads();
    if (stop) return;
  }
}

}  // namespace

namespace {

/// Spins until `ready()` holds; false on a stall past the timeout (error recorded) or when
/// another thread or block failed (the error word is set) or the host aborted. The stall
/// clock `t0` (this thread's, shared by its waits) starts at the first check of its first long
/// wait (0 until then): no clock read on the way to the first packet.
template <class A, class F>
MSCCLPP_DEVICE_INLINE bool llWait(const A& a, F ready, uint64_t& t0, uint64_t recv, uint64_t peer, uint64_t k) {
  const volatile uint64_t* errWord = reinterpret_cast<const volatile uint64_t*>(a.base + P2pLayout{a.nranks}.error());
  for (uint32_t spin = 1;; ++spin) {
    if (ready()) return true;
    if ((spin & 1023) == 0) {
      if (*errWord != 0 || mscclpp::abortRaised()) return false;  // or aborted
      const uint64_t now = nowNs();
      if (t0 == 0) {
        t0 = now;
      } else if (now - t0 > a.timeoutNs) {
        recordError(a, kErrStall, recv, peer, k);
        return false;
      }
    }
  }
}

/// The LL kernel (every operation at most P2P_LL_MAX bytes, at most one block per (peer,
/// direction) pair: the host checks): block b runs the operations of pair b, sends before
/// receives (an in-place receive thus lands after its send read the buffer; the host puts at
/// most 2 sends in a pair that also receives, so no two such blocks wait on each other), each
/// in order. Same LL protocol as llStep, without a block-wide barrier per attempt: every thread
/// writes or waits for its own packets; a receive ends with one barrier before its
/// llConsumed store.
template <class A>
MSCCLPP_DEVICE_INLINE void llBatch(const A& a) {
  P2pLayout L{a.nranks};
  const uint64_t base = a.base;
  const uint32_t pair = blockIdx.x;
  // The pair's peer (every op of a pair has the same one; this rank for a pair of copies to
  // self) and its first send, from the arguments alone.
  uint64_t peer = a.rank;
  int first = -1;
  for (uint32_t k = 0; k < a.nops; ++k) {
    const P2pOpDev& op = a.ops[k];
    if (op.pair != pair || op.peer == a.rank) continue;
    peer = op.peer;
    if (!op.recv) {
      first = (int)k;
      break;
    }
  }
  // Everything the block reads before its first packet, issued together (one round trip
  // instead of four in a row): this thread's payload word of the first send, the peer's
  // buffer as mapped here (read after the barrier below it was a second round trip before the
  // first packet), the error word, the pair's counters (this block alone writes them, after
  // its final barrier) and the room word.
  uint2 pre = make_uint2(0, 0);
  const uint64_t peerBase = peer != a.rank ? a.peerBases[peer] : 0;
  if (first >= 0 && threadIdx.x >= 1 && threadIdx.x <= (a.ops[first].bytes + 7) / 8)
    pre = loadPayload(reinterpret_cast<const char*>(a.ops[first].buf), (threadIdx.x - 1) * 8, a.ops[first].bytes);
  const uint64_t err = *reinterpret_cast<volatile uint64_t*>(base + L.error());
  uint64_t sent0 = 0, recvd0 = 0, consumed0 = 0;
  if (peer != a.rank) {
    sent0 = *reinterpret_cast<const uint64_t*>(base + L.llSent(peer));
    recvd0 = *reinterpret_cast<const uint64_t*>(base + L.llRecvd(peer));
    // Relaxed, not acquire (an acquire held this thread's later loads behind it): the first
    // packets' stores depend on its value, and the receiver stored it after its reads of the
    // buffer had returned.
    if (first >= 0) consumed0 = *reinterpret_cast<const volatile uint64_t*>(base + L.llConsumed(peer));
  }
  uint64_t t0 = 0;
  uint32_t nSent = 0, nRecvd = 0;
  // A thread whose wait failed (error recorded), or that found the error word set (a launch
  // after an error), skips the rest of the work but still meets every barrier: the block
  // leaves together at the next one. No barrier before the first packets: each thread sends
  // as soon as its own loads returned.
  bool dead = err != 0;
  for (int pass = 0; pass < 2; ++pass) {
    // Every send of the block read its buffer before a receive may overwrite it (in place).
    if (pass == 1) __syncthreads();
    for (uint32_t k = 0; k < a.nops; ++k) {
      const P2pOpDev& op = a.ops[k];
      if (op.pair != pair || op.recv != pass) continue;
      if (op.peer == a.rank) {
        // A copy to this rank itself (op k + 1 is its receive, which has no steps).
        if (!op.recv) blockCopyN<8>(reinterpret_cast<char*>(a.ops[k + 1].buf), reinterpret_cast<const char*>(op.buf), op.bytes);
        continue;
      }
      const uint64_t npk = 1 + (op.bytes + 7) / 8;  // header packet + data packets
      if (!op.recv) {
        const uint64_t n = sent0 + nSent++;
        const uint64_t* consumed = reinterpret_cast<const uint64_t*>(base + L.llConsumed(peer));
        // Room: message n - 2, the buffer's last user, was read (every thread checks itself;
        // the first send with the word read above, normally true at once).
        const bool room = n < 2 || ((int)k == first && consumed0 + 1 >= n);
        if (dead || (!room && !llWait(a, [&] { return mscclpp::loadAcquireSys(consumed) + 1 >= n; }, t0, 0, peer, k))) {
          dead = true;
          continue;
        }
        const uint32_t flag = (uint32_t)(n + 1);
        mscclpp::LL16Packet* pk = reinterpret_cast<mscclpp::LL16Packet*>(peerBase + L.ll(a.rank, n & 1));
        const char* src = reinterpret_cast<const char*>(op.buf);
        for (uint64_t i = threadIdx.x; i < npk; i += blockDim.x) {
          if (i == 0) {
            pk[0].write((uint32_t)op.bytes, P2P_MAGIC, flag);
          } else {
            pk[i].write((int)k == first && i == threadIdx.x ? pre : loadPayload(src, (i - 1) * 8, op.bytes), flag);
          }
        }
        continue;
      }
      const uint64_t n = recvd0 + nRecvd++;
      const uint32_t flag = (uint32_t)(n + 1);
      const mscclpp::LL16Packet* pk = reinterpret_cast<const mscclpp::LL16Packet*>(base + L.ll(peer, n & 1));
      char* dst = reinterpret_cast<char*>(op.buf);
      bool bad = dead;
      // Each thread waits for its own packets only (one per thread up to 4 KiB).
      for (uint64_t i = threadIdx.x; i < npk && !bad; i += blockDim.x) {
        uint2 v;
        if (!llWait(a, [&] { return pk[i].readOnce(flag, v); }, t0, 1, peer, k)) {
          bad = true;
        } else if (i == 0) {
          if (v.x != (uint32_t)op.bytes || v.y != P2P_MAGIC) {
            recordError(a, v.y != P2P_MAGIC ? kErrHeader : kErrSize, 1, peer, v.y != P2P_MAGIC ? v.y : v.x);
            bad = true;
          }
        } else {
          storePayload(dst, (i - 1) * 8, op.bytes, v);
        }
      }
      if (__syncthreads_or(bad)) return;
      // Relaxed (no fence): every packet read above has returned its value (stored out before
      // the barrier), so the sender's next use of the buffer cannot reach those reads.
      if (threadIdx.x == 0)
        mscclpp::storeRelaxedSys(reinterpret_cast<uint64_t*>(peerBase + L.llConsumed(a.rank)), n + 1);
    }
  }
  if (__syncthreads_or(dead) || peer == a.rank) return;
  if (threadIdx.x == 0) {
    if (nSent) *reinterpret_cast<uint64_t*>(base + L.llSent(peer)) = sent0 + nSent;
    if (nRecvd) *reinterpret_cast<uint64_t*>(base + L.llRecvd(peer)) = recvd0 + nRecvd;
  }
}

}  // namespace

namespace {

/// The direct all-to-all (core/src/p2p/gpu.rs `all_to_all_direct`: a captured all-to-all whose
/// receive buffers every rank registered and mapped): block b of every rank copies part b of
/// each of its send blocks straight into the peers' receive buffers. Before it writes, block b
/// of every peer has started (so the peer's receive buffer is free: its earlier stream work is
/// done); after, it tells them its writes are done and waits for theirs into this rank's buffer.
/// Both handshakes are one monotonic word per (sender, block) in the receiver's buffer
/// (P2pLayout::a2a), so a replayed graph stays in step. Every rank runs the same grid (the
/// host sizes it from `per` alone).
MSCCLPP_DEVICE_INLINE void a2aDirect(const P2pA2aArgs& a) {
  P2pLayout L{a.nranks};
  const uint32_t b = blockIdx.x;
  uint64_t* seqWord = reinterpret_cast<uint64_t*>(a.base + L.a2aSeq(b));
  const uint64_t seq = *seqWord;  // this block alone writes it, after its last barrier
  const uint64_t err = *reinterpret_cast<volatile uint64_t*>(a.base + L.error());
  if (__syncthreads_or(err != 0)) return;
  uint64_t t0 = 0;
  const uint32_t t = threadIdx.x;
  const bool peerThread = t < a.nranks && t != a.rank;  // thread t speaks with rank t
  bool bad = false;
  // 1: this block runs (this rank's receive buffer is free), and so does block b of every peer.
  if (peerThread) {
    mscclpp::storeRelaxedSys(reinterpret_cast<uint64_t*>(a.peerBases[t] + L.a2a(a.rank, b)), 2 * seq + 1);
    const uint64_t* w = reinterpret_cast<const uint64_t*>(a.base + L.a2a(t, b));
    bad = !llWait(a, [&] { return mscclpp::loadAcquireSys(w) >= 2 * seq + 1; }, t0, 1, t, 0);
  }
  if (__syncthreads_or(bad)) return;
  // 2: part b of every block, 16-byte units split evenly over the grid.
  const uint64_t units = (a.per + 15) / 16;
  const uint64_t x0 = units * b / gridDim.x * 16;
  uint64_t x1 = units * (b + 1) / gridDim.x * 16;
  if (x1 > a.per) x1 = a.per;
  if (x0 < x1) {
    for (uint32_t i = 0; i < a.nranks; ++i) {
      const uint32_t p = (a.rank + i) % a.nranks;  // ranks start on different peers
      blockCopyN<8>(reinterpret_cast<char*>(a.recv[p] + a.rank * a.per + x0),
                    reinterpret_cast<const char*>(a.send + p * a.per + x0), x1 - x0);
    }
  }
  __syncthreads();
  // 3: the writes above are done (release after the barrier), and every peer's into this rank's
  // buffer too.
  if (peerThread) {
    mscclpp::storeReleaseSys(reinterpret_cast<uint64_t*>(a.peerBases[t] + L.a2a(a.rank, b)), 2 * seq + 2);
    const uint64_t* w = reinterpret_cast<const uint64_t*>(a.base + L.a2a(t, b));
    bad = !llWait(a, [&] { return mscclpp::loadAcquireSys(w) >= 2 * seq + 2; }, t0, 1, t, 0);
  }
  if (__syncthreads_or(bad)) return;
  if (threadIdx.x == 0) *seqWord = seq + 1;
}

}  // namespace

extern "C" __global__ void __launch_bounds__(P2P_THREADS) p2p_batch(P2pArgs a) { batch(a); }

/// The direct all-to-all (a2aDirect).
extern "C" __global__ void __launch_bounds__(P2P_THREADS) p2p_a2a_direct(P2pA2aArgs a) { a2aDirect(a); }

extern "C" __global__ void __launch_bounds__(P2P_THREADS) p2p_batch_small(P2pArgsSmall a) { batch(a); }

/// Launches whose every operation is an LL message (or a copy to self of at most P2P_LL_MAX
/// bytes): one block per (peer, direction) pair (llBatch).
extern "C" __global__ void __launch_bounds__(P2P_THREADS) p2p_ll(P2pArgsSmall a) { llBatch(a); }
/// p2p_ll for launches of more than P2P_SMALL_OPS operations.
extern "C" __global__ void __launch_bounds__(P2P_THREADS) p2p_ll_big(P2pArgs a) { llBatch(a); }
