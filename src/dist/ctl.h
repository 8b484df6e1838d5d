/* ctl.h - the control channel of a multi-node run: node 0 (HTTP + scheduler) sends every step's
 * batch plan to the other nodes, which run the same forward on their ranks.
 *
 * One TCP connection per follower node to node 0, length-prefixed frames with the moeserve magic
 * (a stray or mistaken connection is refused with a sentence). The plan bytes are opaque here.
 * Node 0 never waits for followers except to hand them the bytes (bounded by timeout_s); a
 * follower that closes its connection (process died) is reported by name on the next send or
 * ms_dist_ctl_check; a follower notices node 0's death at once, even while idle. */
#ifndef MS_DIST_CTL_H
#define MS_DIST_CTL_H

#include "core/status.h"

#include <stddef.h>

typedef struct ms_dist_ctl ms_dist_ctl;

/* The control channel's address for a --dist-init-addr "HOST:PORT": "HOST:PORT+1" (the port
 * beside the communicator's / bootstrap's). */
int ms_dist_ctl_addr(const char *init_addr, char *out, size_t out_size, ms_err *err);

/* Opens node node_rank's end of the channel at host_port for nnodes nodes: node 0 listens and
 * waits for nodes 1..nnodes-1 (refusing strays, naming the missing nodes on timeout); the others
 * connect (retrying until timeout_s). nnodes == 1 gives a channel whose sends do nothing. The
 * caller owns *out (ms_dist_ctl_close). */
int ms_dist_ctl_open(const char *host_port, int node_rank, int nnodes, double timeout_s, ms_dist_ctl **out,
                     ms_err *err);

/* Node 0: sends msg[0..n) to every follower, in order, each within timeout_s. A follower that is
 * gone or does not take the bytes in time fails the call with its node number and address; the
 * channel is then broken. Messages arrive in the order sent. */
int ms_dist_ctl_send_all(ms_dist_ctl *c, const void *msg, size_t n, ms_err *err);

/* Node 0: tells every follower to stop (they get *msg == NULL from recv), best effort within
 * timeout_s; returns the first failure but tries every follower. */
int ms_dist_ctl_shutdown(ms_dist_ctl *c, ms_err *err);

/* Node 0: non-blocking health check; fails naming the first follower whose connection is closed
 * (followers never send, so anything readable means it is gone). MS_OK on followers. */
int ms_dist_ctl_check(ms_dist_ctl *c, ms_err *err);

/* Follower: waits for the next message. wait_s < 0 waits forever (an idle server) but still fails
 * at once when node 0's connection closes; otherwise at most wait_s for the message to start (then
 * timeout_s for the rest). On success *msg and *n give the message, in a buffer the channel owns and
 * reuses at the next recv; *msg == NULL, *n == 0 means node 0 sent shutdown. */
int ms_dist_ctl_recv(ms_dist_ctl *c, const void **msg, size_t *n, double wait_s, ms_err *err);

/* Thread-safe: makes a recv/send blocked in another thread, and every later call, fail with `why`
 * (shuts the sockets down). */
void ms_dist_ctl_abort(ms_dist_ctl *c, const char *why);

/* Closes the channel (NULL is fine). Not concurrent with other calls on c (abort first). */
void ms_dist_ctl_close(ms_dist_ctl *c);

#endif
