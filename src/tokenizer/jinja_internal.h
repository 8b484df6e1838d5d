/* jinja_internal.h - what the interpreter's files share and nothing else may see: the runtime value
 * model, the render state that carries limits and errors, and the few entry points by which the
 * evaluator, filters, methods and value conversions call one another. Splitting the interpreter
 * across files should not widen jinja.h, which the lexer and parser also include. */
#ifndef MS_TOKENIZER_JINJA_INTERNAL_H
#define MS_TOKENIZER_JINJA_INTERNAL_H

#include "tokenizer/jinja.h"

#include <string.h>

/* ---- values --------------------------------------------------------------------------------- */

/* V_LOOP is the `loop` variable of a for loop, kept unmaterialized (u.a = the items, n = the index)
 * so iterations allocate nothing; it turns into a V_OBJ when used as a whole value. */
enum { V_UNDEF, V_NULL, V_BOOL, V_INT, V_FLOAT, V_STR, V_ARR, V_TUPLE, V_OBJ, V_KWARGS, V_NS, V_FUNC, V_LOOP };

typedef struct jarr jarr;
typedef struct jobj jobj;
typedef struct jfn jfn;

typedef struct jv {
    int t;
    size_t n;     /* string length in bytes */
    long long iv; /* V_INT from JSON: the exact value (u.d may have rounded it past 2^53) */
    union {
        double d;
        int b;
        const char *s;
        jarr *a;
        jobj *o;
        const jfn *f;
    } u;
} jv;

struct jarr {
    size_t n;
    jv *v;
};

typedef struct jkey {
    const char *s;
    size_t n;
} jkey;

struct jobj {
    size_t n, cap;
    jkey *k;
    jv *v;
};

typedef struct jenv jenv;

enum { F_MACRO, F_CALLER, F_BUILTIN, F_METHOD };
enum { B_RAISE, B_RANGE, B_STRFTIME, B_NAMESPACE };
enum {
    M_UPPER, M_LOWER, M_STRIP, M_TITLE, M_CAPITALIZE, M_RSTRIP, M_LSTRIP, M_STARTSWITH, M_ENDSWITH,
    M_SPLIT, M_REPLACE, M_GET, M_ITEMS, M_KEYS, M_VALUES, M_DICTSORT, M_FIND, M_COUNT, M_RSPLIT, M_JOIN
};

struct jfn {
    int kind;
    int id;
    const jj_node *node; /* macro or call block */
    jenv *env;           /* call block: where it was defined */
    jv self;             /* method receiver */
};

typedef struct jvar {
    const char *k;
    size_t kn;
    jv v;
    struct jvar *next;
} jvar;

struct jenv {
    jenv *parent;
    jvar *vars;
};

/* ---- render state ---------------------------------------------------------------------------- */

enum { RC_OK = 0, RC_ERR = 1, RC_BREAK = 2, RC_CONT = 3 };

typedef struct R {
    jj_arena ar;
    const jj_limits *lim;
    long long steps;
    int depth; /* nested macro calls */
    int nest;  /* nested evaluations (expressions and blocks): bounds C stack use */
    ms_err *err;
} R;

/* json.dumps options of tojson (jv_to_json). */
typedef struct jopts {
    int indent; /* <0 none */
    int ascii;
    int sort_keys;
    const char *item_sep, *key_sep;
    size_t item_sep_n, key_sep_n;
} jopts;

/* ---- constructors and tiny helpers (inline: they sit on every evaluation path) ---------------- */

static inline jv jv_make(int t) {
    jv v;
    memset(&v, 0, sizeof v);
    v.t = t;
    return v;
}
static inline jv jv_num(int t, double d) {
    jv v = jv_make(t);
    v.u.d = d;
    return v;
}
static inline jv jv_bool(int b) {
    jv v = jv_make(V_BOOL);
    v.u.b = !!b;
    return v;
}
static inline jv jv_str(const char *s, size_t n) {
    jv v = jv_make(V_STR);
    v.u.s = s;
    v.n = n;
    return v;
}
static inline jv jv_cstr(const char *s) { return jv_str(s, strlen(s)); }

static inline void *jv_ralloc(R *r, size_t n) { return jj_alloc(&r->ar, n); }
static inline jv jv_arr(jarr *a, int t) {
    jv v = jv_make(t);
    v.u.a = a;
    return v;
}
static inline jv jv_obj(jobj *o, int t) {
    jv v = jv_make(t);
    v.u.o = o;
    return v;
}

static inline int jv_str_eq(jv a, jv b) { return a.n == b.n && (a.n == 0 || !memcmp(a.u.s, b.u.s, a.n)); }

/* ---- value model (jinja_value.c) ------------------------------------------------------------- */

/* Python-style name of value type t, for error messages. */
const char *jv_type_name(int t);
/* Sets r->err to "chat template line N: <message>" (no line when at is NULL); returns RC_ERR. */
int jv_err(R *r, const jj_node *at, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Reports the per-render memory limit as hit (MS_ERR_NOMEM); returns RC_ERR. */
int jv_oom(R *r, const jj_node *at);
/* Charges k steps to the render; RC_ERR (MS_ERR_NOMEM) once over lim->max_steps, else RC_OK. */
int jv_step(R *r, const jj_node *at, long long k);
/* Array of n zeroed slots in the render arena, or NULL when out of memory. */
jarr *jv_new_arr(R *r, size_t n);
/* Empty object with room for cap keys in the render arena, or NULL when out of memory. */
jobj *jv_new_obj(R *r, size_t cap);
/* Slot of key k in o, or NULL. */
jv *jv_obj_get(const jobj *o, const char *k, size_t kn);
/* Map.set: replaces in place or appends (insertion order kept); 0, or -1 when out of memory. */
int jv_obj_set(R *r, jobj *o, const char *k, size_t kn, jv v);
/* Function value of the given kind/id bound to self; V_UNDEF when out of memory. */
jv jv_fn(R *r, int kind, int id, jv self);
/* Python truthiness (NaN is false, empty strings and containers are false). */
int jv_truthy(jv v);
/* Copies a finished buffer into the arena as a string value and frees the buffer. */
int jv_buf_to_str(R *r, const jj_node *at, jj_buf *b, jv *out);
/* RC_ERR (MS_ERR_NOMEM) when b went over the output limit, else RC_OK. */
int jv_buf_check(R *r, const jj_node *at, jj_buf *b);
/* Empty buffer capped at the render's output limit. */
jj_buf jv_new_buf(R *r);
/* Case mapping as JavaScript's toUpperCase/toLowerCase (full mapping only for the common ß). */
int jv_map_case(R *r, const jj_node *at, jv s, int upper, jv *out);
/* Python's str.lstrip/rstrip/strip([chars]) (which: 1 start, 2 end, 3 both); a view into s. */
jv jv_py_strip(jv s, int which, jv chars);
/* value.replace(/\b\w/g, upper): ASCII word starts upper-cased, nothing else touched. */
int jv_title_case(R *r, const jj_node *at, jv s, jv *out);
/* charAt(0).toUpperCase() + slice(1) (astral first characters stay as they are). */
int jv_capitalize(R *r, const jj_node *at, jv s, jv *out);
/* Appends Python's str() of v to b (what {{ }} prints; undefined prints nothing). */
int jv_to_print(R *r, const jj_node *at, jv v, jj_buf *b);
/* Appends json.dumps(v) with options o to b; undefined and functions are errors (undef_null is
 * only passed down to nested values). */
int jv_to_json(R *r, const jj_node *at, jv v, const jopts *o, int depth, int undef_null, jj_buf *b);
/* Python's str(v) as a string value (strings are returned as they are). */
int jv_print_to_str(R *r, const jj_node *at, jv v, jv *out);
/* Converts a JSON context value into a template value in the render arena. */
int jv_from_json(R *r, json_t *j, jv *out, int depth);
/* a.value === b.value (zero: SameValueZero, NaN equals NaN). */
int jv_strict_eq(jv a, jv b, int zero);
/* Python's a == b (see jinja_value.c for the rules per type). */
int jv_py_eq(jv a, jv b, int depth);
/* Stable sort of items by keys (cs: case-sensitive, rev: descending) into a new V_ARR in *out. */
int jv_sort_values(R *r, const jj_node *at, const jv *items, const jv *keys, size_t n, int cs, int rev, jv *out);

/* ---- evaluator (jinja_eval.c) ------------------------------------------------------------------ */

/* New empty scope whose lookups fall back to parent; NULL when out of memory. */
jenv *jj_new_env(R *r, jenv *parent);
/* Binds k to v in scope e itself (replacing a binding there); 0, or -1 when out of memory. */
int jj_env_set(R *r, jenv *e, const char *k, size_t kn, jv v);
/* Evaluates expression x in scope e into *out; RC_OK or RC_ERR. */
int jj_eval(R *r, jenv *e, const jj_node *x, jv *out);
/* Runs statements list[0..n) in scope e, appending output to out; RC_OK/RC_ERR/RC_BREAK/RC_CONT. */
int jj_exec_block(R *r, jenv *e, jj_node *const *list, int n, jj_buf *out);
/* Evaluates call arguments: positional values (with *spread) then a keyword object. */
int jj_eval_args(R *r, jenv *e, jj_node *const *list, int n, jv **pos, size_t *npos, jobj **kw);
/* Keyword argument name of kw (which may be NULL), or undefined. */
jv jj_kw_get(const jobj *kw, const char *name);
/* `args.at(i) ?? kwargs.get(name) ?? def` where "absent" is a missing slot, not an undefined value. */
jv jj_arg_or(jv *args, size_t n, size_t i, const jobj *kw, const char *name, jv def);
/* `x.name` / `x[key]` for the built-in members of strings, arrays and dicts. */
int jj_builtin_member(R *r, const jj_node *at, jv obj, jv key, jv *out);

/* ---- filters and tests (jinja_filters.c) -------------------------------------------------------- */

/* Test `a is name(b)`; *res gets 0 or 1. b is NULL when the test has no argument. */
int jj_run_test(R *r, const jj_node *at, const char *name, size_t n, jv a, jv *b, int *res);
/* dict.items(): a list of [key, value] pairs of object o. */
int jj_obj_items(R *r, const jj_node *at, jv o, jv *out);
/* Python str.find / str.count / str.rsplit / str.join (extensions: the oracle has none of them). */
int jj_py_str_method(R *r, const jj_node *at, int id, jv self, jv *args, size_t n, jv *out);
/* Applies filter node f (name, arguments) to v. */
int jj_apply_filter(R *r, jenv *e, const jj_node *f, jv v, jv *out);

/* ---- methods, built-in functions, calls (jinja_call.c) ----------------------------------------- */

/* Byte offset of needle in hay at or after from, or -1 (an empty needle is found at from). */
long long jj_str_find_ll(jv hay, size_t from, jv needle);
/* Calls method id (M_*) on self with the given positional arguments. */
int jj_call_method(R *r, const jj_node *at, int id, jv self, jv *args, size_t n, jv *out);
/* Calls fn (macro, caller, built-in or method) with args; callenv is the caller's scope. */
int jj_call_fn(R *r, const jj_node *at, jv fn, jv *args, size_t nargs, jenv *callenv, jv *out);

#endif
