/* dist_internal.h - helpers shared by the communicator implementations (not a public interface):
 * the rank-order reduction every host implementation must use so "local" and "tcp" agree bit for
 * bit, a monotonic clock, and the poll()-bounded socket I/O and frame format of "tcp", the
 * bootstrap and the control channel. */
#ifndef MS_DIST_INTERNAL_H
#define MS_DIST_INTERNAL_H

#include "core/dtype.h"
#include "core/status.h"

#include <stddef.h>
#include <stdint.h>

/* Monotonic clock, seconds. */
double ms_dist_now(void);

/* Element size for the reductions: 4 (F32), 2 (BF16), 0 for any other dtype. */
size_t ms_dist_red_size(ms_dtype dt);

/* dst[i] = round(sum_r src_r[i]) for i in [0, n), with the sum taken in float32 in rank order
 * (((s0 + s1) + s2) + ...) and rounded to dt once. srcs[r] points at rank r's first element of
 * this range; dst may alias srcs[k] for any k only if each element is read before written (it is:
 * element-wise). dt MS_F32 or MS_BF16. */
void ms_dist_reduce_ranks(const void *const *srcs, int n_ranks, size_t n, ms_dtype dt, void *dst);

/* The same sum built one rank at a time (the tcp hub receives ranks one after another):
 * acc_init sets acc = src (rank 0), acc_add adds the next rank, acc_store rounds into dst. The
 * float operations are the ones ms_dist_reduce_ranks does, so the results are bitwise equal. */
void ms_dist_acc_init(float *acc, const void *src, size_t n, ms_dtype dt);
void ms_dist_acc_add(float *acc, const void *src, size_t n, ms_dtype dt);
void ms_dist_acc_store(void *dst, const float *acc, size_t n, ms_dtype dt);

/* 1 when an NCCL communicator can be made here (CUDA build with a visible GPU); else 0 and a
 * sentence in why. Defined by the NCCL implementation, or by comm.c in builds without CUDA. */
int ms_comm_nccl_available(char *why, size_t why_size);

/* ---- sockets ---- */
/* Frame header on the wire: 24 bytes, little-endian. Every connection starts with a HELLO frame
 * from the connecting side; a peer that does not start with the magic is refused. */
#define MS_DIST_MAGIC 0x3144534du /* "MSD1" */
#define MS_DIST_VERSION 1
enum {
    MS_FR_HELLO = 1,   /* a = rank, b = size, len = 1: channel byte */
    MS_FR_WELCOME = 2, /* accepted; no payload */
    MS_FR_REJECT = 3,  /* payload: a sentence; the connection is closed after it */
    MS_FR_DATA = 4,    /* collective payload; a = op, b = dtype << 16 | root */
    MS_FR_ERROR = 5,   /* hub failed: payload is its sentence */
    MS_FR_CTL = 6,     /* control-channel message; a = sequence number */
    MS_FR_SHUTDOWN = 7 /* control channel: node 0 is shutting down */
};
enum { MS_CH_COMM = 1, MS_CH_CTL = 2 };

typedef struct ms_frame {
    uint32_t magic;
    uint16_t version, type;
    uint32_t a, b;
    uint64_t len;
} ms_frame;

/* Result of a socket helper: OK, the deadline passed, the peer closed (EOF/reset), the peer sent
 * something while we were sending (see net_send), or another error (errno kept in *sys_errno). */
enum { NET_OK = 0, NET_TIMEOUT, NET_CLOSED, NET_PEER_SPOKE, NET_ERROR };

/* Listens on host:port (non-blocking, SO_REUSEADDR); the message names the address. */
int ms_dist_listen(const char *host, int port, int *fd, ms_err *err);
/* Accepts one connection before `deadline` (ms_dist_now() scale); *fd non-blocking; addr gets
 * "IP:PORT" of the peer. NET_TIMEOUT when none came. */
int ms_dist_accept(int lfd, double deadline, int *fd, char *addr, size_t addr_size, int *sys_errno);
/* Connects to host:port, retrying (connection refused: the listener is not up yet) until deadline. */
int ms_dist_connect(const char *host, int port, double deadline, int *fd, ms_err *err);
/* Sends n bytes before deadline (INFINITY = no deadline). With watch_in, returns NET_PEER_SPOKE as
 * soon as the peer has bytes for us (the hub reports a failure while we are still sending). */
int ms_dist_send(int fd, const void *buf, size_t n, double deadline, int watch_in, int *sys_errno);
/* Receives exactly n bytes before deadline (INFINITY = wait forever, still noticing EOF at once). */
int ms_dist_recv(int fd, void *buf, size_t n, double deadline, int *sys_errno);
/* Frame header I/O (encode/decode little-endian; magic and version are checked by the caller). */
int ms_dist_send_frame(int fd, const ms_frame *f, const void *payload, double deadline, int watch_in, int *sys_errno);
int ms_dist_recv_frame_hdr(int fd, ms_frame *f, double deadline, int *sys_errno);
/* Describes a NET_* result for messages: "timed out after 5.0 s", "closed the connection", ... */
const char *ms_dist_net_what(int net_rc, int sys_errno, char *buf, size_t size);
/* Closes fd if >= 0 and sets it to -1. */
void ms_dist_close(int *fd);

/* Handshake, connecting side: sends HELLO (channel, rank, size) and waits for WELCOME; a REJECT's
 * sentence, a bad magic or a closed connection becomes the error (naming `who`, e.g. "node 0 at
 * 10.0.0.1:5000"). */
int ms_dist_hello(int fd, int channel, int rank, int size, double deadline, const char *who, ms_err *err);

/* Handshake, listening side: accepts connections until all of ranks 1..size-1 have said HELLO on
 * `channel` or the deadline passes. fds[r] (r >= 1) gets rank r's socket, addrs[r] its address.
 * Strays (bad magic, wrong channel/size, duplicate or out-of-range rank) are refused (REJECT frame
 * when they speak our protocol) and the wait goes on; a timeout names the missing ranks and the
 * last refused connection. `what` names the service in messages ("tcp comm", "control channel"). */
int ms_dist_accept_group(int lfd, int channel, int size, double deadline, const char *what, int *fds,
                         char (*addrs)[64], ms_err *err);

#endif
