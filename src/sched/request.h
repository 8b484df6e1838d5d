/* request.h - one generation request as the scheduler and engine see it.
 *
 * All per-request memory is sized at creation (tokens for prompt + max_new, page ids for that many
 * tokens), so running the request never allocates. `tokens` is the whole sequence: prompt, then
 * generated tokens; the KV of the first n_computed of them lives in `pages` (page j holds positions
 * j*page_size .. j*page_size+page_size-1). After preemption n_computed drops to 0 and the sequence,
 * generated tokens included, is recomputed (partly from the prefix cache). */
#ifndef MS_SCHED_REQUEST_H
#define MS_SCHED_REQUEST_H

#include <stdint.h>

enum ms_req_state { MS_REQ_NEW = 0, MS_REQ_WAITING, MS_REQ_RUNNING, MS_REQ_FINISHED };

typedef struct ms_request {
    uint64_t id;
    int state;               /* enum ms_req_state */
    int32_t *tokens;         /* [cap_tokens] prompt then generated */
    int n_tokens, n_prompt, cap_tokens;
    int max_new;             /* generated tokens at most (cap_tokens = n_prompt + max_new) */
    int n_computed;          /* leading tokens whose KV is written in pages */
    int spec_n;              /* speculative decoding: the last spec_n tokens are draft tokens, tentative
                              * until the next step verifies them (0 = none); pages then cover every
                              * token, drafts included */
    int32_t *pages;          /* [cap_pages] one pool reference each */
    int n_pages, cap_pages;
    int32_t lock_node;       /* radix node locked for the matched prefix (0 = none) */
    int n_cached;            /* prompt tokens served from the prefix cache at first admission */
    int admitted_once;
    int n_preempted;
    struct ms_request *prev, *next; /* links in the waiting or running list */
    /* scheduler scratch for the step being built */
    int step_new;            /* tokens of this request in the current batch */
    uint64_t step_id;        /* step in which step_new is valid */
    void *owner;             /* what the layer above keeps per request (the engine's sampling state);
                              * not touched here, freed by the owner */
} ms_request;

/* Creates a request with a copy of prompt[0..n_prompt) and room for max_new generated tokens,
 * with page size page_size. Returns NULL on OOM. */
ms_request *ms_request_create(uint64_t id, const int32_t *prompt, int n_prompt, int max_new, int page_size);
/* Frees the request's memory (it must hold no pages any more). NULL is a no-op. */
void ms_request_free(ms_request *r);

static inline int ms_request_n_generated(const ms_request *r) { return r->n_tokens - r->n_prompt; }

#endif
