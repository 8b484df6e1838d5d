/* toolcall.c - glm45/glm47 tool-call parsing, non-streaming and streaming (see toolcall.h).
 *
 * The two paths are written independently (a scan over the whole text, and a state machine fed
 * deltas) and the tests check they agree on every split of the input. */
#include "server/toolcall.h"

#include "core/status.h"
#include "server/reasoning.h"

#include <ctype.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <utf8proc.h>

static const char TC_START[] = "<tool_call>";
static const char TC_END[] = "</tool_call>";
static const char KEY_START[] = "<arg_key>";
static const char KEY_END[] = "</arg_key>";
static const char VAL_START[] = "<arg_value>";
static const char VAL_END[] = "</arg_value>";
#define TLEN(t) (sizeof(t) - 1)

int ms_tool_format_parse(const char *name) {
    if (!name) return -1;
    if (!strcmp(name, "glm47") || !strcmp(name, "glm5")) return MS_TOOL_GLM47;
    if (!strcmp(name, "glm45") || !strcmp(name, "glm")) return MS_TOOL_GLM45;
    return -1;
}

void ms_tool_call_id(char out[32]) {
    unsigned char r[12];
    if (getrandom(r, sizeof r, 0) != (ssize_t)sizeof r) {
        /* Entropy unavailable: fall back to a clock-seeded mix (ids need uniqueness, not secrecy). */
        static uint64_t ctr;
        uint64_t x = (uint64_t)time(NULL) ^ (++ctr * 0x9E3779B97F4A7C15ull) ^ (uint64_t)(uintptr_t)out;
        for (int i = 0; i < 12; i++) { x ^= x << 13; x ^= x >> 7; x ^= x << 17; r[i] = (unsigned char)x; }
    }
    static const char hex[] = "0123456789abcdef";
    memcpy(out, "call_", 5);
    for (int i = 0; i < 12; i++) {
        out[5 + 2 * i] = hex[r[i] >> 4];
        out[6 + 2 * i] = hex[r[i] & 15];
    }
    out[29] = 0;
}

/* ---- JSON output in Python json.dumps style ---------------------------------------------- */

static void dump_real(ms_sbuf *b, double d) {
    if (isnan(d)) { ms_sbuf_adds(b, "NaN"); return; }
    if (isinf(d)) { ms_sbuf_adds(b, d < 0 ? "-Infinity" : "Infinity"); return; }
    char buf[48];
    ms_fmt_roundtrip(buf, sizeof buf, d, 1, 0);
    /* buf: [-]D[.DDD]e[+-]XX -> shortest digits + decimal exponent, then Python repr layout. */
    const char *s = buf;
    int neg = 0;
    if (*s == '-') { neg = 1; s++; }
    char dig[24];
    int nd = 0;
    for (; *s && *s != 'e'; s++)
        if (isdigit((unsigned char)*s) && nd < 20) dig[nd++] = *s;
    int ex = *s == 'e' ? atoi(s + 1) : 0;
    while (nd > 1 && dig[nd - 1] == '0') nd--;
    if (neg) ms_sbuf_addc(b, '-');
    if (ex < -4 || ex >= 16) {
        ms_sbuf_addc(b, dig[0]);
        if (nd > 1) { ms_sbuf_addc(b, '.'); ms_sbuf_add(b, dig + 1, (size_t)nd - 1); }
        ms_sbuf_printf(b, "e%c%02d", ex < 0 ? '-' : '+', ex < 0 ? -ex : ex);
    } else if (ex >= 0) {
        for (int i = 0; i <= ex; i++) ms_sbuf_addc(b, i < nd ? dig[i] : '0');
        ms_sbuf_addc(b, '.');
        if (nd > ex + 1) ms_sbuf_add(b, dig + ex + 1, (size_t)(nd - ex - 1));
        else ms_sbuf_addc(b, '0');
    } else {
        ms_sbuf_adds(b, "0.");
        for (int i = 0; i < -ex - 1; i++) ms_sbuf_addc(b, '0');
        ms_sbuf_add(b, dig, (size_t)nd);
    }
}

void ms_json_dump_py(ms_sbuf *b, json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT: {
        ms_sbuf_addc(b, '{');
        const char *k;
        json_t *x;
        int first = 1;
        json_object_foreach(v, k, x) {
            if (!first) ms_sbuf_adds(b, ", ");
            first = 0;
            ms_sbuf_add_json_str(b, k, strlen(k));
            ms_sbuf_adds(b, ": ");
            ms_json_dump_py(b, x);
        }
        ms_sbuf_addc(b, '}');
        break;
    }
    case JSON_ARRAY: {
        ms_sbuf_addc(b, '[');
        for (size_t i = 0; i < json_array_size(v); i++) {
            if (i) ms_sbuf_adds(b, ", ");
            ms_json_dump_py(b, json_array_get(v, i));
        }
        ms_sbuf_addc(b, ']');
        break;
    }
    case JSON_STRING: ms_sbuf_add_json_str(b, json_string_value(v), json_string_length(v)); break;
    case JSON_INTEGER: ms_sbuf_printf(b, "%lld", (long long)json_integer_value(v)); break;
    case JSON_REAL: dump_real(b, json_real_value(v)); break;
    case JSON_TRUE: ms_sbuf_adds(b, "true"); break;
    case JSON_FALSE: ms_sbuf_adds(b, "false"); break;
    default: ms_sbuf_adds(b, "null"); break;
    }
}

/* ---- Python literal parsing (the third fallback for argument values) --------------------- */

typedef struct { const char *s, *e; int depth; } pyp;

static void py_ws(pyp *p) { while (p->s < p->e && isspace((unsigned char)*p->s)) p->s++; }

static json_t *py_value(pyp *p);

static json_t *py_string(pyp *p) {
    char q = *p->s++;
    ms_sbuf out = {0};
    while (p->s < p->e && *p->s != q) {
        char c = *p->s++;
        if (c == '\n') goto fail;
        if (c != '\\') { ms_sbuf_addc(&out, c); continue; }
        if (p->s >= p->e) goto fail;
        c = *p->s++;
        switch (c) {
        case 'n': ms_sbuf_addc(&out, '\n'); break;
        case 't': ms_sbuf_addc(&out, '\t'); break;
        case 'r': ms_sbuf_addc(&out, '\r'); break;
        case '0': ms_sbuf_addc(&out, '\0'); break;
        case '\\': case '\'': case '"': ms_sbuf_addc(&out, c); break;
        case 'x': case 'u': {
            int nh = c == 'x' ? 2 : 4;
            if (p->e - p->s < nh) goto fail;
            unsigned cp = 0;
            for (int i = 0; i < nh; i++) {
                char h = *p->s++;
                if (!isxdigit((unsigned char)h)) goto fail;
                cp = cp * 16 + (unsigned)(isdigit((unsigned char)h) ? h - '0' : (tolower(h) - 'a' + 10));
            }
            if (cp >= 0xD800 && cp < 0xE000) goto fail;
            utf8proc_uint8_t u[4];
            utf8proc_ssize_t nu = utf8proc_encode_char((utf8proc_int32_t)cp, u);
            ms_sbuf_add(&out, (const char *)u, (size_t)nu);
            break;
        }
        default: ms_sbuf_addc(&out, '\\'); ms_sbuf_addc(&out, c); break;
        }
    }
    if (p->s >= p->e) goto fail;
    p->s++;
    json_t *r = json_stringn(ms_sbuf_str(&out), out.len);
    ms_sbuf_free(&out);
    return r;
fail:
    ms_sbuf_free(&out);
    return NULL;
}

static json_t *py_seq(pyp *p, char close, int is_dict) {
    p->s++;
    json_t *r = is_dict ? json_object() : json_array();
    py_ws(p);
    if (p->s < p->e && *p->s == close) { p->s++; return r; }
    for (;;) {
        json_t *k = py_value(p);
        if (!k) goto fail;
        if (is_dict) {
            py_ws(p);
            if (p->s >= p->e || *p->s != ':' || !json_is_string(k)) { json_decref(k); goto fail; }
            p->s++;
            json_t *v = py_value(p);
            if (!v) { json_decref(k); goto fail; }
            json_object_set_new(r, json_string_value(k), v);
            json_decref(k);
        } else {
            json_array_append_new(r, k);
        }
        py_ws(p);
        if (p->s >= p->e) goto fail;
        if (*p->s == ',') {
            p->s++;
            py_ws(p);
            if (p->s < p->e && *p->s == close) { p->s++; return r; }
            continue;
        }
        if (*p->s == close) { p->s++; return r; }
        goto fail;
    }
fail:
    json_decref(r);
    return NULL;
}

static json_t *py_value(pyp *p) {
    py_ws(p);
    if (p->s >= p->e || ++p->depth > 64) return NULL;
    json_t *r = NULL;
    char c = *p->s;
    size_t left = (size_t)(p->e - p->s);
    if (c == '{') r = py_seq(p, '}', 1);
    else if (c == '[') r = py_seq(p, ']', 0);
    else if (c == '(') r = py_seq(p, ')', 0);
    else if (c == '\'' || c == '"') r = py_string(p);
    else if (left >= 4 && !memcmp(p->s, "True", 4)) { p->s += 4; r = json_true(); }
    else if (left >= 5 && !memcmp(p->s, "False", 5)) { p->s += 5; r = json_false(); }
    else if (left >= 4 && !memcmp(p->s, "None", 4)) { p->s += 4; r = json_null(); }
    else if (c == '-' || c == '+' || isdigit((unsigned char)c) || c == '.') {
        char tmp[64];
        size_t k = 0;
        while (p->s + k < p->e && k < sizeof tmp - 1 &&
               (isalnum((unsigned char)p->s[k]) || strchr("+-.", p->s[k])))
            k++;
        memcpy(tmp, p->s, k);
        tmp[k] = 0;
        char *end;
        int is_float = strpbrk(tmp, ".eE") != NULL;
        if (!is_float) {
            long long v = strtoll(tmp, &end, 10);
            if (*end == 0 && k > 0) { r = json_integer(v); p->s += k; }
        } else {
            double v = strtod(tmp, &end);
            if (*end == 0 && k > 0 && isfinite(v)) { r = json_real(v); p->s += k; }
        }
    }
    p->depth--;
    return r;
}

static json_t *parse_python_literal(const char *s, size_t n) {
    pyp p = {s, s + n, 0};
    json_t *v = py_value(&p);
    if (!v) return NULL;
    py_ws(&p);
    if (p.s != p.e) { json_decref(v); return NULL; }
    return v;
}

/* ---- argument values -------------------------------------------------------------------- */

static json_t *parse_json_any(const char *s, size_t n) {
    json_error_t e;
    return json_loadb(s, n, JSON_DECODE_ANY, &e);
}

/* "1" -> 1, "1.5" -> 1.5 (integer typed: only whole numbers); NULL when not a number. */
static json_t *string_to_number(const char *s, int integer_only) {
    char *end;
    if (!*s || isspace((unsigned char)*s)) return NULL;
    if (!integer_only && (strchr(s, '.') || strchr(s, 'e') || strchr(s, 'E'))) {
        double d = strtod(s, &end);
        return *end == 0 && isfinite(d) ? json_real(d) : NULL;
    }
    long long v = strtoll(s, &end, 10);
    return *end == 0 ? json_integer(v) : NULL;
}

/* The typed value of V (new reference, never NULL). */
static json_t *convert_value(const char *type, const char *v, size_t n) {
    if (type && !strcmp(type, "string")) {
        if (n >= 2 && (v[0] == '"' || v[0] == '\'') && v[n - 1] == v[0]) {
            json_t *j = parse_json_any(v, n);
            if (!j) {
                json_t *inner = json_stringn(v + 1, n - 2);
                return inner ? inner : json_string("");
            }
            json_decref(j);
        }
        json_t *s = json_stringn(v, n);
        return s ? s : json_string("");
    }
    json_t *j = parse_json_any(v, n);
    if (!j) {
        /* JSON-unescape, then parse: V is the inside of a JSON string. */
        ms_sbuf q = {0};
        ms_sbuf_addc(&q, '"');
        ms_sbuf_add(&q, v, n);
        ms_sbuf_addc(&q, '"');
        json_t *un = parse_json_any(q.s, q.len);
        ms_sbuf_free(&q);
        if (un && json_is_string(un)) j = parse_json_any(json_string_value(un), json_string_length(un));
        json_decref(un);
    }
    if (!j) j = parse_python_literal(v, n);
    if (!j) j = json_stringn(v, n);
    if (!j) j = json_string("");
    if (type && json_is_string(j) && (!strcmp(type, "integer") || !strcmp(type, "number"))) {
        json_t *num = string_to_number(json_string_value(j), !strcmp(type, "integer"));
        if (num) { json_decref(j); j = num; }
    }
    return j;
}

char *ms_tool_convert_value(const char *type, const char *v, size_t n) {
    json_t *j = convert_value(type, v, n);
    ms_sbuf b = {0};
    ms_json_dump_py(&b, j);
    json_decref(j);
    return ms_sbuf_take(&b);
}

/* ---- schema lookups ---------------------------------------------------------------------- */

static json_t *find_tool(json_t *tools, const char *name) {
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t) {
        json_t *f = json_object_get(t, "function");
        const char *nm = json_string_value(json_object_get(f, "name"));
        if (nm && !strcmp(nm, name)) return f;
    }
    return NULL;
}

/* 1 when a call to `name` is accepted. */
static int tool_known(json_t *tools, const char *name) {
    if (!name[0]) return 0;
    if (!tools) return 1;
    return find_tool(tools, name) != NULL;
}

/* The schema type of property key of tool name, or NULL when unknown or a union. */
static const char *prop_type(json_t *tools, const char *name, const char *key) {
    if (!tools) return NULL;
    json_t *f = find_tool(tools, name);
    json_t *props = json_object_get(json_object_get(f, "parameters"), "properties");
    json_t *t = json_object_get(json_object_get(props, key), "type");
    if (json_is_string(t)) return json_string_value(t);
    if (json_is_array(t) && json_array_size(t) == 1) return json_string_value(json_array_get(t, 0));
    return NULL;
}

/* ---- non-streaming ----------------------------------------------------------------------- */

static void add_stripped(ms_sbuf *out, const char *s, size_t n) {
    while (n && isspace((unsigned char)*s)) { s++; n--; }
    while (n && isspace((unsigned char)s[n - 1])) n--;
    ms_sbuf_add(out, s, n);
}

static char *dup_stripped(const char *s, size_t n) {
    ms_sbuf b = {0};
    add_stripped(&b, s, n);
    return ms_sbuf_take(&b);
}

/* Skips whitespace and literal "\n" pairs (the glm parsers' separator rule). */
static size_t skip_sep(const char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        if (isspace((unsigned char)s[i])) i++;
        else if (i + 1 < n && s[i] == '\\' && s[i + 1] == 'n') i += 2;
        else break;
    }
    return i;
}

/* Arguments region -> JSON object text `{"k": v, ...}`. */
static char *parse_args(json_t *tools, const char *name, const char *s, size_t n) {
    ms_sbuf b = {0};
    ms_sbuf_addc(&b, '{');
    int first = 1;
    size_t pos = 0;
    while (pos < n) {
        long ks = ms_find(s + pos, n - pos, KEY_START);
        if (ks < 0) break;
        size_t k0 = pos + (size_t)ks + TLEN(KEY_START);
        long ke = ms_find(s + k0, n - k0, KEY_END);
        if (ke < 0) break;
        size_t after_key = k0 + (size_t)ke + TLEN(KEY_END);
        size_t v0 = after_key + skip_sep(s + after_key, n - after_key);
        if (n - v0 < TLEN(VAL_START) || memcmp(s + v0, VAL_START, TLEN(VAL_START)) != 0) {
            pos = pos + (size_t)ks + 1;
            continue;
        }
        v0 += TLEN(VAL_START);
        long ve = ms_find(s + v0, n - v0, VAL_END);
        if (ve < 0) break;
        char *key = dup_stripped(s + k0, (size_t)ke);
        json_t *val = convert_value(prop_type(tools, name, key), s + v0, (size_t)ve);
        if (!first) ms_sbuf_adds(&b, ", ");
        first = 0;
        ms_sbuf_add_json_str(&b, key, strlen(key));
        ms_sbuf_adds(&b, ": ");
        ms_json_dump_py(&b, val);
        json_decref(val);
        free(key);
        pos = v0 + (size_t)ve + TLEN(VAL_END);
    }
    ms_sbuf_addc(&b, '}');
    return ms_sbuf_take(&b);
}

static void add_call(ms_tool_calls *c, char *name, char *args) {
    if (c->n == c->cap) {
        int cap = c->cap ? c->cap * 2 : 4;
        ms_tool_call *v = realloc(c->v, (size_t)cap * sizeof *v);
        MS_ASSERT(v != NULL);
        c->v = v;
        c->cap = cap;
    }
    ms_tool_call *t = &c->v[c->n++];
    ms_tool_call_id(t->id);
    t->name = name;
    t->arguments = args;
}

void ms_tool_calls_free(ms_tool_calls *c) {
    for (int i = 0; i < c->n; i++) { free(c->v[i].name); free(c->v[i].arguments); }
    free(c->v);
    memset(c, 0, sizeof *c);
}

static void parse_block(int format, json_t *tools, const char *s, size_t n, ms_tool_calls *calls) {
    size_t name_len, args_at;
    if (format == MS_TOOL_GLM45) {
        const char *nl = memchr(s, '\n', n);
        if (!nl) return;
        name_len = (size_t)(nl - s);
        args_at = name_len + 1;
    } else {
        long k = ms_find(s, n, KEY_START);
        name_len = k < 0 ? n : (size_t)k;
        args_at = name_len;
    }
    char *name = dup_stripped(s, name_len);
    if (!tool_known(tools, name)) {
        free(name);
        return;
    }
    add_call(calls, name, parse_args(tools, name, s + args_at, n - args_at));
}

void ms_tool_parse(int format, json_t *tools, const char *text, size_t n, ms_sbuf *content,
                   ms_tool_calls *calls) {
    long first = ms_find(text, n, TC_START);
    if (first < 0) {
        ms_sbuf_add(content, text, n);
        return;
    }
    ms_sbuf outside = {0};
    size_t pos = 0;
    for (;;) {
        long s = ms_find(text + pos, n - pos, TC_START);
        if (s < 0) break;
        size_t in0 = pos + (size_t)s + TLEN(TC_START);
        long e = ms_find(text + in0, n - in0, TC_END);
        if (e < 0) break;
        ms_sbuf_add(&outside, text + pos, (size_t)s);
        parse_block(format, tools, text + in0, (size_t)e, calls);
        pos = in0 + (size_t)e + TLEN(TC_END);
    }
    ms_sbuf_add(&outside, text + pos, n - pos);
    if (format == MS_TOOL_GLM45) add_stripped(content, text, (size_t)first);
    else add_stripped(content, outside.s, outside.len);
    ms_sbuf_free(&outside);
}

/* ---- streaming --------------------------------------------------------------------------- */

enum { ST_TEXT, ST_NAME, ST_BETWEEN, ST_KEY, ST_WAITVAL, ST_VALUE };

struct ms_tool_stream {
    int format;
    json_t *tools;
    int state;
    ms_sbuf buf;       /* unprocessed input */
    int any_call_tag;  /* a <tool_call> was seen */
    int emitted;       /* content bytes sent so far */
    ms_sbuf pending_ws;/* trailing whitespace of content, held back */
    int n_calls;       /* valid calls started */
    /* current call */
    int valid;
    char *name;
    int first_param;
    char *key;
    const char *vtype;
    int vmode;         /* 0 not started, 1 streaming a string, 2 holding the whole value */
    ms_sbuf value;
};

ms_tool_stream *ms_tool_stream_new(int format, json_t *tools) {
    ms_tool_stream *s = calloc(1, sizeof *s);
    MS_ASSERT(s != NULL);
    s->format = format;
    s->tools = tools;
    return s;
}

void ms_tool_stream_free(ms_tool_stream *s) {
    if (!s) return;
    ms_sbuf_free(&s->buf);
    ms_sbuf_free(&s->pending_ws);
    ms_sbuf_free(&s->value);
    free(s->name);
    free(s->key);
    free(s);
}

int ms_tool_stream_calls(const ms_tool_stream *s) { return s->n_calls; }

void ms_tool_out_reset(ms_tool_out *o) {
    ms_sbuf_clear(&o->content);
    for (int i = 0; i < o->n; i++) { free(o->d[i].name); ms_sbuf_free(&o->d[i].args); }
    o->n = 0;
}

void ms_tool_out_free(ms_tool_out *o) {
    ms_tool_out_reset(o);
    ms_sbuf_free(&o->content);
    free(o->d);
    memset(o, 0, sizeof *o);
}

static ms_tool_delta *new_delta(ms_tool_out *o, int index) {
    if (o->n == o->cap) {
        int cap = o->cap ? o->cap * 2 : 4;
        ms_tool_delta *d = realloc(o->d, (size_t)cap * sizeof *d);
        MS_ASSERT(d != NULL);
        o->d = d;
        o->cap = cap;
    }
    ms_tool_delta *d = &o->d[o->n++];
    memset(d, 0, sizeof *d);
    d->index = index;
    return d;
}

static void emit_args(ms_tool_stream *s, ms_tool_out *o, const char *p, size_t n) {
    if (!s->valid || n == 0) return;
    int idx = s->n_calls - 1;
    ms_tool_delta *d = o->n && o->d[o->n - 1].index == idx && !o->d[o->n - 1].is_start
                           ? &o->d[o->n - 1] : new_delta(o, idx);
    ms_sbuf_add(&d->args, p, n);
}

static void emit_args_escaped(ms_tool_stream *s, ms_tool_out *o, const char *p, size_t n) {
    ms_sbuf t = {0};
    ms_sbuf_add_json_escaped(&t, p, n);
    emit_args(s, o, t.s, t.len);
    ms_sbuf_free(&t);
}

/* Content text outside calls, with whitespace runs held back so that whitespace right before a
 * call (or at the end of a reply with calls) is dropped as the non-streaming strip does. */
static void emit_content(ms_tool_stream *s, ms_tool_out *o, const char *p, size_t n) {
    if (s->format == MS_TOOL_GLM45 && s->any_call_tag) return;
    int strip_lead = !s->emitted && s->any_call_tag; /* all content so far was whitespace */
    size_t end = n;
    while (end && isspace((unsigned char)p[end - 1])) end--;
    if (end == 0) {
        if (!strip_lead) ms_sbuf_add(&s->pending_ws, p, n);
        return;
    }
    size_t lead = 0;
    if (strip_lead) {
        ms_sbuf_clear(&s->pending_ws);
        while (lead < end && isspace((unsigned char)p[lead])) lead++;
    }
    ms_sbuf_add(&o->content, ms_sbuf_str(&s->pending_ws), s->pending_ws.len);
    ms_sbuf_clear(&s->pending_ws);
    ms_sbuf_add(&o->content, p + lead, end - lead);
    s->emitted = 1;
    ms_sbuf_add(&s->pending_ws, p + end, n - end);
}

static void start_call(ms_tool_stream *s, ms_tool_out *o, const char *name, size_t n) {
    free(s->name);
    s->name = dup_stripped(name, n);
    s->valid = tool_known(s->tools, s->name);
    s->first_param = 1;
    if (!s->valid) return;
    ms_tool_delta *d = new_delta(o, s->n_calls++);
    d->is_start = 1;
    ms_tool_call_id(d->id);
    d->name = strdup(s->name);
}

static void end_call(ms_tool_stream *s, ms_tool_out *o) {
    if (s->valid) emit_args(s, o, s->first_param ? "{}" : "}", s->first_param ? 2 : 1);
    s->valid = 0;
    s->state = ST_TEXT;
}

static void finish_value(ms_tool_stream *s, ms_tool_out *o, const char *tail, size_t n) {
    if (s->vmode == 1) {
        emit_args_escaped(s, o, tail, n);
        emit_args(s, o, "\"", 1);
    } else {
        ms_sbuf_add(&s->value, tail, n);
        char *js = ms_tool_convert_value(s->vtype, ms_sbuf_str(&s->value), s->value.len);
        emit_args(s, o, js, strlen(js));
        free(js);
    }
    ms_sbuf_clear(&s->value);
    s->vmode = 0;
}

/* Runs the state machine over s->buf as far as it can; returns when more input is needed. */
static void run(ms_tool_stream *s, ms_tool_out *o) {
    for (int guard = 0; guard < 1000000; guard++) {
        const char *b = ms_sbuf_str(&s->buf);
        size_t n = s->buf.len;
        if (n == 0) return;
        switch (s->state) {
        case ST_TEXT: {
            long p = ms_find(b, n, TC_START);
            if (p < 0) {
                size_t hold = ms_partial_tail(b, n, TC_START);
                emit_content(s, o, b, n - hold);
                ms_sbuf_consume(&s->buf, n - hold);
                return;
            }
            emit_content(s, o, b, (size_t)p);
            if (!s->emitted || s->format == MS_TOOL_GLM45) ms_sbuf_clear(&s->pending_ws);
            s->any_call_tag = 1;
            ms_sbuf_consume(&s->buf, (size_t)p + TLEN(TC_START));
            s->state = ST_NAME;
            break;
        }
        case ST_NAME: {
            if (s->format == MS_TOOL_GLM45) {
                const char *nl = memchr(b, '\n', n);
                long e = ms_find(b, n, TC_END);
                if (e >= 0 && (!nl || nl - b > e)) { /* no newline: not a glm45 call */
                    s->valid = 0;
                    ms_sbuf_consume(&s->buf, (size_t)e + TLEN(TC_END));
                    s->state = ST_TEXT;
                    break;
                }
                if (!nl) return;
                start_call(s, o, b, (size_t)(nl - b));
                ms_sbuf_consume(&s->buf, (size_t)(nl - b) + 1);
            } else {
                long k = ms_find(b, n, KEY_START), e = ms_find(b, n, TC_END);
                long p = k >= 0 && (e < 0 || k < e) ? k : e;
                if (p < 0) return;
                start_call(s, o, b, (size_t)p);
                ms_sbuf_consume(&s->buf, (size_t)p);
            }
            s->state = ST_BETWEEN;
            break;
        }
        case ST_BETWEEN: {
            long k = ms_find(b, n, KEY_START), e = ms_find(b, n, TC_END);
            if (e >= 0 && (k < 0 || e < k)) {
                ms_sbuf_consume(&s->buf, (size_t)e + TLEN(TC_END));
                end_call(s, o);
                break;
            }
            if (k >= 0) {
                ms_sbuf_consume(&s->buf, (size_t)k + TLEN(KEY_START));
                s->state = ST_KEY;
                break;
            }
            size_t hold = ms_partial_tail(b, n, KEY_START);
            size_t h2 = ms_partial_tail(b, n, TC_END);
            if (h2 > hold) hold = h2;
            ms_sbuf_consume(&s->buf, n - hold);
            return;
        }
        case ST_KEY: {
            long e = ms_find(b, n, KEY_END);
            if (e < 0) return;
            free(s->key);
            s->key = dup_stripped(b, (size_t)e);
            ms_sbuf_consume(&s->buf, (size_t)e + TLEN(KEY_END));
            s->state = ST_WAITVAL;
            break;
        }
        case ST_WAITVAL: {
            size_t sep = skip_sep(b, n);
            if (sep == n || (n - sep < TLEN(VAL_START) && !memcmp(b + sep, VAL_START, n - sep)) ||
                (b[n - 1] == '\\' && sep == n - 1))
                return; /* need more input */
            if (n - sep >= TLEN(VAL_START) && !memcmp(b + sep, VAL_START, TLEN(VAL_START))) {
                ms_sbuf_consume(&s->buf, sep + TLEN(VAL_START));
                s->vtype = prop_type(s->tools, s->name, s->key);
                s->vmode = 0;
                ms_sbuf_clear(&s->value);
                ms_sbuf t = {0};
                ms_sbuf_adds(&t, s->first_param ? "{" : ", ");
                ms_sbuf_add_json_str(&t, s->key, strlen(s->key));
                ms_sbuf_adds(&t, ": ");
                emit_args(s, o, t.s, t.len);
                ms_sbuf_free(&t);
                s->first_param = 0;
                s->state = ST_VALUE;
            } else {
                s->state = ST_BETWEEN; /* malformed pair: skip it, as the regex would */
            }
            break;
        }
        case ST_VALUE: {
            long e = ms_find(b, n, VAL_END);
            if (e >= 0) {
                finish_value(s, o, b, (size_t)e);
                ms_sbuf_consume(&s->buf, (size_t)e + TLEN(VAL_END));
                s->state = ST_BETWEEN;
                break;
            }
            size_t hold = ms_partial_tail(b, n, VAL_END);
            size_t take = n - hold;
            int is_string = s->vtype && !strcmp(s->vtype, "string");
            if (is_string && s->vmode == 0 && s->value.len == 0 && take > 0) {
                if (b[0] == '"' || b[0] == '\'') s->vmode = 2;
                else { s->vmode = 1; emit_args(s, o, "\"", 1); }
            }
            if (s->vmode == 1) emit_args_escaped(s, o, b, take);
            else ms_sbuf_add(&s->value, b, take);
            ms_sbuf_consume(&s->buf, take);
            return;
        }
        }
    }
}

void ms_tool_stream_push(ms_tool_stream *s, const char *text, size_t n, ms_tool_out *out) {
    ms_sbuf_add(&s->buf, text, n);
    run(s, out);
}

void ms_tool_stream_finish(ms_tool_stream *s, ms_tool_out *out) {
    if (s->state == ST_TEXT) {
        /* a held partial "<tool_c" is plain text after all */
        emit_content(s, out, ms_sbuf_str(&s->buf), s->buf.len);
    } else if (s->state == ST_NAME) {
        /* the call never got a name: like non-streaming, its raw text is content */
        ms_sbuf t = {0};
        ms_sbuf_adds(&t, TC_START);
        ms_sbuf_add(&t, ms_sbuf_str(&s->buf), s->buf.len);
        emit_content(s, out, t.s, t.len);
        ms_sbuf_free(&t);
    } else {
        if (s->state == ST_VALUE) finish_value(s, out, ms_sbuf_str(&s->buf), s->buf.len);
        end_call(s, out);
    }
    ms_sbuf_clear(&s->buf);
    if (!s->any_call_tag) ms_sbuf_add(&out->content, ms_sbuf_str(&s->pending_ws), s->pending_ws.len);
    ms_sbuf_clear(&s->pending_ws);
}
