/* shard.c - which part of the model one rank holds under tensor / expert parallelism, and the
 * start-up refusal of splits the model cannot take. Every rank computes the same plan from the
 * config, so nothing about the split travels between ranks. */
#include "model/arch.h"
#include "model/model.h"

int ms_shard_make(const ms_config *cfg, int tp, int ep, int rank, ms_shard *sh, ms_err *err) {
    *sh = (ms_shard){0};
    if (tp < 1) return ms_errf(err, MS_ERR_INVALID, "flag --tp: %d is not a positive number of ranks", tp);
    if (ep < 1) return ms_errf(err, MS_ERR_INVALID, "flag --ep: %d is not a positive number of expert groups", ep);
    if (tp % ep)
        return ms_errf(err, MS_ERR_INVALID, "flag --ep %d must divide --tp %d (the expert groups partition the tensor-parallel ranks)",
                       ep, tp);
    if (rank < 0 || rank >= tp) return ms_errf(err, MS_ERR_INVALID, "rank %d is outside the %d-rank world", rank, tp);
    if (tp > 1) MS_TRY(cfg->arch->check_tp(cfg, tp, err));
    if (cfg->vocab_size % tp)
        return ms_errf(err, MS_ERR_INVALID, "--tp %d does not divide vocab_size (%d) of the %s config (vocab-parallel embedding)",
                       tp, cfg->vocab_size, cfg->model_type);
    int n_dense = 0, n_moe = 0;
    for (int L = 0; L < cfg->num_layers; L++) cfg->layer_is_moe[L] ? n_moe++ : n_dense++;
    if (n_dense && cfg->intermediate_size % tp)
        return ms_errf(err, MS_ERR_INVALID, "--tp %d does not divide intermediate_size (%d) of the %s config", tp,
                       cfg->intermediate_size, cfg->model_type);
    const int moe_tp = tp / ep;
    if (n_moe) {
        if (cfg->n_shared_experts > 0 && (cfg->n_shared_experts * cfg->moe_intermediate_size) % tp)
            return ms_errf(err, MS_ERR_INVALID, "--tp %d does not divide the shared experts' width (%d x moe_intermediate_size %d)",
                           tp, cfg->n_shared_experts, cfg->moe_intermediate_size);
        if (cfg->n_routed_experts % ep)
            return ms_errf(err, MS_ERR_INVALID, "--ep %d does not divide n_routed_experts (%d) of the %s config", ep,
                           cfg->n_routed_experts, cfg->model_type);
        if (cfg->moe_intermediate_size % moe_tp)
            return ms_errf(err, MS_ERR_INVALID,
                           "--tp %d / --ep %d slices each routed expert %d ways, which does not divide moe_intermediate_size (%d)",
                           tp, ep, moe_tp, cfg->moe_intermediate_size);
    } else if (ep > 1) {
        return ms_errf(err, MS_ERR_INVALID, "flag --ep %d: the %s config has no MoE layers", ep, cfg->model_type);
    }
    sh->tp_rank = rank;
    sh->tp_size = tp;
    sh->moe_tp_size = moe_tp;
    sh->moe_tp_rank = rank % moe_tp;
    sh->ep_size = ep;
    sh->ep_rank = rank / moe_tp;
    sh->ne = cfg->n_routed_experts / ep;
    sh->e0 = sh->ep_rank * sh->ne;
    sh->nv = cfg->vocab_size / tp;
    sh->v0 = (int64_t)rank * sh->nv;
    return MS_OK;
}
