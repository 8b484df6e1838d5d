/* request.c - request allocation: everything a request needs while running is sized here once. */
#include "sched/request.h"

#include <stdlib.h>
#include <string.h>

ms_request *ms_request_create(uint64_t id, const int32_t *prompt, int n_prompt, int max_new, int page_size) {
    if (n_prompt < 1 || max_new < 0 || page_size < 1 || n_prompt > INT32_MAX - max_new) return NULL;
    ms_request *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    r->id = id;
    r->cap_tokens = n_prompt + max_new;
    r->cap_pages = (r->cap_tokens + page_size - 1) / page_size;
    r->tokens = malloc((size_t)r->cap_tokens * sizeof *r->tokens);
    r->pages = malloc((size_t)r->cap_pages * sizeof *r->pages);
    if (!r->tokens || !r->pages) {
        ms_request_free(r);
        return NULL;
    }
    memcpy(r->tokens, prompt, (size_t)n_prompt * sizeof *prompt);
    r->n_tokens = r->n_prompt = n_prompt;
    r->max_new = max_new;
    return r;
}

void ms_request_free(ms_request *r) {
    if (!r) return;
    free(r->tokens);
    free(r->pages);
    free(r);
}
