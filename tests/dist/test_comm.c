/* test_comm.c - the host communicators ("local": threads; "tcp": threads and forked processes on
 * 127.0.0.1): every op in both dtypes against a serial rank-order reference, bit for bit; long
 * loops; abort, timeout and peer-death paths, which must fail fast with the rank named, never hang;
 * stray connections refused; the bootstrap blob exchange; the capability helpers. Every wait has a
 * generous guard, no timing is asserted beyond "well within the timeout". */
#include "dist/comm.h"
#include "test.h"
#include "dist_test_util.h"

#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>

/* ---- running one function per rank on threads ---- */
typedef struct rank_arg {
    ms_comm *c;         /* local: given; tcp: made by the thread */
    const char *addr;   /* tcp: --dist-init-addr */
    int rank, size;
    double timeout_s;
    int mode;           /* test-specific */
    int fails;
    int rc;
    char msg[MS_ERR_MSG_MAX];
    double elapsed;
} rank_arg;

typedef void *(*rank_fn)(void *);

static void run_threads(rank_arg *a, int n, rank_fn fn) {
    pthread_t th[16];
    for (int r = 0; r < n; r++) pthread_create(&th[r], NULL, fn, &a[r]);
    for (int r = 0; r < n; r++) pthread_join(th[r], NULL);
}

static const size_t COUNTS_FULL[] = {1, 7, 1000, (size_t)1 << 20};
static const size_t COUNTS_SMALL[] = {1, 7, 1000, 4099};

static void *suite_thread(void *p) {
    rank_arg *a = p;
    a->fails = tu_rank_suite(a->c, a->mode ? COUNTS_SMALL : COUNTS_FULL, 4, 1234);
    return NULL;
}

static void test_local_all_ops(void) {
    for (int n = 1; n <= 4; n++) {
        ms_comm *cs[4];
        ms_err err = {0};
        CHECK(ms_comm_local_create(n, 30.0, cs, &err) == MS_OK);
        rank_arg a[4] = {{0}};
        for (int r = 0; r < n; r++) {
            a[r].c = cs[r];
            CHECK_EQ_INT(cs[r]->rank, r);
            CHECK_EQ_INT(cs[r]->size, n);
            CHECK_STR(cs[r]->name, "local");
        }
        run_threads(a, n, suite_thread);
        for (int r = 0; r < n; r++) {
            CHECK_MSG(a[r].fails == 0, "n=%d rank %d: %d failures", n, r, a[r].fails);
            ms_comm_destroy(cs[r]);
        }
    }
}

static void *loop_thread(void *p) {
    rank_arg *a = p;
    ms_comm *c = a->c;
    ms_err err = {0};
    float v[7];
    for (int it = 0; it < 1000 && !a->fails; it++) {
        for (int i = 0; i < 7; i++) v[i] = (float)(c->rank + it + i);
        if (c->ops->all_reduce_sum(c, v, 7, MS_F32, &err) != MS_OK) {
            a->fails++;
            snprintf(a->msg, sizeof a->msg, "%s", err.msg);
            break;
        }
        float want = 0;
        for (int r = 0; r < c->size; r++) want += (float)(r + it + 3);
        if (v[3] != want) a->fails++;
        if ((it % 7) == 0 && c->ops->barrier(c, &err) != MS_OK) a->fails++;
    }
    return NULL;
}

static void test_local_loop(void) {
    ms_comm *cs[3];
    ms_err err = {0};
    CHECK(ms_comm_local_create(3, 30.0, cs, &err) == MS_OK);
    rank_arg a[3] = {{0}};
    for (int r = 0; r < 3; r++) a[r].c = cs[r];
    run_threads(a, 3, loop_thread);
    for (int r = 0; r < 3; r++) {
        CHECK_MSG(a[r].fails == 0, "rank %d: %s", r, a[r].msg);
        ms_comm_destroy(cs[r]);
    }
}

/* mode 0: rank 0 aborts after 100 ms, the others are blocked in an all_reduce.
 * mode 1: the last rank never arrives (barrier); the others must time out naming it. */
static void *fault_thread(void *p) {
    rank_arg *a = p;
    ms_comm *c = a->c;
    ms_err err = {0};
    double t0 = tu_now();
    float v[4] = {1, 2, 3, 4};
    if (a->mode == 0 && c->rank == 0) {
        tu_sleep(0.1);
        c->ops->abort(c, "test abort cause 42");
        a->rc = MS_OK;
        return NULL;
    }
    if (a->mode == 1 && c->rank == c->size - 1) return NULL;
    a->rc = a->mode == 0 ? c->ops->all_reduce_sum(c, v, 4, MS_F32, &err) : c->ops->barrier(c, &err);
    a->elapsed = tu_now() - t0;
    snprintf(a->msg, sizeof a->msg, "%s", err.msg);
    return NULL;
}

static void test_local_abort(void) {
    ms_comm *cs[3];
    ms_err err = {0};
    CHECK(ms_comm_local_create(3, 20.0, cs, &err) == MS_OK);
    rank_arg a[3] = {{0}};
    for (int r = 0; r < 3; r++) a[r].c = cs[r], a[r].mode = 0;
    run_threads(a, 3, fault_thread);
    for (int r = 1; r < 3; r++) {
        CHECK(a[r].rc != MS_OK);
        CHECK_MSG(strstr(a[r].msg, "test abort cause 42") != NULL, "%s", a[r].msg);
        CHECK_MSG(a[r].elapsed < 10.0, "took %.2f s", a[r].elapsed);
    }
    /* later calls fail with the same cause */
    CHECK(cs[1]->ops->barrier(cs[1], &err) != MS_OK);
    CHECK(strstr(err.msg, "test abort cause 42") != NULL);
    for (int r = 0; r < 3; r++) ms_comm_destroy(cs[r]);
}

static void test_local_timeout(void) {
    ms_comm *cs[3];
    ms_err err = {0};
    double to = 0.5;
    CHECK(ms_comm_local_create(3, to, cs, &err) == MS_OK);
    rank_arg a[3] = {{0}};
    for (int r = 0; r < 3; r++) a[r].c = cs[r], a[r].mode = 1;
    run_threads(a, 3, fault_thread);
    for (int r = 0; r < 2; r++) {
        CHECK(a[r].rc != MS_OK);
        CHECK_MSG(strstr(a[r].msg, "rank(s) 2 did not reach barrier") != NULL, "%s", a[r].msg);
        CHECK_MSG(a[r].elapsed < 2 * to + 0.5, "took %.2f s", a[r].elapsed);
    }
    for (int r = 0; r < 3; r++) ms_comm_destroy(cs[r]);
}

static void *mismatch_thread(void *p) {
    rank_arg *a = p;
    ms_comm *c = a->c;
    ms_err err = {0};
    float v[16] = {0};
    a->rc = c->rank == 1 ? c->ops->all_gather(c, v, v + 8, 4, MS_F32, &err)
                         : c->ops->all_reduce_sum(c, v, 8, MS_F32, &err);
    snprintf(a->msg, sizeof a->msg, "%s", err.msg);
    return NULL;
}

static void test_local_mismatch(void) {
    ms_comm *cs[2];
    ms_err err = {0};
    CHECK(ms_comm_local_create(2, 5.0, cs, &err) == MS_OK);
    rank_arg a[2] = {{0}};
    for (int r = 0; r < 2; r++) a[r].c = cs[r];
    run_threads(a, 2, mismatch_thread);
    for (int r = 0; r < 2; r++) {
        CHECK(a[r].rc != MS_OK);
        CHECK_MSG(strstr(a[r].msg, "rank 1 called all_gather") != NULL, "%s", a[r].msg);
    }
    for (int r = 0; r < 2; r++) ms_comm_destroy(cs[r]);
}

static void test_local_bad_args(void) {
    ms_comm *cs[2];
    ms_err err = {0};
    CHECK(ms_comm_local_create(0, 5.0, cs, &err) == MS_ERR_INVALID);
    CHECK(ms_comm_local_create(2, 0, cs, &err) == MS_ERR_INVALID);
    CHECK(ms_comm_local_create(1, 5.0, cs, &err) == MS_OK);
    int32_t x = 0;
    CHECK(cs[0]->ops->all_reduce_sum(cs[0], &x, 1, MS_I32, &err) == MS_ERR_UNSUPPORTED);
    CHECK(cs[0]->ops->broadcast(cs[0], &x, 4, 1, &err) == MS_ERR_INVALID);
    ms_comm_destroy(cs[0]);
}

/* ---- tcp on threads ---- */
static void *tcp_suite_thread(void *p) {
    rank_arg *a = p;
    ms_err err = {0};
    ms_comm *c = NULL;
    a->rc = ms_comm_tcp_create(a->addr, a->rank, a->size, a->timeout_s, &c, &err);
    if (a->rc != MS_OK) {
        snprintf(a->msg, sizeof a->msg, "%s", err.msg);
        return NULL;
    }
    a->fails = tu_rank_suite(c, a->mode ? COUNTS_SMALL : COUNTS_FULL, 4, 99);
    ms_comm_destroy(c);
    return NULL;
}

static void test_tcp_threads(void) {
    for (int n = 2; n <= 3; n++) {
        char addr[64];
        snprintf(addr, sizeof addr, "127.0.0.1:%d", tu_free_port());
        rank_arg a[3] = {{0}};
        for (int r = 0; r < n; r++) a[r] = (rank_arg){.addr = addr, .rank = r, .size = n, .timeout_s = 20, .mode = n == 3};
        run_threads(a, n, tcp_suite_thread);
        for (int r = 0; r < n; r++) {
            CHECK_MSG(a[r].rc == MS_OK, "n=%d rank %d: %s", n, r, a[r].msg);
            CHECK_MSG(a[r].fails == 0, "n=%d rank %d: %d failures", n, r, a[r].fails);
        }
    }
}

static void test_tcp_single(void) {
    ms_comm *c = NULL;
    ms_err err = {0};
    CHECK(ms_comm_tcp_create("127.0.0.1:1", 0, 1, 1.0, &c, &err) == MS_OK); /* size 1: no socket at all */
    if (c) {
        CHECK_EQ_INT(tu_rank_suite(c, COUNTS_SMALL, 4, 5), 0);
        ms_comm_destroy(c);
    }
    CHECK(ms_comm_tcp_create("nohostport", 0, 2, 1.0, &c, &err) == MS_ERR_INVALID);
    CHECK(strstr(err.msg, "--dist-init-addr") != NULL);
    CHECK(ms_comm_tcp_create("127.0.0.1:70000", 0, 2, 1.0, &c, &err) == MS_ERR_INVALID);
}

/* ---- tcp across processes ---- */
/* Waits for pid with a guard; kills it when the guard passes. Returns its exit status or -1. */
static int wait_child(pid_t pid, double guard_s) {
    double t0 = tu_now();
    for (;;) {
        int st = 0;
        pid_t w = waitpid(pid, &st, WNOHANG);
        if (w == pid) return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
        if (w < 0) return -1;
        if (tu_now() - t0 > guard_s) {
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            return -1;
        }
        tu_sleep(0.01);
    }
}

static void test_tcp_processes(void) {
    for (int n = 2; n <= 3; n++) {
        char addr[64];
        snprintf(addr, sizeof addr, "127.0.0.1:%d", tu_free_port());
        fflush(NULL);
        pid_t kids[3];
        for (int r = 1; r < n; r++) {
            kids[r] = fork();
            if (kids[r] == 0) {
                ms_comm *c = NULL;
                ms_err err = {0};
                if (ms_comm_tcp_create(addr, r, n, 20, &c, &err) != MS_OK) {
                    fprintf(stderr, "child rank %d: %s\n", r, err.msg);
                    _exit(2);
                }
                int f = tu_rank_suite(c, COUNTS_FULL, n == 2 ? 4 : 3, 777);
                ms_comm_destroy(c);
                _exit(f ? 1 : 0);
            }
        }
        ms_comm *c = NULL;
        ms_err err = {0};
        CHECK_MSG(ms_comm_tcp_create(addr, 0, n, 20, &c, &err) == MS_OK, "%s", err.msg);
        if (c) {
            CHECK_EQ_INT(tu_rank_suite(c, COUNTS_FULL, n == 2 ? 4 : 3, 777), 0);
            ms_comm_destroy(c);
        }
        for (int r = 1; r < n; r++) CHECK_EQ_INT(wait_child(kids[r], 60), 0);
    }
}

/* Rank `victim` (a child) dies by SIGKILL after two collectives; the survivors, mid-collective,
 * must fail within the timeout naming it. Rank 0 is the parent unless the victim is rank 0. */
static void kill_case(int victim) {
    const int n = 3;
    const double to = 3.0;
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", tu_free_port());
    int me = victim == 0 ? 1 : 0; /* the parent's rank */
    fflush(NULL);
    pid_t kids[3] = {0};
    for (int r = 0; r < n; r++) {
        if (r == me) continue;
        kids[r] = fork();
        if (kids[r] == 0) {
            ms_comm *c = NULL;
            ms_err err = {0};
            if (ms_comm_tcp_create(addr, r, n, to, &c, &err) != MS_OK) _exit(2);
            float v[1000] = {0};
            for (int it = 0; it < 2; it++)
                if (c->ops->all_reduce_sum(c, v, 1000, MS_F32, &err) != MS_OK) _exit(3);
            if (r == victim) raise(SIGKILL);
            double t0 = tu_now();
            int rc = c->ops->all_reduce_sum(c, v, 1000, MS_F32, &err);
            char want[32];
            snprintf(want, sizeof want, "rank %d", victim);
            int ok = rc != MS_OK && strstr(err.msg, want) && tu_now() - t0 < to + 1.0;
            if (!ok) fprintf(stderr, "child rank %d: rc %d after %.2f s: %s\n", r, rc, tu_now() - t0, err.msg);
            _exit(ok ? 0 : 4);
        }
    }
    ms_comm *c = NULL;
    ms_err err = {0};
    CHECK_MSG(ms_comm_tcp_create(addr, me, n, to, &c, &err) == MS_OK, "%s", err.msg);
    if (c) {
        float v[1000] = {0};
        for (int it = 0; it < 2; it++) CHECK(c->ops->all_reduce_sum(c, v, 1000, MS_F32, &err) == MS_OK);
        double t0 = tu_now();
        int rc = c->ops->all_reduce_sum(c, v, 1000, MS_F32, &err);
        double dt = tu_now() - t0;
        char want[32];
        snprintf(want, sizeof want, "rank %d", victim);
        CHECK(rc != MS_OK);
        CHECK_MSG(strstr(err.msg, want) != NULL, "%s", err.msg);
        CHECK_MSG(dt < to + 1.0, "took %.2f s", dt);
        fprintf(stderr, "  (rank %d saw: %s)\n", me, err.msg);
        ms_comm_destroy(c);
    }
    for (int r = 0; r < n; r++) {
        if (r == me) continue;
        int st = wait_child(kids[r], 30);
        if (r == victim) CHECK_EQ_INT(st, -1); /* killed */
        else CHECK_EQ_INT(st, 0);
    }
}

static void test_tcp_peer_killed(void) { kill_case(2); }
static void test_tcp_hub_killed(void) { kill_case(0); }

/* A stray connection that does not speak the protocol is refused; the group still forms. */
static void *tcp_barrier_thread(void *p) {
    rank_arg *a = p;
    ms_err err = {0};
    ms_comm *c = NULL;
    a->rc = ms_comm_tcp_create(a->addr, a->rank, a->size, a->timeout_s, &c, &err);
    if (a->rc == MS_OK) a->rc = c->ops->barrier(c, &err);
    snprintf(a->msg, sizeof a->msg, "%s", err.msg);
    ms_comm_destroy(c);
    return NULL;
}

static int raw_connect(int port, double guard) {
    double t0 = tu_now();
    while (tu_now() - t0 < guard) {
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in sa = {0};
        sa.sin_family = AF_INET;
        sa.sin_port = htons((uint16_t)port);
        sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        if (connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0) return fd;
        close(fd);
        tu_sleep(0.02);
    }
    return -1;
}

static void test_tcp_bad_magic(void) {
    int port = tu_free_port();
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
    rank_arg a0 = {.addr = addr, .rank = 0, .size = 2, .timeout_s = 10};
    pthread_t th;
    pthread_create(&th, NULL, tcp_barrier_thread, &a0);
    int fd = raw_connect(port, 5);
    CHECK(fd >= 0);
    if (fd >= 0) {
        char junk[24] = "GET / HTTP/1.0\r\n\r\n";
        CHECK(write(fd, junk, sizeof junk) == (ssize_t)sizeof junk);
        struct timeval tv = {5, 0};
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        char b[64];
        CHECK(read(fd, b, sizeof b) <= 0); /* closed on us (no reply for a non-peer) */
        close(fd);
    }
    rank_arg a1 = {.addr = addr, .rank = 1, .size = 2, .timeout_s = 10};
    tcp_barrier_thread(&a1);
    pthread_join(th, NULL);
    CHECK_MSG(a0.rc == MS_OK, "%s", a0.msg);
    CHECK_MSG(a1.rc == MS_OK, "%s", a1.msg);
}

/* A listener that is not moeserve: the connecting rank fails with a sentence saying so. */
static void *junk_server(void *p) {
    int lfd = *(int *)p;
    int fd = accept(lfd, NULL, NULL);
    if (fd >= 0) {
        char junk[64] = "HTTP/1.1 400 Bad Request\r\n\r\n";
        if (write(fd, junk, sizeof junk) < 0) {}
        tu_sleep(0.3);
        close(fd);
    }
    return NULL;
}

static void test_tcp_not_a_peer(void) {
    int lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {0};
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t sl = sizeof sa;
    CHECK(bind(lfd, (struct sockaddr *)&sa, sizeof sa) == 0 && listen(lfd, 4) == 0);
    getsockname(lfd, (struct sockaddr *)&sa, &sl);
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", ntohs(sa.sin_port));
    pthread_t th;
    pthread_create(&th, NULL, junk_server, &lfd);
    ms_comm *c = NULL;
    ms_err err = {0};
    CHECK(ms_comm_tcp_create(addr, 1, 2, 3.0, &c, &err) != MS_OK);
    CHECK_MSG(strstr(err.msg, "not a moeserve peer") != NULL, "%s", err.msg);
    pthread_join(th, NULL);
    close(lfd);
}

static void test_tcp_missing_rank(void) {
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", tu_free_port());
    rank_arg a[2] = {{.addr = addr, .rank = 0, .size = 3, .timeout_s = 1.0}, {.addr = addr, .rank = 1, .size = 3, .timeout_s = 1.0}};
    double t0 = tu_now();
    run_threads(a, 2, tcp_barrier_thread);
    CHECK(a[0].rc != MS_OK);
    CHECK_MSG(strstr(a[0].msg, "rank(s) 2 did not connect") != NULL, "%s", a[0].msg);
    CHECK(a[1].rc != MS_OK); /* rank 0 gave up on the group */
    CHECK(tu_now() - t0 < 5.0);
}

static void *tcp_abort_thread(void *p) {
    rank_arg *a = p;
    ms_err err = {0};
    ms_comm *c = NULL;
    a->rc = ms_comm_tcp_create(a->addr, a->rank, a->size, a->timeout_s, &c, &err);
    if (a->rc != MS_OK) return NULL;
    float v[8] = {0};
    if (a->rank == 1) {
        tu_sleep(0.2);
        c->ops->abort(c, "operator pressed stop");
        a->rc = c->ops->barrier(c, &err);
    } else {
        double t0 = tu_now();
        a->rc = c->ops->all_reduce_sum(c, v, 8, MS_F32, &err);
        a->elapsed = tu_now() - t0;
    }
    snprintf(a->msg, sizeof a->msg, "%s", err.msg);
    ms_comm_destroy(c);
    return NULL;
}

static void test_tcp_abort(void) {
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", tu_free_port());
    rank_arg a[3];
    for (int r = 0; r < 3; r++) a[r] = (rank_arg){.addr = addr, .rank = r, .size = 3, .timeout_s = 20};
    run_threads(a, 3, tcp_abort_thread);
    CHECK_MSG(strstr(a[1].msg, "operator pressed stop") != NULL, "%s", a[1].msg);
    for (int r = 0; r < 3; r += 2) {
        CHECK(a[r].rc != MS_OK);
        CHECK_MSG(strstr(a[r].msg, "rank 1") != NULL, "rank %d: %s", r, a[r].msg);
        CHECK_MSG(a[r].elapsed < 10, "rank %d took %.2f s", r, a[r].elapsed);
    }
}

/* ---- bootstrap and helpers ---- */
static void *boot_thread(void *p) {
    rank_arg *a = p;
    ms_err err = {0};
    unsigned char blob[MS_COMM_NCCL_ID_BYTES];
    for (int i = 0; i < (int)sizeof blob; i++) blob[i] = a->rank == 0 ? (unsigned char)(i * 7 + 3) : 0;
    a->rc = ms_dist_bootstrap_share(a->addr, a->rank, a->size, a->timeout_s, blob, sizeof blob, &err);
    for (int i = 0; i < (int)sizeof blob; i++)
        if (blob[i] != (unsigned char)(i * 7 + 3)) a->fails++;
    snprintf(a->msg, sizeof a->msg, "%s", err.msg);
    return NULL;
}

static void test_bootstrap(void) {
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", tu_free_port());
    rank_arg a[3];
    for (int r = 0; r < 3; r++) a[r] = (rank_arg){.addr = addr, .rank = r, .size = 3, .timeout_s = 10};
    run_threads(a, 3, boot_thread);
    for (int r = 0; r < 3; r++) {
        CHECK_MSG(a[r].rc == MS_OK, "%s", a[r].msg);
        CHECK_EQ_INT(a[r].fails, 0);
    }
    /* a follower alone: no node 0 -> a clear error within the timeout */
    rank_arg lone = {.addr = addr, .rank = 1, .size = 2, .timeout_s = 0.5};
    double t0 = tu_now();
    boot_thread(&lone);
    CHECK(lone.rc != MS_OK);
    CHECK_MSG(strstr(lone.msg, "bootstrap at") && strstr(lone.msg, "could not connect"), "%s", lone.msg);
    CHECK(tu_now() - t0 < 3.0);
}

static void test_kind_and_available(void) {
    CHECK_STR(ms_comm_kind_for_backend("cpu", 1), "local");
    CHECK_STR(ms_comm_kind_for_backend("cpu", 2), "tcp");
    CHECK_STR(ms_comm_kind_for_backend("cuda", 1), "nccl");
    CHECK_STR(ms_comm_kind_for_backend("cuda", 4), "nccl");
    char why[256] = "";
    CHECK(ms_dist_available("local", why, sizeof why) == 1);
    CHECK(ms_dist_available("tcp", why, sizeof why) == 1);
    CHECK(ms_dist_available("bogus", why, sizeof why) == 0);
    CHECK(strstr(why, "bogus") != NULL);
    why[0] = 0;
    if (!ms_dist_available("nccl", why, sizeof why)) CHECK(why[0] != 0);
}

int main(void) {
    signal(SIGPIPE, SIG_IGN);
    RUN(test_local_all_ops);
    RUN(test_local_loop);
    RUN(test_local_abort);
    RUN(test_local_timeout);
    RUN(test_local_mismatch);
    RUN(test_local_bad_args);
    RUN(test_tcp_single);
    RUN(test_tcp_threads);
    RUN(test_tcp_processes);
    RUN(test_tcp_peer_killed);
    RUN(test_tcp_hub_killed);
    RUN(test_tcp_bad_magic);
    RUN(test_tcp_not_a_peer);
    RUN(test_tcp_missing_rank);
    RUN(test_tcp_abort);
    RUN(test_bootstrap);
    RUN(test_kind_and_available);
    return TEST_SUMMARY();
}
