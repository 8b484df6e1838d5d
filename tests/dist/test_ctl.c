/* test_ctl.c - the step-plan control channel: plans of every size arrive in order on every
 * follower; shutdown; a follower's death is named on node 0 (send and check); node 0's death or an
 * abort wakes an idle follower at once; strays and wrong-channel peers are refused. */
#include "dist/ctl.h"
#include "test.h"
#include "dist_test_util.h"

#include <pthread.h>
#include <signal.h>

typedef struct fol_arg {
    const char *addr;
    int node, nnodes, mode;
    int got, bad, shutdown_seen, rc;
    double elapsed;
    char msg[MS_ERR_MSG_MAX];
    ms_dist_ctl *ctl;
} fol_arg;

static size_t plan_size(int i) {
    static const size_t s[] = {0, 1, 17, 1000, 100000};
    return s[i % 5];
}

static void *follower(void *p) {
    fol_arg *a = p;
    ms_err err = {0};
    ms_dist_ctl *c = NULL;
    a->rc = ms_dist_ctl_open(a->addr, a->node, a->nnodes, 10, &c, &err);
    if (a->rc != MS_OK) {
        snprintf(a->msg, sizeof a->msg, "%s", err.msg);
        return NULL;
    }
    for (int i = 0; i < 1000; i++) {
        const void *m;
        size_t n;
        if ((a->rc = ms_dist_ctl_recv(c, &m, &n, -1, &err)) != MS_OK) break;
        if (!m) {
            a->shutdown_seen = 1;
            break;
        }
        const unsigned char *b = m;
        if (n != plan_size(i)) a->bad++;
        for (size_t k = 0; k < n; k++)
            if (b[k] != (unsigned char)(i + k)) {
                a->bad++;
                break;
            }
        a->got++;
    }
    snprintf(a->msg, sizeof a->msg, "%s", err.msg);
    ms_dist_ctl_close(c);
    return NULL;
}

static void test_plans(void) {
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", tu_free_port());
    fol_arg f[3];
    pthread_t th[3];
    for (int r = 1; r < 3; r++) {
        f[r] = (fol_arg){.addr = addr, .node = r, .nnodes = 3};
        pthread_create(&th[r], NULL, follower, &f[r]);
    }
    ms_dist_ctl *c = NULL;
    ms_err err = {0};
    CHECK_MSG(ms_dist_ctl_open(addr, 0, 3, 10, &c, &err) == MS_OK, "%s", err.msg);
    unsigned char *buf = malloc(100000);
    for (int i = 0; c && i < 100; i++) {
        for (size_t k = 0; k < plan_size(i); k++) buf[k] = (unsigned char)(i + k);
        CHECK_MSG(ms_dist_ctl_send_all(c, buf, plan_size(i), &err) == MS_OK, "%s", err.msg);
        CHECK(ms_dist_ctl_check(c, &err) == MS_OK);
    }
    if (c) CHECK(ms_dist_ctl_shutdown(c, &err) == MS_OK);
    for (int r = 1; r < 3; r++) {
        pthread_join(th[r], NULL);
        CHECK_MSG(f[r].rc == MS_OK, "%s", f[r].msg);
        CHECK_EQ_INT(f[r].got, 100);
        CHECK_EQ_INT(f[r].bad, 0);
        CHECK(f[r].shutdown_seen);
    }
    free(buf);
    ms_dist_ctl_close(c);
}

static void test_single_node_and_addr(void) {
    ms_dist_ctl *c = NULL;
    ms_err err = {0};
    CHECK(ms_dist_ctl_open("127.0.0.1:1", 0, 1, 1, &c, &err) == MS_OK);
    CHECK(ms_dist_ctl_send_all(c, "x", 1, &err) == MS_OK);
    CHECK(ms_dist_ctl_check(c, &err) == MS_OK);
    ms_dist_ctl_close(c);
    char out[64];
    CHECK(ms_dist_ctl_addr("10.0.0.1:5000", out, sizeof out, &err) == MS_OK);
    CHECK_STR(out, "10.0.0.1:5001");
    CHECK(ms_dist_ctl_addr("10.0.0.1:65535", out, sizeof out, &err) == MS_ERR_INVALID);
    CHECK(ms_dist_ctl_open("127.0.0.1:1", 3, 2, 1, &c, &err) == MS_ERR_INVALID);
    CHECK(strstr(err.msg, "--node-rank") != NULL);
}

/* A follower that goes away: node 0's check and next send name it. */
static void *follower_quits(void *p) {
    fol_arg *a = p;
    ms_err err = {0};
    a->rc = ms_dist_ctl_open(a->addr, a->node, a->nnodes, 10, &a->ctl, &err);
    snprintf(a->msg, sizeof a->msg, "%s", err.msg);
    return NULL;
}

static void test_follower_dies(void) {
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", tu_free_port());
    fol_arg f = {.addr = addr, .node = 1, .nnodes = 2};
    pthread_t th;
    pthread_create(&th, NULL, follower_quits, &f);
    ms_dist_ctl *c = NULL;
    ms_err err = {0};
    CHECK_MSG(ms_dist_ctl_open(addr, 0, 2, 10, &c, &err) == MS_OK, "%s", err.msg);
    pthread_join(th, NULL);
    CHECK(f.rc == MS_OK);
    if (!c || f.rc != MS_OK) return;
    CHECK(ms_dist_ctl_check(c, &err) == MS_OK);
    ms_dist_ctl_close(f.ctl);
    double t0 = tu_now();
    int rc = MS_OK;
    while (rc == MS_OK && tu_now() - t0 < 5) {
        rc = ms_dist_ctl_check(c, &err);
        tu_sleep(0.01);
    }
    CHECK(rc != MS_OK);
    CHECK_MSG(strstr(err.msg, "node 1") && strstr(err.msg, "closed"), "%s", err.msg);
    CHECK(ms_dist_ctl_send_all(c, "x", 1, &err) != MS_OK); /* broken from now on */
    CHECK(strstr(err.msg, "node 1") != NULL);
    ms_dist_ctl_close(c);
}

/* node 0 closes: an idle follower (infinite wait) fails at once, naming node 0. */
static void *idle_follower(void *p) {
    fol_arg *a = p;
    ms_err err = {0};
    ms_dist_ctl *c = NULL;
    a->rc = ms_dist_ctl_open(a->addr, a->node, a->nnodes, 10, &c, &err);
    if (a->rc == MS_OK) {
        a->ctl = c;
        double t0 = tu_now();
        const void *m;
        size_t n;
        a->rc = ms_dist_ctl_recv(c, &m, &n, a->mode ? 0.3 : -1, &err);
        a->elapsed = tu_now() - t0;
    }
    snprintf(a->msg, sizeof a->msg, "%s", err.msg);
    return NULL;
}

static void test_node0_dies(void) {
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", tu_free_port());
    fol_arg f = {.addr = addr, .node = 1, .nnodes = 2};
    pthread_t th;
    pthread_create(&th, NULL, idle_follower, &f);
    ms_dist_ctl *c = NULL;
    ms_err err = {0};
    CHECK_MSG(ms_dist_ctl_open(addr, 0, 2, 10, &c, &err) == MS_OK, "%s", err.msg);
    tu_sleep(0.2);
    double t0 = tu_now();
    ms_dist_ctl_close(c);
    pthread_join(th, NULL);
    CHECK(f.rc != MS_OK);
    CHECK_MSG(strstr(f.msg, "node 0") && strstr(f.msg, "closed"), "%s", f.msg);
    CHECK(tu_now() - t0 < 3.0);
    ms_dist_ctl_close(f.ctl);
}

static void test_abort_wakes_and_timeout(void) {
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", tu_free_port());
    fol_arg f = {.addr = addr, .node = 1, .nnodes = 2};
    pthread_t th;
    pthread_create(&th, NULL, idle_follower, &f);
    ms_dist_ctl *c = NULL;
    ms_err err = {0};
    CHECK_MSG(ms_dist_ctl_open(addr, 0, 2, 10, &c, &err) == MS_OK, "%s", err.msg);
    double t0 = tu_now();
    while (!__atomic_load_n(&f.ctl, __ATOMIC_SEQ_CST) && tu_now() - t0 < 5) tu_sleep(0.01);
    tu_sleep(0.1);
    if (f.ctl) ms_dist_ctl_abort(f.ctl, "server stopping");
    pthread_join(th, NULL);
    CHECK(f.rc != MS_OK);
    CHECK_MSG(strstr(f.msg, "server stopping") != NULL, "%s", f.msg);
    ms_dist_ctl_close(f.ctl);
    ms_dist_ctl_close(c);

    /* finite wait: nothing sent -> an error naming node 0 after the wait */
    snprintf(addr, sizeof addr, "127.0.0.1:%d", tu_free_port());
    f = (fol_arg){.addr = addr, .node = 1, .nnodes = 2, .mode = 1};
    pthread_create(&th, NULL, idle_follower, &f);
    CHECK_MSG(ms_dist_ctl_open(addr, 0, 2, 10, &c, &err) == MS_OK, "%s", err.msg);
    pthread_join(th, NULL);
    CHECK(f.rc != MS_OK);
    CHECK_MSG(strstr(f.msg, "sent no message within") != NULL, "%s", f.msg);
    CHECK(f.elapsed < 2.0);
    ms_dist_ctl_close(f.ctl);
    ms_dist_ctl_close(c);
}

/* A communicator peer knocking on the control port is refused with a sentence. */
#include "dist/comm.h"
static void *ctl_node0(void *p) {
    fol_arg *a = p;
    ms_err err = {0};
    ms_dist_ctl *c = NULL;
    a->rc = ms_dist_ctl_open(a->addr, 0, 2, 1.5, &c, &err);
    snprintf(a->msg, sizeof a->msg, "%s", err.msg);
    ms_dist_ctl_close(c);
    return NULL;
}

static void test_wrong_channel(void) {
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", tu_free_port());
    fol_arg n0 = {.addr = addr};
    pthread_t th;
    pthread_create(&th, NULL, ctl_node0, &n0);
    ms_comm *c = NULL;
    ms_err err = {0};
    CHECK(ms_comm_tcp_create(addr, 1, 2, 1.5, &c, &err) != MS_OK);
    CHECK_MSG(strstr(err.msg, "refused") && strstr(err.msg, "control channel"), "%s", err.msg);
    pthread_join(th, NULL);
    CHECK(n0.rc != MS_OK);
    CHECK_MSG(strstr(n0.msg, "node(s) 1 did not connect"), "%s", n0.msg);
}

int main(void) {
    signal(SIGPIPE, SIG_IGN);
    RUN(test_plans);
    RUN(test_single_node_and_addr);
    RUN(test_follower_dies);
    RUN(test_node0_dies);
    RUN(test_abort_wakes_and_timeout);
    RUN(test_wrong_channel);
    return TEST_SUMMARY();
}
