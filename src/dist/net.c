/* net.c - the pieces every host communicator shares: the rank-order float32 reduction (so the
 * in-process and TCP communicators agree bit for bit) and socket I/O in which every wait is a
 * poll() bounded by a deadline, so a dead or silent peer becomes an error, never a hang. */
#include "dist/dist_internal.h"
#include "dist/comm.h"

#include <arpa/inet.h>
#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

double ms_dist_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

size_t ms_dist_red_size(ms_dtype dt) { return dt == MS_F32 ? 4 : dt == MS_BF16 ? 2 : 0; }

static inline float ld(const void *p, size_t i, ms_dtype dt) {
    return dt == MS_F32 ? ((const float *)p)[i] : ms_bf16_to_f32(((const uint16_t *)p)[i]);
}

void ms_dist_reduce_ranks(const void *const *srcs, int n_ranks, size_t n, ms_dtype dt, void *dst) {
    for (size_t i = 0; i < n; i++) {
        float acc = ld(srcs[0], i, dt);
        for (int r = 1; r < n_ranks; r++) acc += ld(srcs[r], i, dt);
        if (dt == MS_F32) ((float *)dst)[i] = acc;
        else ((uint16_t *)dst)[i] = ms_f32_to_bf16(acc);
    }
}

void ms_dist_acc_init(float *acc, const void *src, size_t n, ms_dtype dt) {
    for (size_t i = 0; i < n; i++) acc[i] = ld(src, i, dt);
}

void ms_dist_acc_add(float *acc, const void *src, size_t n, ms_dtype dt) {
    for (size_t i = 0; i < n; i++) acc[i] += ld(src, i, dt);
}

void ms_dist_acc_store(void *dst, const float *acc, size_t n, ms_dtype dt) {
    if (dt == MS_F32) memcpy(dst, acc, n * 4);
    else
        for (size_t i = 0; i < n; i++) ((uint16_t *)dst)[i] = ms_f32_to_bf16(acc[i]);
}

int ms_dist_parse_addr(const char *host_port, char *host, size_t host_size, int *port, ms_err *err) {
    const char *colon = host_port ? strrchr(host_port, ':') : NULL;
    if (!colon || colon == host_port || (size_t)(colon - host_port) >= host_size)
        return ms_errf(err, MS_ERR_INVALID, "flag --dist-init-addr: \"%s\" is not HOST:PORT",
                       host_port ? host_port : "(null)");
    char *end = NULL;
    long p = strtol(colon + 1, &end, 10);
    if (!end || *end || end == colon + 1 || p < 1 || p > 65535)
        return ms_errf(err, MS_ERR_INVALID, "flag --dist-init-addr: port in \"%s\" is not 1..65535", host_port);
    memcpy(host, host_port, (size_t)(colon - host_port));
    host[colon - host_port] = 0;
    *port = (int)p;
    return MS_OK;
}

static int set_nonblock(int fd) {
    int fl = fcntl(fd, F_GETFL, 0);
    return fl < 0 ? -1 : fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

static void tune_socket(int fd) {
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

static int resolve(const char *host, int port, struct sockaddr_in *sa, ms_err *err) {
    memset(sa, 0, sizeof *sa);
    sa->sin_family = AF_INET;
    sa->sin_port = htons((uint16_t)port);
    if (inet_pton(AF_INET, host, &sa->sin_addr) == 1) return MS_OK;
    struct addrinfo hints = {0}, *res = NULL;
    hints.ai_family = AF_INET;
    hints.ai_socktype = SOCK_STREAM;
    int g = getaddrinfo(host, NULL, &hints, &res);
    if (g != 0 || !res)
        return ms_errf(err, MS_ERR_INVALID, "flag --dist-init-addr: cannot resolve host \"%s\" (%s)", host,
                       gai_strerror(g));
    sa->sin_addr = ((struct sockaddr_in *)res->ai_addr)->sin_addr;
    freeaddrinfo(res);
    return MS_OK;
}

int ms_dist_listen(const char *host, int port, int *fd_out, ms_err *err) {
    struct sockaddr_in sa;
    MS_TRY(resolve(host, port, &sa, err));
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return ms_errf(err, MS_ERR_IO, "socket() for %s:%d failed: %s", host, port, strerror(errno));
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(fd, 64) != 0 || set_nonblock(fd) != 0) {
        int e = errno;
        close(fd);
        return ms_errf(err, MS_ERR_IO, "cannot listen at %s:%d (--dist-init-addr): %s", host, port, strerror(e));
    }
    *fd_out = fd;
    return MS_OK;
}

/* poll timeout in ms for a deadline (-1 = infinite), at least 0. */
static int poll_ms(double deadline) {
    if (isinf(deadline)) return -1;
    double left = deadline - ms_dist_now();
    if (left <= 0) return 0;
    double ms = ceil(left * 1000.0);
    return ms > 1e9 ? 1000000000 : (int)ms;
}

int ms_dist_accept(int lfd, double deadline, int *fd_out, char *addr, size_t addr_size, int *sys_errno) {
    for (;;) {
        struct pollfd p = {.fd = lfd, .events = POLLIN};
        int pm = poll_ms(deadline);
        int k = poll(&p, 1, pm);
        if (k < 0) {
            if (errno == EINTR) continue;
            *sys_errno = errno;
            return NET_ERROR;
        }
        if (k == 0) {
            if (pm == 0 || ms_dist_now() >= deadline) return NET_TIMEOUT;
            continue;
        }
        struct sockaddr_in sa;
        socklen_t sl = sizeof sa;
        int fd = accept4(lfd, (struct sockaddr *)&sa, &sl, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR || errno == ECONNABORTED) continue;
            *sys_errno = errno;
            return NET_ERROR;
        }
        tune_socket(fd);
        char ip[INET_ADDRSTRLEN] = "?";
        inet_ntop(AF_INET, &sa.sin_addr, ip, sizeof ip);
        snprintf(addr, addr_size, "%s:%d", ip, ntohs(sa.sin_port));
        *fd_out = fd;
        return NET_OK;
    }
}

int ms_dist_connect(const char *host, int port, double deadline, int *fd_out, ms_err *err) {
    struct sockaddr_in sa;
    MS_TRY(resolve(host, port, &sa, err));
    int last = 0;
    for (;;) {
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (fd < 0) return ms_errf(err, MS_ERR_IO, "socket() for %s:%d failed: %s", host, port, strerror(errno));
        int rc = connect(fd, (struct sockaddr *)&sa, sizeof sa);
        if (rc != 0 && errno == EINPROGRESS) {
            struct pollfd p = {.fd = fd, .events = POLLOUT};
            double step = ms_dist_now() + 1.0;
            int k = poll(&p, 1, poll_ms(step < deadline ? step : deadline));
            int soerr = 0;
            socklen_t sl = sizeof soerr;
            if (k == 1 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) == 0 && soerr == 0) rc = 0;
            else errno = k == 1 ? soerr : ETIMEDOUT;
        }
        if (rc == 0) {
            tune_socket(fd);
            *fd_out = fd;
            return MS_OK;
        }
        last = errno;
        close(fd);
        if (ms_dist_now() >= deadline) break;
        struct timespec ts = {0, 50 * 1000 * 1000}; /* the listener may not be up yet */
        nanosleep(&ts, NULL);
        if (ms_dist_now() >= deadline) break;
    }
    return ms_errf(err, MS_ERR_RUNTIME, "could not connect to %s:%d (--dist-init-addr) before the timeout: %s", host,
                   port, strerror(last));
}

int ms_dist_send(int fd, const void *buf, size_t n, double deadline, int watch_in, int *sys_errno) {
    const char *p = (const char *)buf;
    while (n > 0) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w > 0) {
            p += w;
            n -= (size_t)w;
            continue;
        }
        if (w < 0 && errno == EINTR) continue;
        if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
            *sys_errno = errno;
            return (errno == EPIPE || errno == ECONNRESET) ? NET_CLOSED : NET_ERROR;
        }
        struct pollfd pf = {.fd = fd, .events = (short)(POLLOUT | (watch_in ? POLLIN : 0))};
        int pm = poll_ms(deadline);
        int k = poll(&pf, 1, pm);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) {
            *sys_errno = errno;
            return NET_ERROR;
        }
        if (k == 0 && (pm == 0 || ms_dist_now() >= deadline)) return NET_TIMEOUT;
        if (watch_in && (pf.revents & POLLIN)) return NET_PEER_SPOKE;
        if (pf.revents & (POLLERR | POLLHUP | POLLNVAL)) {
            *sys_errno = 0;
            return NET_CLOSED;
        }
    }
    return NET_OK;
}

int ms_dist_recv(int fd, void *buf, size_t n, double deadline, int *sys_errno) {
    char *p = (char *)buf;
    while (n > 0) {
        ssize_t r = recv(fd, p, n, 0);
        if (r > 0) {
            p += r;
            n -= (size_t)r;
            continue;
        }
        if (r == 0) return NET_CLOSED;
        if (errno == EINTR) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) {
            *sys_errno = errno;
            return errno == ECONNRESET ? NET_CLOSED : NET_ERROR;
        }
        struct pollfd pf = {.fd = fd, .events = POLLIN};
        int pm = poll_ms(deadline);
        int k = poll(&pf, 1, pm);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) {
            *sys_errno = errno;
            return NET_ERROR;
        }
        if (k == 0 && (pm == 0 || ms_dist_now() >= deadline)) return NET_TIMEOUT;
        if (pf.revents & POLLNVAL) {
            *sys_errno = EBADF;
            return NET_ERROR;
        }
    }
    return NET_OK;
}

int ms_dist_send_frame(int fd, const ms_frame *f, const void *payload, double deadline, int watch_in,
                       int *sys_errno) {
    unsigned char h[24];
    uint32_t m = htole32(f->magic), a = htole32(f->a), b = htole32(f->b);
    uint16_t v = htole16(f->version), t = htole16(f->type);
    uint64_t l = htole64(f->len);
    memcpy(h, &m, 4);
    memcpy(h + 4, &v, 2);
    memcpy(h + 6, &t, 2);
    memcpy(h + 8, &a, 4);
    memcpy(h + 12, &b, 4);
    memcpy(h + 16, &l, 8);
    int rc = ms_dist_send(fd, h, sizeof h, deadline, watch_in, sys_errno);
    if (rc == NET_OK && f->len) rc = ms_dist_send(fd, payload, (size_t)f->len, deadline, watch_in, sys_errno);
    return rc;
}

int ms_dist_recv_frame_hdr(int fd, ms_frame *f, double deadline, int *sys_errno) {
    unsigned char h[24];
    int rc = ms_dist_recv(fd, h, sizeof h, deadline, sys_errno);
    if (rc != NET_OK) return rc;
    uint32_t m, a, b;
    uint16_t v, t;
    uint64_t l;
    memcpy(&m, h, 4);
    memcpy(&v, h + 4, 2);
    memcpy(&t, h + 6, 2);
    memcpy(&a, h + 8, 4);
    memcpy(&b, h + 12, 4);
    memcpy(&l, h + 16, 8);
    f->magic = le32toh(m);
    f->version = le16toh(v);
    f->type = le16toh(t);
    f->a = le32toh(a);
    f->b = le32toh(b);
    f->len = le64toh(l);
    return NET_OK;
}

const char *ms_dist_net_what(int net_rc, int sys_errno, char *buf, size_t size) {
    switch (net_rc) {
    case NET_TIMEOUT: snprintf(buf, size, "did not answer before the timeout"); break;
    case NET_CLOSED: snprintf(buf, size, "closed the connection (process exited or was killed?)"); break;
    case NET_PEER_SPOKE: snprintf(buf, size, "sent an unexpected message"); break;
    default: snprintf(buf, size, "socket error: %s", strerror(sys_errno)); break;
    }
    return buf;
}

void ms_dist_close(int *fd) {
    if (*fd >= 0) close(*fd);
    *fd = -1;
}

static int read_reason(int fd, const ms_frame *f, double deadline, char *msg, size_t size) {
    size_t n = f->len < size - 1 ? (size_t)f->len : size - 1;
    int e = 0;
    if (f->len > 4096 || ms_dist_recv(fd, msg, n, deadline, &e) != NET_OK) n = 0;
    msg[n] = 0;
    return (int)n;
}

int ms_dist_hello(int fd, int channel, int rank, int size, double deadline, const char *who, ms_err *err) {
    ms_frame f = {MS_DIST_MAGIC, MS_DIST_VERSION, MS_FR_HELLO, (uint32_t)rank, (uint32_t)size, 1};
    unsigned char ch = (unsigned char)channel;
    int e = 0, rc = ms_dist_send_frame(fd, &f, &ch, deadline, 0, &e);
    char what[128];
    if (rc == NET_OK) rc = ms_dist_recv_frame_hdr(fd, &f, deadline, &e);
    if (rc != NET_OK)
        return ms_errf(err, MS_ERR_RUNTIME, "rank %d: handshake with %s failed: it %s", rank, who,
                       ms_dist_net_what(rc, e, what, sizeof what));
    if (f.magic != MS_DIST_MAGIC || f.version != MS_DIST_VERSION)
        return ms_errf(err, MS_ERR_FORMAT,
                       "rank %d: %s is not a moeserve peer of this version (magic 0x%08x version %u; wrong "
                       "--dist-init-addr?)",
                       rank, who, f.magic, f.version);
    if (f.type == MS_FR_REJECT) {
        char msg[400];
        read_reason(fd, &f, deadline, msg, sizeof msg);
        return ms_errf(err, MS_ERR_RUNTIME, "rank %d: %s refused the connection: %s", rank, who, msg);
    }
    if (f.type != MS_FR_WELCOME || f.len != 0)
        return ms_errf(err, MS_ERR_FORMAT, "rank %d: %s answered the handshake with frame type %u", rank, who, f.type);
    return MS_OK;
}

static void reject(int fd, const char *msg) {
    ms_frame f = {MS_DIST_MAGIC, MS_DIST_VERSION, MS_FR_REJECT, 0, 0, strlen(msg)};
    int e = 0;
    ms_dist_send_frame(fd, &f, msg, ms_dist_now() + 0.5, 0, &e);
}

int ms_dist_accept_group(int lfd, int channel, int size, double deadline, const char *what, int *fds,
                         char (*addrs)[64], ms_err *err) {
    int have = 1;
    char refused[300] = "";
    const char *unit = channel == MS_CH_CTL ? "node" : "rank";
    for (int r = 0; r < size; r++) fds[r] = -1;
    while (have < size) {
        int fd = -1, e = 0;
        char addr[64];
        int rc = ms_dist_accept(lfd, deadline, &fd, addr, sizeof addr, &e);
        if (rc == NET_TIMEOUT) break;
        if (rc != NET_OK) {
            for (int r = 1; r < size; r++) ms_dist_close(&fds[r]);
            return ms_errf(err, MS_ERR_IO, "%s %s 0: accept() failed: %s", what, unit, strerror(e));
        }
        /* A stray connection gets at most 2 s to say who it is, so it cannot hold up the group. */
        double hd = ms_dist_now() + 2.0;
        ms_frame f;
        unsigned char ch = 0;
        rc = ms_dist_recv_frame_hdr(fd, &f, hd < deadline ? hd : deadline, &e);
        if (rc != NET_OK) {
            snprintf(refused, sizeof refused, "refused a connection from %s: it sent no handshake", addr);
        } else if (f.magic != MS_DIST_MAGIC) {
            snprintf(refused, sizeof refused, "refused a connection from %s: not a moeserve peer (bad magic 0x%08x)",
                     addr, f.magic);
        } else if (f.version != MS_DIST_VERSION || f.type != MS_FR_HELLO || f.len != 1 ||
                   ms_dist_recv(fd, &ch, 1, hd, &e) != NET_OK) {
            snprintf(refused, sizeof refused, "refused a connection from %s: protocol version %u (want %u) or bad hello",
                     addr, f.version, MS_DIST_VERSION);
            reject(fd, refused);
        } else if (ch != channel) {
            snprintf(refused, sizeof refused, "refused a connection from %s: it wants the %s, this port serves the %s",
                     addr, ch == MS_CH_CTL ? "control channel" : "communicator",
                     channel == MS_CH_CTL ? "control channel" : "communicator");
            reject(fd, refused);
        } else if ((int)f.b != size || f.a < 1 || (int)f.a >= size || fds[f.a] >= 0) {
            snprintf(refused, sizeof refused, "refused a connection from %s: %s %u of %u does not fit this group of %d%s",
                     addr, unit, f.a, f.b, size, (f.a >= 1 && (int)f.a < size && fds[f.a] >= 0) ? " (rank already connected)" : "");
            reject(fd, refused);
        } else {
            ms_frame w = {MS_DIST_MAGIC, MS_DIST_VERSION, MS_FR_WELCOME, 0, 0, 0};
            if (ms_dist_send_frame(fd, &w, NULL, deadline, 0, &e) == NET_OK) {
                fds[f.a] = fd;
                snprintf(addrs[f.a], 64, "%s", addr);
                have++;
                continue;
            }
            snprintf(refused, sizeof refused, "lost %s %u (%s) during the handshake", unit, f.a, addr);
        }
        ms_dist_close(&fd);
    }
    if (have == size) return MS_OK;
    char missing[200] = "";
    size_t off = 0;
    for (int r = 1; r < size && off < sizeof missing - 8; r++)
        if (fds[r] < 0) off += (size_t)snprintf(missing + off, sizeof missing - off, "%s%d", off ? ", " : "", r);
    for (int r = 1; r < size; r++) ms_dist_close(&fds[r]);
    return ms_errf(err, MS_ERR_RUNTIME, "%s %s 0: %s(s) %s did not connect before the timeout%s%s", what, unit, unit, missing,
                   refused[0] ? "; last: " : "", refused);
}
