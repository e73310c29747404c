// Point-to-point within a node (core/src/p2p/gpu.rs): one launch runs one batch of sends and
// receives (an NCCL group), every operation progressed together.
//
// extern "C" __global__ void p2p_batch(P2pArgs args);
//
// Every rank owns one buffer (`base`, mapped by every peer of the node; same layout everywhere,
// P2pLayout below): counters, then one receive ring per sending peer and channel of SLOTS slots
// of (16-byte header + CHUNK payload). Message bytes are cut into chunks of CHUNK; chunk i of a
// message goes to channel i % nch (nch = min(CHANNELS, chunks), computed alike on both sides).
// Per (sender -> receiver, channel), counters count chunks since the buffers were created
// (monotonic, device-only, so a captured graph replays correctly):
//   sender:   n = sent[r][c]; waits until n - consumed[r][c] < SLOTS (consumed: written by the
//             receiver into the sender's buffer), writes header {total bytes, chunk index, magic}
//             + payload into the receiver's slot n % SLOTS, fences, stores ready[me][c] = n + 1 in
//             the receiver's buffer (release, system scope), sent = n + 1.
//   receiver: n = recvd[s][c]; waits until ready[s][c] > n (acquire), checks the header (a total
//             that differs from its own size is an error), copies the payload out, stores
//             consumed[me][c] = n + 1 in the sender's buffer (release), recvd = n + 1.
// Tasks (op, channel) are owned by block (op.pair * CHANNELS + channel) % gridDim.x: the ops of
// one (peer, direction) pair share the blocks of their channels, so a channel of a later op only
// starts once the same channel of the op before it (op.pred, same pair) is done: per (peer,
// direction) order as NCCL specifies. A block polls all of its tasks round-robin without
// blocking on any of them, so matched sends and receives complete in any order.
// A block that makes no progress for `timeoutNs` records an error in the buffer's error words
// (kind, peer, detail) and their host-mapped copy, prints it and returns; a launch finding the
// error word set returns at once (the host reads the copy at its next call, without waiting).
#include <mscclpp/atomic_device.hpp>
#include <mscclpp/device.hpp>

#define P2P_MAX_OPS 128
#define P2P_CHANNELS 8
#define P2P_SLOTS 4
#define P2P_CHUNK (128 * 1024)
#define P2P_HEADER 16
#define P2P_SLOT_BYTES (P2P_CHUNK + P2P_HEADER)
#define P2P_MAGIC 0x3250434eu  // "NCP2"
#define P2P_THREADS 512

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

/// struct P2pArgs (core/src/p2p/gpu.rs).
struct P2pArgs {
  uint64_t base;              // this rank's buffer
  const uint64_t* peerBases;  // [nranks] every rank's buffer mapped here (own at rank)
  uint64_t* hostErr;          // [2] host-mapped copy of the error words (read by the host)
  uint64_t timeoutNs;
  uint32_t nops;
  uint32_t rank;
  uint32_t nranks;
  uint32_t pad;
  P2pOpDev ops[P2P_MAX_OPS];
};

namespace {

struct P2pLayout {
  uint64_t n;  // nranks
  MSCCLPP_DEVICE_INLINE uint64_t ready(uint64_t sender, uint64_t c) const { return (sender * P2P_CHANNELS + c) * 8; }
  MSCCLPP_DEVICE_INLINE uint64_t consumed(uint64_t receiver, uint64_t c) const {
    return (n + receiver) * P2P_CHANNELS * 8 + c * 8;
  }
  MSCCLPP_DEVICE_INLINE uint64_t sent(uint64_t peer, uint64_t c) const { return (2 * n + peer) * P2P_CHANNELS * 8 + c * 8; }
  MSCCLPP_DEVICE_INLINE uint64_t recvd(uint64_t peer, uint64_t c) const { return (3 * n + peer) * P2P_CHANNELS * 8 + c * 8; }
  MSCCLPP_DEVICE_INLINE uint64_t error() const { return 4 * n * P2P_CHANNELS * 8; }
  MSCCLPP_DEVICE_INLINE uint64_t rings() const { return (error() + 64 + 4095) / 4096 * 4096; }
  MSCCLPP_DEVICE_INLINE uint64_t slot(uint64_t sender, uint64_t c, uint64_t k) const {
    return rings() + ((sender * P2P_CHANNELS + c) * P2P_SLOTS + k) * (uint64_t)P2P_SLOT_BYTES;
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

MSCCLPP_DEVICE_INLINE uint64_t chunksOf(uint64_t bytes) { return (bytes + P2P_CHUNK - 1) / P2P_CHUNK; }
MSCCLPP_DEVICE_INLINE uint32_t channelsOf(uint64_t bytes) {
  const uint64_t k = chunksOf(bytes);
  return k < P2P_CHANNELS ? (uint32_t)k : P2P_CHANNELS;
}
/// Chunks of a message on channel c of nch.
MSCCLPP_DEVICE_INLINE uint64_t chunksOn(uint64_t bytes, uint32_t c) {
  const uint64_t k = chunksOf(bytes);
  const uint32_t nch = channelsOf(bytes);
  return c < nch ? (k - c + nch - 1) / nch : 0;
}

/// Block-wide copy of len bytes (16-byte vectors when both ends are aligned).
MSCCLPP_DEVICE_INLINE void blockCopy(char* dst, const char* src, uint64_t len) {
  uint64_t done = 0;
  if ((((uintptr_t)dst | (uintptr_t)src) & 15) == 0) {
    const uint64_t n = len / 16;
    uint4* d4 = reinterpret_cast<uint4*>(dst);
    const uint4* s4 = reinterpret_cast<const uint4*>(src);
    uint64_t i = threadIdx.x;
    for (; i + 3 * blockDim.x < n; i += 4 * blockDim.x) {
      uint4 r0 = s4[i], r1 = s4[i + blockDim.x], r2 = s4[i + 2 * blockDim.x], r3 = s4[i + 3 * blockDim.x];
      d4[i] = r0;
      d4[i + blockDim.x] = r1;
      d4[i + 2 * blockDim.x] = r2;
      d4[i + 3 * blockDim.x] = r3;
    }
    for (; i < n; i += blockDim.x) d4[i] = s4[i];
    done = n * 16;
  }
  for (uint64_t i = done + threadIdx.x; i < len; i += blockDim.x) dst[i] = src[i];
}

// Error kinds (error word: 1 << 63 | kind << 48 | dir << 40 | peer; detail word: see kind).
constexpr uint64_t kErrStall = 1;     // detail: the pending op index
constexpr uint64_t kErrSize = 2;      // detail: the size the sender announced
constexpr uint64_t kErrHeader = 3;    // detail: the header's chunk index / magic

MSCCLPP_DEVICE_INLINE void recordError(const P2pArgs& a, uint64_t kind, uint64_t recv, uint64_t peer, uint64_t detail) {
  P2pLayout L{a.nranks};
  uint64_t* err = reinterpret_cast<uint64_t*>(a.base + L.error());
  const uint64_t word = (1ull << 63) | (kind << 48) | (recv << 40) | peer;
  if (atomicCAS((unsigned long long*)err, 0ull, (unsigned long long)word) == 0ull) {
    err[1] = detail;
    a.hostErr[1] = detail;
    __threadfence_system();
    mscclpp::storeReleaseSys(a.hostErr, word);
  }
  printf("mscclpp p2p: rank %u: %s rank %llu failed (kind %llu, detail %llu): %s\n", a.rank,
         recv ? "receive from" : "send to", (unsigned long long)peer, (unsigned long long)kind,
         (unsigned long long)detail,
         kind == kErrStall ? "no progress within the timeout: expected the peer to post the matching call"
         : kind == kErrSize ? "the sender's message size differs from this receive's"
                            : "malformed chunk header");
}

}  // namespace

extern "C" __global__ void __launch_bounds__(P2P_THREADS) p2p_batch(P2pArgs a) {
  __shared__ uint32_t prog[P2P_MAX_OPS * P2P_CHANNELS];
  __shared__ int sAvail;
  __shared__ int sStop;
  P2pLayout L{a.nranks};
  const uint64_t base = a.base;
  volatile uint64_t* errWord = reinterpret_cast<volatile uint64_t*>(base + L.error());
  for (uint32_t i = threadIdx.x; i < a.nops * P2P_CHANNELS; i += blockDim.x) prog[i] = 0;
  if (threadIdx.x == 0) sStop = (*errWord != 0);
  __syncthreads();
  if (sStop) return;
  const uint32_t G = gridDim.x;
  uint64_t lastProgress = nowNs();
  uint32_t pendingOp = 0;
  while (true) {
    bool allDone = true, progressed = false;
    for (uint32_t k = 0; k < a.nops; ++k) {
      const P2pOpDev& op = a.ops[k];
      const uint32_t nch = channelsOf(op.bytes);
      for (uint32_t c = 0; c < nch; ++c) {
        if ((op.pair * P2P_CHANNELS + c) % G != blockIdx.x) continue;
        const uint64_t total = chunksOn(op.bytes, c);
        if (prog[k * P2P_CHANNELS + c] >= total) continue;
        allDone = false;
        pendingOp = k;
        // The last earlier op of the same pair with chunks on this channel must be done (its
        // own predecessors were done before it started).
        int pred = op.pred;
        while (pred >= 0 && chunksOn(a.ops[pred].bytes, c) == 0) pred = a.ops[pred].pred;
        if (pred >= 0 && prog[pred * P2P_CHANNELS + c] < chunksOn(a.ops[pred].bytes, c)) continue;
        const uint64_t peer = op.peer;
        while (prog[k * P2P_CHANNELS + c] < total) {
          const uint64_t j = prog[k * P2P_CHANNELS + c];
          const uint64_t idx = j * nch + c;  // chunk index in the message
          const uint64_t off = idx * P2P_CHUNK;
          const uint64_t len = op.bytes - off < P2P_CHUNK ? op.bytes - off : P2P_CHUNK;
          uint64_t n = 0;
          if (op.recv) {
            uint64_t* recvd = reinterpret_cast<uint64_t*>(base + L.recvd(peer, c));
            if (threadIdx.x == 0) {
              n = *recvd;
              const uint64_t* ready = reinterpret_cast<const uint64_t*>(base + L.ready(peer, c));
              int ok = mscclpp::loadAcquireSys(ready) > n;
              if (ok) {
                const uint64_t* h = reinterpret_cast<const uint64_t*>(base + L.slot(peer, c, n % P2P_SLOTS));
                const uint64_t tot = h[0], w = h[1];
                if (tot != op.bytes) {
                  recordError(a, kErrSize, 1, peer, tot);
                  ok = -1;
                } else if ((uint32_t)(w >> 32) != P2P_MAGIC || (uint32_t)w != (uint32_t)idx) {
                  recordError(a, kErrHeader, 1, peer, w);
                  ok = -1;
                }
              }
              sAvail = ok;
            }
            __syncthreads();
            const int avail = sAvail;
            __syncthreads();
            if (avail < 0) return;
            if (!avail) break;
            n = *recvd;  // every thread: this block alone writes it, before the barrier above
            const char* src = reinterpret_cast<const char*>(base + L.slot(peer, c, n % P2P_SLOTS) + P2P_HEADER);
            blockCopy(reinterpret_cast<char*>(op.buf + off), src, len);
            __syncthreads();
            if (threadIdx.x == 0) {
              __threadfence_system();
              mscclpp::storeReleaseSys(reinterpret_cast<uint64_t*>(a.peerBases[peer] + L.consumed(a.rank, c)), n + 1);
              *recvd = n + 1;
            }
          } else {
            uint64_t* sent = reinterpret_cast<uint64_t*>(base + L.sent(peer, c));
            if (threadIdx.x == 0) {
              n = *sent;
              const uint64_t* consumed = reinterpret_cast<const uint64_t*>(base + L.consumed(peer, c));
              sAvail = n - mscclpp::loadAcquireSys(consumed) < P2P_SLOTS;
            }
            __syncthreads();
            const int avail = sAvail;
            __syncthreads();
            if (!avail) break;
            n = *sent;
            const uint64_t dst = a.peerBases[peer] + L.slot(a.rank, c, n % P2P_SLOTS);
            if (threadIdx.x == 0) {
              uint64_t* h = reinterpret_cast<uint64_t*>(dst);
              h[0] = op.bytes;
              h[1] = ((uint64_t)P2P_MAGIC << 32) | (uint32_t)idx;
            }
            blockCopy(reinterpret_cast<char*>(dst + P2P_HEADER), reinterpret_cast<const char*>(op.buf + off), len);
            __syncthreads();
            if (threadIdx.x == 0) {
              __threadfence_system();
              mscclpp::storeReleaseSys(reinterpret_cast<uint64_t*>(a.peerBases[peer] + L.ready(a.rank, c)), n + 1);
              *sent = n + 1;
            }
          }
          if (threadIdx.x == 0) prog[k * P2P_CHANNELS + c] = (uint32_t)(j + 1);
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
        sStop = 0;
      } else if (now - lastProgress > a.timeoutNs) {
        recordError(a, kErrStall, a.ops[pendingOp].recv, a.ops[pendingOp].peer, pendingOp);
        sStop = 1;
      } else {
        sStop = (*errWord != 0) ? 1 : 0;  // another block failed
      }
    }
    __syncthreads();
    const int stop = sStop;
    __syncthreads();
    if (stop) return;
  }
}
