/* test_reasoning.c - the glm45 reasoning parser against expectations written from
 * reference/glm5-spec.md section 5.3, non-streaming and streamed at every split. */
#include "server/reasoning.h"
#include "test.h"

#include <stdlib.h>

typedef struct {
    const char *name;
    int force;
    const char *text;
    const char *reasoning; /* expected */
    const char *content;
} rcase;

static const rcase CASES[] = {
    {"forced", 1, "I think.</think>Answer.", "I think.", "Answer."},
    {"forced_with_start_tag", 1, "<think>I think.</think>Answer.", "I think.", "Answer."},
    {"unforced_tagged", 0, "<think>R</think>C", "R", "C"},
    {"unforced_plain", 0, "Just answer.", "", "Just answer."},
    {"thinking_off_plain", 0, "Hello <b>world</b>", "", "Hello <b>world</b>"},
    {"truncated", 1, "Still thinking about <it", "Still thinking about <it", ""},
    {"tool_closes_reasoning", 1,
     "R<tool_call>get<arg_key>a</arg_key><arg_value>1</arg_value></tool_call>", "R",
     "<tool_call>get<arg_key>a</arg_key><arg_value>1</arg_value></tool_call>"},
    {"tool_after_answer", 1, "R</think>Sure.<tool_call>f</tool_call>", "R",
     "Sure.<tool_call>f</tool_call>"},
    {"only_end_tag", 1, "</think>", "", ""},
    {"near_miss_tags", 1, "x</thinky> <tool_cal </think >", "x</thinky> <tool_cal </think >", ""},
    {"whitespace_kept", 1, "\nR\n</think>\n\nC ", "\nR\n", "\n\nC "},
    {"start_tag_only", 0, "<think>", "", ""},
    {"unicode", 1, "思考中…</think>答案是 4。", "思考中…", "答案是 4。"},
    {"second_end_tag_is_content", 1, "a</think>b</think>c", "a", "b</think>c"},
};
#define NCASES (int)(sizeof CASES / sizeof CASES[0])

static int stream_split(const rcase *c, const size_t *cuts, int ncuts, ms_sbuf *r, ms_sbuf *ct) {
    ms_reasoning p;
    ms_reasoning_init(&p, c->force);
    size_t n = strlen(c->text), prev = 0;
    for (int i = 0; i <= ncuts; i++) {
        size_t at = i < ncuts ? cuts[i] : n;
        ms_reasoning_push(&p, c->text + prev, at - prev, r, ct);
        prev = at;
    }
    ms_reasoning_finish(&p, r, ct);
    ms_reasoning_free(&p);
    return 0;
}

static int check_stream(const rcase *c, const size_t *cuts, int ncuts) {
    ms_sbuf r = {0}, ct = {0};
    stream_split(c, cuts, ncuts, &r, &ct);
    int ok = !strcmp(ms_sbuf_str(&r), c->reasoning) && !strcmp(ms_sbuf_str(&ct), c->content);
    if (!ok)
        fprintf(stderr, "  case %s cuts=%d: got reasoning=[%s] content=[%s]\n", c->name, ncuts,
                ms_sbuf_str(&r), ms_sbuf_str(&ct));
    ms_sbuf_free(&r);
    ms_sbuf_free(&ct);
    return ok;
}

static void test_nonstreaming(void) {
    for (int i = 0; i < NCASES; i++) {
        const rcase *c = &CASES[i];
        ms_sbuf r = {0}, ct = {0};
        ms_reasoning_parse(c->text, strlen(c->text), c->force, &r, &ct);
        CHECK_MSG(!strcmp(ms_sbuf_str(&r), c->reasoning), "%s reasoning [%s]", c->name, ms_sbuf_str(&r));
        CHECK_MSG(!strcmp(ms_sbuf_str(&ct), c->content), "%s content [%s]", c->name, ms_sbuf_str(&ct));
        ms_sbuf_free(&r);
        ms_sbuf_free(&ct);
    }
}

static void test_stream_whole(void) {
    for (int i = 0; i < NCASES; i++) CHECK(check_stream(&CASES[i], NULL, 0));
}

static void test_stream_bytewise(void) {
    for (int i = 0; i < NCASES; i++) {
        size_t n = strlen(CASES[i].text);
        int nc;
        size_t *cuts = t_cuts_every_byte(n, &nc);
        CHECK(check_stream(&CASES[i], cuts, nc));
        free(cuts);
    }
}

static void test_stream_every_split_pair(void) {
    /* every pair of cut points (covers every single cut too) */
    for (int i = 0; i < NCASES; i++) {
        size_t n = strlen(CASES[i].text);
        int bad = 0;
        for (size_t a = 0; a <= n && !bad; a++)
            for (size_t b = a; b <= n && !bad; b++) {
                size_t cuts[2] = {a, b};
                if (!check_stream(&CASES[i], cuts, 2)) bad = 1;
            }
        CHECK_MSG(!bad, "%s", CASES[i].name);
    }
}

/* GLM token boundaries: tags are single tokens, text comes in word pieces. */
static void test_stream_glm_tokens(void) {
    const char *toks[] = {"I", " think", " about", " 2", "+", "2", ".", "</think>", "\n\n", "It",
                          " is", " 4", "."};
    ms_reasoning p;
    ms_reasoning_init(&p, 1);
    ms_sbuf r = {0}, ct = {0};
    int deltas_r = 0;
    for (size_t i = 0; i < sizeof toks / sizeof toks[0]; i++) {
        size_t before = r.len;
        ms_reasoning_push(&p, toks[i], strlen(toks[i]), &r, &ct);
        if (r.len > before) deltas_r++;
    }
    ms_reasoning_finish(&p, &r, &ct);
    CHECK_STR(ms_sbuf_str(&r), "I think about 2+2.");
    CHECK_STR(ms_sbuf_str(&ct), "\n\nIt is 4.");
    CHECK_EQ_INT(deltas_r, 7); /* every reasoning token goes out as soon as it arrives */
    ms_reasoning_free(&p);
    ms_sbuf_free(&r);
    ms_sbuf_free(&ct);
}

static void test_helpers(void) {
    CHECK_EQ_INT(ms_find("abc</think>", 11, "</think>"), 3);
    CHECK_EQ_INT(ms_find("abc", 3, "abcd"), -1);
    CHECK_EQ_INT(ms_partial_tail("xx</thi", 7, "</think>"), 5);
    CHECK_EQ_INT(ms_partial_tail("xx</think>", 10, "</think>"), 0);
    CHECK_EQ_INT(ms_partial_tail("<", 1, "<tool_call>"), 1);
}

int main(void) {
    RUN(test_helpers);
    RUN(test_nonstreaming);
    RUN(test_stream_whole);
    RUN(test_stream_bytewise);
    RUN(test_stream_every_split_pair);
    RUN(test_stream_glm_tokens);
    return TEST_SUMMARY();
}
