/* reasoning.h - splits a model's output into reasoning_content and content, with the semantics of
 * SGLang's `glm45` reasoning parser (spec: reference/glm5-spec.md section 5.3).
 *
 * GLM models think inside <think>...</think>; with thinking on, the chat template already opened
 * the block, so generated text starts inside it ("force_reasoning"). A <tool_call> also closes
 * reasoning. The streaming parser holds back any tail of its buffer that could be the start of a
 * tag, so text split at any byte boundary gives the same concatenated result as token-aligned
 * input (SGLang holds back only a buffer that is entirely a tag prefix; for GLM, where the tags
 * are single tokens, both behave the same). */
#ifndef MS_SERVER_REASONING_H
#define MS_SERVER_REASONING_H

#include "server/sbuf.h"

#include <stddef.h>

typedef struct ms_reasoning {
    int in_reasoning;   /* currently inside the reasoning block */
    int stripped_start; /* the opening <think> was seen and removed */
    ms_sbuf buf;        /* text held back (possible start of a tag) */
} ms_reasoning;

/* force_reasoning: generation starts inside the reasoning block (thinking enabled). */
void ms_reasoning_init(ms_reasoning *r, int force_reasoning);
void ms_reasoning_free(ms_reasoning *r);

/* Streaming: feeds the next text delta; appends whatever is decided to *reasoning and *content. */
void ms_reasoning_push(ms_reasoning *r, const char *text, size_t n, ms_sbuf *reasoning,
                       ms_sbuf *content);
/* End of stream: flushes held-back text to the channel the parser is in. */
void ms_reasoning_finish(ms_reasoning *r, ms_sbuf *reasoning, ms_sbuf *content);

/* Non-streaming split of a whole completion (appends to both outputs). */
void ms_reasoning_parse(const char *text, size_t n, int force_reasoning, ms_sbuf *reasoning,
                        ms_sbuf *content);

/* Helpers shared with the other parsers. ms_find: first index of needle in hay[0..n) or -1.
 * ms_partial_tail: length of the longest proper suffix of s[0..n) that is a proper prefix of tag. */
long ms_find(const char *hay, size_t n, const char *needle);
size_t ms_partial_tail(const char *s, size_t n, const char *tag);

#endif
