/* routes.c - the routes that do not generate: chat page, health, metrics, models, server info.
 *
 * These are small, read-only views of the configuration and the engine counters; they are kept
 * out of server.c so the dispatch there stays a short list. */
#include "server/server_int.h"

#include "core/fileutil.h"

#include <stdlib.h>
#include <string.h>

/* ---- simple routes --------------------------------------------------------------------------- */

static enum MHD_Result route_models(ms_server *s, struct MHD_Connection *c) {
    ms_sbuf b = {0};
    ms_sbuf_adds(&b, "{\"object\":\"list\",\"data\":[");
    const char *m = s->cfg.lim.model_names[0];
    ms_sbuf_adds(&b, "{\"id\":");
    ms_sbuf_add_json_str(&b, m, strlen(m));
    ms_sbuf_printf(&b, ",\"object\":\"model\",\"created\":%ld,\"owned_by\":\"moeserve\",\"root\":", (long)s->t_start);
    const char *root = s->cfg.model_path ? s->cfg.model_path : m;
    ms_sbuf_add_json_str(&b, root, strlen(root));
    ms_sbuf_printf(&b, ",\"max_model_len\":%d}]}", s->cfg.lim.context_length);
    enum MHD_Result rc = ms_srv_send_json(s, c, 200, &b);
    ms_sbuf_free(&b);
    return rc;
}

static enum MHD_Result route_info(ms_server *s, struct MHD_Connection *c) {
    json_t *o = json_object();
    json_object_set_new(o, "model_path", json_string(s->cfg.model_path ? s->cfg.model_path : ""));
    json_object_set_new(o, "served_model_name", json_string(s->cfg.lim.model_names[0]));
    json_t *aliases = json_array();
    for (int i = 1; i < 8 && s->cfg.lim.model_names[i]; i++) json_array_append_new(aliases, json_string(s->cfg.lim.model_names[i]));
    json_object_set_new(o, "model_aliases", aliases);
    json_object_set_new(o, "context_length", json_integer(s->cfg.lim.context_length));
    json_object_set_new(o, "vocab_size", json_integer(s->cfg.lim.vocab_size));
    json_object_set_new(o, "reasoning_parser", s->cfg.reasoning_parser == MS_REASONING_GLM45 ? json_string("glm45") : json_null());
    json_object_set_new(o, "tool_call_parser", s->cfg.tool_parser == MS_TOOL_GLM47 ? json_string("glm47")
                                              : s->cfg.tool_parser == MS_TOOL_GLM45 ? json_string("glm45") : json_null());
    json_object_set_new(o, "max_request_bytes", json_integer((json_int_t)s->cfg.max_request_bytes));
    json_object_set_new(o, "api_key_required", json_boolean(s->cfg.api_key && s->cfg.api_key[0]));
    json_error_t je;
    json_t *flags = s->cfg.info_json ? json_loads(s->cfg.info_json, 0, &je) : NULL;
    json_object_set_new(o, "flags", flags ? flags : json_object());
    json_t *ver = json_object();
    json_object_set_new(ver, "moeserve", json_string(s->cfg.version ? s->cfg.version : ""));
    json_object_set_new(ver, "libmicrohttpd", json_string(MHD_get_version()));
    json_object_set_new(ver, "jansson", json_string(jansson_version_str()));
    json_object_set_new(o, "versions", ver);
    json_object_set_new(o, "uptime_s", json_real(ms_now() - s->t_start_mono));
    /* SGLang's place for it (bench_serving reads internal_states[0].avg_spec_accept_length) */
    ms_engine_stats es;
    memset(&es, 0, sizeof es);
    s->ops.stats(s->ops.ctx, &es);
    json_t *is = json_object();
    if (es.spec_verifications) {
        json_object_set_new(is, "avg_spec_accept_length",
                            json_real((double)(es.spec_accepted_tokens + es.spec_verifications) / (double)es.spec_verifications));
        json_object_set_new(is, "spec_verifications", json_integer((json_int_t)es.spec_verifications));
        json_object_set_new(is, "spec_draft_tokens", json_integer((json_int_t)es.spec_draft_tokens));
        json_object_set_new(is, "spec_accepted_tokens", json_integer((json_int_t)es.spec_accepted_tokens));
    }
    json_t *isa = json_array();
    json_array_append_new(isa, is);
    json_object_set_new(o, "internal_states", isa);
    char *txt = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    enum MHD_Result rc = ms_srv_send_buf(s, c, 200, "application/json", txt, strlen(txt), NULL);
    free(txt);
    return rc;
}

static enum MHD_Result route_metrics(ms_server *s, struct MHD_Connection *c) {
    ms_engine_stats es;
    memset(&es, 0, sizeof es);
    s->ops.stats(s->ops.ctx, &es);
    ms_sbuf b = {0};
    ms_metrics_write(&s->metrics, &es, s->cfg.lim.model_names[0], &b);
    enum MHD_Result rc = ms_srv_send_buf(s, c, 200, "text/plain; version=0.0.4; charset=utf-8", ms_sbuf_str(&b), b.len, NULL);
    ms_sbuf_free(&b);
    return rc;
}

static enum MHD_Result route_health(ms_server *s, struct MHD_Connection *c) {
    ms_engine_stats es;
    memset(&es, 0, sizeof es);
    s->ops.stats(s->ops.ctx, &es);
    if (!es.healthy)
        return ms_srv_fail(s, c, 503, "server_error", NULL, "engine_unhealthy", "The engine is unhealthy.");
    return ms_srv_send_buf(s, c, 200, "application/json", "{}", 2, NULL);
}

enum MHD_Result ms_srv_route_other(ms_server *s, struct MHD_Connection *conn, const char *u, int get) {
    if (get && (!strcmp(u, "/") || !strcmp(u, "/index.html")))
        return ms_srv_send_buf(s, conn, 200, "text/html; charset=utf-8", ms_chat_page_html, strlen(ms_chat_page_html), NULL);
    if (get && !strcmp(u, "/health")) return route_health(s, conn);
    if (get && !strcmp(u, "/metrics")) return route_metrics(s, conn);
    if (get && (!strcmp(u, "/v1/models") || !strncmp(u, "/v1/models/", 11))) {
        if (u[10] == '/') {
            int known = 0;
            for (int i = 0; i < 8 && s->cfg.lim.model_names[i]; i++) known |= !strcmp(u + 11, s->cfg.lim.model_names[i]);
            if (!known) return ms_srv_fail(s, conn, 404, "invalid_request_error", "model", "model_not_found", "No such model.");
        }
        return route_models(s, conn);
    }
    if (get && !strcmp(u, "/get_server_info")) return route_info(s, conn);
    return ms_srv_fail(s, conn, 404, "invalid_request_error", NULL, "not_found", "No such route.");
}
